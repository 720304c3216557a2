"""Model Explorer overlays (`circle_jax.oracle.overlay`, `circle_jax.interop.model_explorer`)
checked against Model Explorer itself (``ai-edge-model-explorer``, a test dependency):

- graph and node ids: the id `graph_id` predicts for every subgraph and the node id of every
  operator are those of the graph Model Explorer's own TFLite adapter builds for the same
  file (five shared models, two of them Circle files through their TFL3 copy; the bundled
  example; the Keras LSTM's three subgraphs; a two-signature transformer with its subgraph
  names removed three ways);
- overlays: read back through Model Explorer's node-data classes (dacite, strict), every
  node id in the adapter's graph (the Keras CNN, MobileNet 0.25/128, the bundled example),
  every value recomputed from the oracle's own numbers (compare's per-tensor differences in
  its --report, golden's gradients.h5 and tensors);
- ``circle-jax view`` serves the page on 127.0.0.1 (HTTP 200), and the graph and overlay the
  page is pointed to, in a subprocess stopped by SIGTERM within the test (exit 0, its TFL3
  copy removed); the server's outbound requests go to a closed loopback port through the
  proxy variables;
- without the package every overlay/view command says, in one line, how to install it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.examples import branching_cnn, digits
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import pack, unpack
from circle_jax.interop.model_explorer import INSTALL, graph_id, tflite_path
from circle_jax.oracle import (
    compare_overlay,
    golden,
    golden_overlay,
    read_h5,
    read_overlay,
    write_golden,
    write_overlay,
)
from circle_jax.oracle.compare import CompareReport
from tests.paths import KERAS_DATA, REPO_ROOT, shared_model

CNN = os.path.join(KERAS_DATA, "branching_cnn.tflite")
SGD = cj.TrainConfig(loss="cce", optimizer="sgd", learning_rate=0.1)


def adapter_graphs(path: str, tmp_path) -> list[dict]:
    """The graphs Model Explorer's built-in TFLite adapter builds for ``path``."""
    from model_explorer.builtin_tflite_flatbuffer_adapter import BuiltinTfliteFlatbufferAdapter

    path = tflite_path(read_model(path), path, str(tmp_path))
    collections = BuiltinTfliteFlatbufferAdapter().convert(path, {})["graphCollections"]
    assert len(collections) == 1
    return collections[0].graphs


def assert_ids_match(path: str, tmp_path) -> int:
    """Every subgraph's predicted id and every operator's node id (label: its type) are the
    adapter's; returns the number of operators checked."""
    model = read_model(path)
    graphs = adapter_graphs(path, tmp_path)
    assert [graph_id(model, k) for k in range(len(model.subgraphs))] == [g["id"] for g in graphs]
    checked = 0
    for sg, g in zip(model.subgraphs, graphs):
        nodes = {n["id"]: n["label"] for n in g["nodes"]}
        for op in sg.operators:
            assert op.type == "CUSTOM" or nodes[str(op.index)] == op.type.lower(), (sg.name, op)
            checked += 1
    return checked


@pytest.mark.parametrize("name", [
    "mobilenet_v1_0.25_128_float.tflite", "aeq_toy_transformer_kv_cache_2sig.tflite",
    "one_vscode_while_000.circle", "onert_micro_simple_mnist_model.circle",
    "aeq_sdpa_composite.tflite"])
def test_ids_match_the_adapter_on_shared_models(name, tmp_path):
    assert assert_ids_match(shared_model(name), tmp_path) > 0


def test_ids_match_the_adapter_on_the_example_and_unnamed_subgraphs(tmp_path):
    example = tmp_path / "example.circle"
    branching_cnn().save(example)
    assert assert_ids_match(str(example), tmp_path) == 7
    assert assert_ids_match(os.path.join(KERAS_DATA, "lstm.tflite"), tmp_path) == 27
    source = read_model(shared_model("aeq_toy_transformer_kv_cache_2sig.tflite")).source
    variants = {"one_named": (b"alpha", None, True), "by_signature": (None, None, True),
                "no_names": (None, None, False)}
    for stem, (first, second, signatures) in variants.items():
        m = unpack(source)
        m.subgraphs[0].name, m.subgraphs[1].name = first, second
        if not signatures:
            m.signatureDefs = []
        path = tmp_path / f"{stem}.tflite"
        path.write_bytes(pack(m, "tflite"))
        assert assert_ids_match(str(path), tmp_path) == 194
    ids = [graph_id(read_model(tmp_path / f"{s}.tflite"), k) for s in variants for k in (0, 1)]
    assert ids == ["alpha", "signature_2", "signature_1", "signature_2", "main", "subgraph_1"]


@pytest.mark.parametrize("names", [("alpha", None), (None, None), (None, b"beta")], ids=str)
def test_an_overlay_of_another_signature_keys_that_signatures_graph(names, tmp_path):
    """golden's overlay of ``signature_2`` (the file's subgraph 1, which `load` makes the
    main graph) takes the id the adapter gives subgraph 1 (its name, else its signature's
    key), and its nodes are that graph's operators."""
    m = unpack(read_model(shared_model("aeq_toy_transformer_kv_cache_2sig.tflite")).source)
    m.subgraphs[0].name, m.subgraphs[1].name = names
    path = tmp_path / "m.tflite"
    path.write_bytes(pack(m, "tflite"))
    model = cj.load(str(path), signature="signature_2", lowering="reference")
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 50, s.shape).astype(s.dtype) if s.dtype == "int32"
          else rng.standard_normal(s.shape).astype(s.dtype) for s in model.inputs]
    write_overlay(golden_overlay(golden(model, xs), model), tmp_path / "o.json")
    want = graph_id(read_model(str(path)), 1)
    assert want == ("beta" if names[1] else "signature_2")
    found = overlay_ids(tmp_path / "o.json", tmp_path, str(path))
    sg = read_model(str(path)).subgraphs[1]
    real = {str(op.index) for op in sg.operators  # real-valued outputs get a value
            if all(sg.tensors[i].dtype.startswith("float") for i in op.outputs)}
    assert list(found) == [want] and found[want] == real and len(real) > 50


def overlay_ids(path, tmp_path, model_path: str) -> dict[str, set[str]]:
    """graph id -> node ids of the overlay at ``path``, after reading it back through
    Model Explorer's classes; checks they exist in the adapter's graph of ``model_path``."""
    data = read_overlay(path)
    graphs = {g["id"]: {n["id"] for n in g["nodes"]} for g in adapter_graphs(model_path,
                                                                              tmp_path)}
    found = {gid: set(g.results) for gid, g in data.graphsData.items()}
    for gid, ids in found.items():
        assert ids <= graphs[gid], (gid, ids - graphs[gid])
    return found


def test_compare_overlay_holds_each_operators_largest_weight_difference(tmp_path, capsys):
    """The shared conv bias trained as one (--tie_shared_weights) differs from onert's
    per-reader training: all three convolutions reading it carry its difference."""
    with np.load(os.path.join(KERAS_DATA, "data.npz")) as d:
        np.save(tmp_path / "x.npy", d["branching_cnn/x"][:32])
        np.save(tmp_path / "y.npy", d["branching_cnn/y"][:32])
    path, report = tmp_path / "compare.json", tmp_path / "r.json"
    assert main(["compare", CNN, "--load_input", str(tmp_path / "x.npy"), "--load_expected",
                 str(tmp_path / "y.npy"), "--batch_size", "16", "--learning_rate", "0.05",
                 "--loss", "2", "--optimizer", "1", "--steps", "2", "--tie_shared_weights",
                 "--report", str(report), "--overlay", str(path)]) == 1
    report = json.loads(report.read_text())
    model = cj.load(CNN, tie_shared_weights=True)
    ids = overlay_ids(path, tmp_path, CNN)
    results = read_overlay(path).graphsData["main"].results
    readers: dict[int, set[str]] = {}
    for name, (_, i) in model.param_keys.items():
        for op in model.ir.main.operators:
            if i in op.inputs:
                readers.setdefault(op.index, set()).add(name)
    assert ids == {"main": {str(op) for op in readers}}
    for op, names in readers.items():
        want = max(v for n in names for v in report["tensor_diffs"][n].values())
        assert results[str(op)].value == pytest.approx(want, rel=1e-12)
    assert report["first_divergence"]["tensor"] == "arith.constant1"
    shared = max(report["tensor_diffs"]["arith.constant1"].values())
    assert shared > 1e-3 and all(results[str(op)].value >= shared for op in (0, 1, 2))
    assert all(r.bgColor is None for r in results.values())  # Model Explorer's linear scale
    assert "over 2 steps" in read_overlay(path).graphsData["main"].name


def test_golden_overlay_gradient_norms_and_output_magnitudes(tmp_path):
    with np.load(os.path.join(KERAS_DATA, "data.npz")) as d:
        x, y = d["branching_cnn/x"][:4], d["branching_cnn/y"][:4]
    model = cj.load(CNN, lowering="reference")
    g = golden(model, [x], y, SGD)
    write_golden(g, tmp_path / "g")
    write_overlay(golden_overlay(g, model), tmp_path / "grad.json")
    entries, _ = read_h5(tmp_path / "g" / "gradients.h5")
    grads = {int(e.key): e.value for e in entries}
    results = read_overlay(tmp_path / "grad.json").graphsData["main"].results
    ops = model.ir.main.operators
    assert set(results) == {str(op.index) for op in ops}
    for op in ops:
        want = np.sqrt(sum(np.sum(grads[i].astype(np.float64) ** 2) for i in op.outputs))
        assert results[str(op.index)].value == pytest.approx(want, rel=1e-12)
    by_value = sorted(results.values(), key=lambda r: r.value)  # coloured on a log scale
    assert (by_value[0].bgColor, by_value[-1].bgColor) == ("#ffffff", "#d32f2f")
    assert len({r.bgColor for r in by_value}) > 2
    assert overlay_ids(tmp_path / "grad.json", tmp_path, CNN) == {"main": set(results)}

    forward = golden(model, [x])
    write_overlay(golden_overlay(forward, model), tmp_path / "out.json")
    results = read_overlay(tmp_path / "out.json").graphsData["main"].results
    values = {int(e.key): e.value for e in forward.tensors}
    for op in ops:
        want = max(float(np.max(np.abs(values[i]))) for i in op.outputs)
        assert results[str(op.index)].value == pytest.approx(want, rel=1e-12)


def test_cli_overlays_and_bad_overlay_files(tmp_path, capsys):
    with np.load(os.path.join(KERAS_DATA, "data.npz")) as d:
        np.save(tmp_path / "x.npy", d["branching_cnn/x"][:4])
        np.save(tmp_path / "y.npy", d["branching_cnn/y"][:4])
    out = tmp_path / "o.json"
    assert main(["golden", CNN, "--input", str(tmp_path / "x.npy"), "--expected",
                 str(tmp_path / "y.npy"), "-o", str(tmp_path / "g"), "--overlay", str(out)]) == 0
    assert "L2 norm of dLoss" in read_overlay(out).graphsData["main"].name
    capsys.readouterr()
    (tmp_path / "bad.json").write_text('{"main": {"results": {"0": {"value": "high"}}}}')
    for bad, why in [("bad.json", "is not Model Explorer node data"),
                     ("g/index.json", "is not Model Explorer node data")]:
        assert main(["view", CNN, "--overlay", str(tmp_path / bad), "--no_browser"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("E: overlay") and why in err and err.count("\n") == 1
    other = tmp_path / "other.json"
    other.write_text(out.read_text().replace('"main"', '"decode"'))
    assert main(["view", CNN, "--overlay", str(other), "--no_browser"]) == 1
    assert "is for graph(s) 'decode'" in capsys.readouterr().err
    foreign = json.loads(out.read_text())  # as made for a bigger model with the same graph id
    foreign["main"]["results"]["999"] = {"value": 1.0}
    other.write_text(json.dumps(foreign))
    assert main(["view", CNN, "--overlay", str(other), "--no_browser"]) == 1
    err = capsys.readouterr().err
    assert "names node(s) '999' that graph 'main'" in err and err.count("E:") == 1
    assert main(["golden", CNN, "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "h"),
                 "--overlay", str(tmp_path / "no" / "o.json")]) == 1
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "h").exists()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", CNN, "--port", str(port), "--no_browser"]) == 1
        assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err
    assert main(["view", CNN, "--port", "0", "--no_browser"]) == 1
    assert "--port must be in 1..65535, got 0" in capsys.readouterr().err


def test_without_model_explorer_each_command_says_how_to_install_it(tmp_path, monkeypatch,
                                                                     capsys):
    for name in [m for m in sys.modules if m.split(".")[0] == "model_explorer"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "model_explorer", None)
    np.save(tmp_path / "x.npy", digits()[0][:4])
    example = tmp_path / "m.circle"
    branching_cnn().save(example)
    runs = {"golden": (["golden", str(example), "--input", str(tmp_path / "x.npy"), "-o",
                        str(tmp_path / "g"), "--overlay", str(tmp_path / "o.json")], 1),
            "compare": (["compare", "--example", "--steps", "1", "--overlay",
                         str(tmp_path / "o.json")], 3),
            "view": (["view", str(example), "--no_browser"], 1)}
    for argv, code in runs.values():
        assert main(argv) == code
        err = capsys.readouterr().err
        assert err.startswith("E: Model Explorer is not installed") and err.count("\n") == 1
        assert err.rstrip().endswith(INSTALL)
    assert not (tmp_path / "g").exists() and not (tmp_path / "o.json").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def test_view_serves_the_page_and_the_overlay_on_loopback(tmp_path):
    model = tmp_path / "example.circle"
    branching_cnn().save(model)
    m = cj.load(str(model), lowering="reference")
    overlay = tmp_path / "o.json"
    write_overlay(golden_overlay(golden(m, [digits()[0][:2]]), m), overlay)
    port = _free_port()
    closed = f"http://127.0.0.1:{_free_port()}"  # nothing listens: outbound calls fail fast
    env = {**os.environ, "HTTP_PROXY": closed, "HTTPS_PROXY": closed,
           "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "circle_jax.cli", "view", str(model), "--overlay", str(overlay),
         "--port", str(port), "--no_browser"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO_ROOT)
    try:
        url, lines = None, []
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            lines.append(line)
            url = re.match(rf"(http://127\.0\.0\.1:{port}/\S*)", line.strip())
        assert url is not None, "".join(lines)
        status, page = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and b"<html" in page.lower()
        data = json.loads(urllib.parse.unquote(url.group(1).split("data=", 1)[1]))
        source = data["models"][0]
        assert source["adapterId"] == "builtin_tflite_flatbuffer"
        assert source["url"].endswith("example.tflite") and data["nodeData"] == [str(overlay)]
        cmd = json.dumps({"extensionId": source["adapterId"], "cmdId": "convert",
                          "modelPath": source["url"], "settings": {},
                          "deleteAfterConversion": False})
        status, body = _get(f"http://127.0.0.1:{port}/api/v1/send_command?"
                            + urllib.parse.urlencode({"json": cmd}))
        graph = json.loads(body)["graphCollections"][0]["graphs"][0]
        status, body = _get(f"http://127.0.0.1:{port}/api/v1/read_text_file?"
                            + urllib.parse.urlencode({"path": str(overlay)}))
        served = json.loads(json.loads(body)["content"])
        nodes = {n["id"] for n in graph["nodes"]}
        assert graph["id"] == "main" and set(served["main"]["results"]) == {
            str(i) for i in range(7)} and set(served["main"]["results"]) <= nodes
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=30)
        proc.stdout.close()
    assert code == 0 and not os.path.exists(os.path.dirname(source["url"]))


@pytest.mark.parametrize("path", [
    os.path.join(REPO_ROOT, "tests", "data", "quantized", "float16.tflite"),
    shared_model("mediapipe_face_detection_short_range_fp16w.tflite")])
def test_overlays_key_the_files_operators_after_the_dequantize_pass(path, tmp_path):
    """A float16-weight file loses its weights' DEQUANTIZE operators to the dequantize pass:
    golden's and compare's values still go to the file's operator (the adapter's node of the
    same type, and that operator's own outputs), and the removed DEQUANTIZEs get none."""
    model = cj.load(path, lowering="reference")
    gid, file_ops = graph_id(read_model(path)), read_model(path).main.operators
    x = np.random.default_rng(0).uniform(0, 1, model.inputs[0].shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.json"
    assert main(["golden", path, "--input", str(tmp_path / "x.npy"), "-o",
                 str(tmp_path / "g"), "--overlay", str(out)]) == 0
    results = read_overlay(out).graphsData[gid].results
    tensors = {int(e.key): e.value for e in read_h5(tmp_path / "g" / "tensors.h5")[0]}
    kept = {op.origin for op in model.ir.main.operators}
    assert set(results) == {str(j) for j in kept} and len(kept) < len(file_ops)
    assert all(file_ops[j].type == "DEQUANTIZE" for j in set(range(len(file_ops))) - kept)
    for j in kept:
        want = max(float(np.max(np.abs(tensors[i]))) for i in file_ops[j].outputs)
        assert results[str(j)].value == pytest.approx(want, rel=1e-12)
    nodes = {n["id"]: n["label"] for n in adapter_graphs(path, tmp_path)[0]["nodes"]}
    assert all(nodes[str(op.origin)] == op.type.lower() for op in model.ir.main.operators)

    names = [n for n, (k, _) in model.param_keys.items() if k == 0]
    report = CompareReport(True, None, [], {}, {"steps": 1},
                           {n: {"1": float(k + 1)} for k, n in enumerate(names)})
    write_overlay(compare_overlay(report, model), tmp_path / "c.json")
    compared = read_overlay(tmp_path / "c.json").graphsData[gid].results
    index = {i: k + 1.0 for k, n in enumerate(names) for i in [model.param_keys[n][1]]}
    for op in model.ir.main.operators:
        reads = [index[i] for i in op.inputs if i in index]
        assert compared.get(str(op.origin)) is None if not reads else \
            compared[str(op.origin)].value == max(reads)
    assert set(compared) <= {str(j) for j in kept}


@pytest.mark.parametrize("name", ["full_int8", "full_int8_float_io"])
@pytest.mark.slow
def test_forward_golden_overlay_of_an_integer_model_values_every_operator(name, tmp_path):
    """Integer tensors are dequantized with their h5 scale and zero point: every operator
    gets the largest |real value| of its outputs."""
    path = os.path.join(REPO_ROOT, "tests", "data", "quantized", f"{name}.tflite")
    model = cj.load(path)
    x = np.arange(64).reshape(model.inputs[0].shape).astype(model.inputs[0].dtype)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.json"
    assert main(["golden", path, "--input", str(tmp_path / "x.npy"), "-o",
                 str(tmp_path / "g"), "--overlay", str(out)]) == 0
    results = read_overlay(out).graphsData["main"].results
    ops = model.ir.main.operators
    assert set(results) == {str(op.index) for op in ops}
    env = model.tensors(model.params, x)[1]
    for op in ops:
        t = model.ir.main.tensors[op.outputs[0]]
        v = np.asarray(env[t.index], np.float64)
        real = v if t.quantization is None or t.is_float else \
            (v - t.quantization.zero_point[0]) * t.quantization.scale[0]
        assert results[str(op.index)].value == pytest.approx(np.max(np.abs(real)), rel=1e-6)
