"""The reference oracle (`circle_jax.oracle`): golden files checked key by key against ONE's
h5 layout, forward values against LiteRT's preserve-all-tensors mode, gradients against
float64 finite differences; ``compare`` against the onert wheel on agreeing and disagreeing
configurations and on a model onert refuses.

Models: Keras-converted files from ``tests/data/keras`` (real converter output: the
branching CNN's three convolutions share one deduplicated bias tensor).
"""

from __future__ import annotations

import collections
import json
import os

import h5py
import jax
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.oracle import golden, read_h5, write_golden
from circle_jax.oracle.compare import PeerRefused, compare_with_onert
from tests.paths import KERAS_DATA

KERAS = KERAS_DATA
CNN = os.path.join(KERAS, "branching_cnn.tflite")
SGD = cj.TrainConfig(loss="cce", optimizer="sgd", learning_rate=0.1)


@pytest.fixture(scope="module")
def data(keras_data) -> dict[str, np.ndarray]:
    with np.load(keras_data / "data.npz") as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def cnn_golden(data, tmp_path_factory):
    model = cj.load(CNN, lowering="reference")
    g = golden(model, [data["branching_cnn/x"][:4]], data["branching_cnn/y"][:4], SGD)
    out = tmp_path_factory.mktemp("golden")
    files = write_golden(g, out, luci_name="m.circle")
    return model, g, out, files


def test_h5_layout_key_by_key(cnn_golden, data):
    model, g, out, _ = cnn_golden
    sg = model.ir.main
    with h5py.File(out / "input.h5") as f:
        assert sorted(f.keys()) == ["name", "value"]
        assert list(f["value"].keys()) == ["0"]
        assert f["name"].attrs["0"] == sg.tensors[sg.inputs[0]].name
        np.testing.assert_array_equal(f["value"]["0"][()], data["branching_cnn/x"][:4])
    with h5py.File(out / "expected.h5") as f:
        assert list(f["value"].keys()) == [str(k) for k in range(len(sg.outputs))]
        assert f["name"].attrs["0"] == sg.tensors[sg.outputs[0]].name
        np.testing.assert_allclose(f["value"]["0"][()],
                                   np.asarray(model(data["branching_cnn/x"][:4])[0]),
                                   rtol=1e-6, atol=1e-7)
    with h5py.File(out / "tensors.h5") as f:
        keys = set(f["value"].keys())
        assert keys == {str(t.index) for t in sg.tensors}  # every tensor, constants included
        for t in sg.tensors:
            assert f["name"].attrs[str(t.index)] == t.name
            assert f["value"][str(t.index)].shape == tuple(np.shape(
                t.data if t.data is not None else f["value"][str(t.index)]))
    with h5py.File(out / "gradients.h5") as f:
        assert f.attrs["loss"] == pytest.approx(g.loss)
        assert str(sg.inputs[0]) in f["value"] and str(sg.outputs[0]) in f["value"]
    index = json.loads((out / "index.json").read_text())
    for name in ("input.h5", "expected.h5", "tensors.h5", "targets.h5", "gradients.h5",
                 "updated.h5"):
        entries, _ = read_h5(out / name)
        assert [(e["key"], e["dtype"], e["shape"]) for e in index["files"][name]] == \
            [(e.key, str(e.value.dtype), list(e.value.shape)) for e in entries]
    assert index["settings"]["loss"] == "categorical_crossentropy"
    assert index["settings"]["untied_copies"] == dict(model.rewrites.untied)


def test_luci_layout(cnn_golden):
    _, g, out, _ = cnn_golden
    raw = (out / "m.circle.input0").read_bytes()
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), g.inputs[0].value.ravel())
    shape = (out / "m.circle.output0.shape").read_text()
    assert shape == ",".join(map(str, g.outputs[0].value.shape))
    assert (out / "m.circle.output0.dtype").read_text() == "float32"
    np.testing.assert_array_equal(np.frombuffer((out / "m.circle.output0").read_bytes(), "<f4"),
                                  g.outputs[0].value.ravel())


@pytest.mark.parametrize("name", ["branching_cnn", "conv1d_stack", "three_consumers"])
def test_every_tensor_matches_litert(name, data):
    """Every float tensor LiteRT keeps (preserve-all-tensors) equals golden's, same index.

    Tolerance 1e-5 relative and absolute: both accumulate in float32, in different orders
    (tests/conformance.py states the same bound for single operators)."""
    path = os.path.join(KERAS, f"{name}.tflite")
    model = cj.load(path, lowering="reference", tie_shared_weights=True)
    x = data[f"{name}/x"][:1]
    g = golden(model, [x])
    interp = Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    ours = {int(e.key): e.value for e in g.tensors}
    checked = 0
    for d in interp.get_tensor_details():
        i = d["index"]
        if d["dtype"] != np.float32 or i not in ours:
            continue
        theirs = interp.get_tensor(i)
        np.testing.assert_allclose(ours[i].reshape(theirs.shape), theirs, rtol=1e-5, atol=1e-5,
                                   err_msg=f"tensor {i} {d['name']}")
        checked += 1
    assert checked >= len(model.operators)


def test_gradients_match_float64_finite_differences(data):
    """dLoss/dW and dLoss/dActivation from golden (float64) against central differences of
    the float64 forward (step 1e-6: truncation ~1e-12, rounding ~1e-10; asserted 1e-6)."""
    model = cj.load(CNN, lowering="reference")
    x, y = data["branching_cnn/x"][:3], data["branching_cnn/y"][:3]
    cfg = cj.TrainConfig(loss="mse", optimizer="sgd", learning_rate=0.1)
    g = golden(model, [x], y, cfg, dtype="float64")
    grads = {int(e.key): e.value for e in g.gradients}
    index_of = {n: i for n, (k, i) in model.param_keys.items()}
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        params = {k: np.asarray(v, np.float64) for k, v in model.params.items()}
        x64 = x.astype(np.float64)

        forward = jax.jit(lambda p, taps: model.tensors(p, x64, taps=taps)[0][0])

        def loss(p, taps=None):
            return float(np.mean((np.asarray(forward(p, taps)) - y) ** 2))

        assert loss(params) == pytest.approx(g.loss, rel=1e-12)
        h = 1e-6
        for name in ("functional_1_1/conv2d_1/convolution", "arith.constant1/op1"):
            flat = params[name].ravel()
            for j in rng.choice(flat.size, 4, replace=False):
                up, down = flat.copy(), flat.copy()
                up[j] += h
                down[j] -= h
                fd = (loss({**params, name: up.reshape(params[name].shape)})
                      - loss({**params, name: down.reshape(params[name].shape)})) / (2 * h)
                assert grads[index_of[name]].ravel()[j] == pytest.approx(fd, abs=1e-6)
        relu = model.ir.main.operators[1].outputs[0]  # an activation inside the graph
        act = grads[relu]
        for j in rng.choice(act.size, 4, replace=False):
            e = np.zeros(act.size)
            e[j] = h
            e = e.reshape(act.shape)
            fd = (loss(params, {relu: e}) - loss(params, {relu: -e})) / (2 * h)
            assert act.ravel()[j] == pytest.approx(fd, abs=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_golden_is_a_few_compiled_programs(data, dtype):
    """The forward, the gradients and the step each run as one compiled program, as training
    does, not one compile per operator (measured on this 8-operator CNN with Adam: 158
    compiles op by op, 12 and 18 compiled; counted with JAX's monitoring events)."""
    model = cj.load(CNN)
    seen = collections.Counter()

    def count(event: str, seconds: float, **kwargs) -> None:
        seen[event] += 1

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        golden(model, [data["branching_cnn/x"][:4]], data["branching_cnn/y"][:4],
               cj.TrainConfig(loss="cce", optimizer="adam"), dtype=dtype)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert 3 <= seen["/jax/core/compile/jaxpr_trace_duration"] <= 24, seen


def test_updated_is_one_sgd_step_and_float32_near_float64(cnn_golden, data):
    model, g, _, _ = cnn_golden
    grads = {e.key: e.value for e in g.gradients}
    before = {e.key: e.value for e in g.tensors}
    for e in g.updated:
        if int(e.key) in g.trainable:
            np.testing.assert_allclose(e.value, before[e.key] - 0.1 * grads[e.key],
                                       rtol=1e-6, atol=1e-7)
    g64 = golden(model, [data["branching_cnn/x"][:4]], data["branching_cnn/y"][:4], SGD,
                 dtype="float64")
    assert g64.loss == pytest.approx(g.loss, rel=1e-6)
    for a, b in zip(g.gradients, g64.gradients):
        assert a.key == b.key and b.value.dtype == np.float64
        np.testing.assert_allclose(a.value, b.value, rtol=1e-4, atol=1e-6)


def _cnn_arrays(data, tmp_path):
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, data["branching_cnn/x"][:48])
    np.save(y, data["branching_cnn/y"][:48])
    return str(x), str(y)


def test_compare_agrees_untied_and_names_the_tied_bias(data, tmp_path, capsys):
    """The issue's example: Conv2Ds sharing one bias. Untied (the onert profile's default)
    the runtimes agree (exit 0); --tie_shared_weights names that tensor at step 1 (exit 1)."""
    x, y = _cnn_arrays(data, tmp_path)
    flags = [CNN, "--load_input", x, "--load_expected", y, "--batch_size", "16",
             "--learning_rate", "0.05", "--loss", "2", "--optimizer", "1", "--steps", "3"]
    report = tmp_path / "r.json"
    assert main(["compare", *flags, "--report", str(report)]) == 0
    r = json.loads(report.read_text())
    assert r["agree"] is True and r["first_divergence"] is None
    assert [s["step"] for s in r["steps"]] == [1, 2, 3]  # 32 samples: step 3 wraps around
    assert all(s["max_weight_diff"] < 1e-6 for s in r["steps"])
    assert r["export"]["agree"] is False  # onert exports one of the three trained biases
    assert main(["compare", *flags, "--tie_shared_weights", "--report", str(report),
                 "--arbiter", "float64"]) == 1
    r = json.loads(report.read_text())
    d = r["first_divergence"]
    assert (d["step"], d["tensor"], d["readers"]) == (1, "arith.constant1", [0, 1, 2])
    assert d["operator"] == 2 and d["max_abs_diff"] > 1e-3
    assert r["steps"][-1]["arbiter"]["nearer"] == "circle-jax"
    assert "DISAGREE at step 1: tensor 'arith.constant1'" in capsys.readouterr().out


def test_compare_runs_the_epochs_asked_for(data, tmp_path):
    """Without --steps, --epoch N compares N epochs (before: one, --epoch ignored)."""
    x, y = _cnn_arrays(data, tmp_path)  # 32 samples: 2 steps of 16 an epoch
    report = tmp_path / "r.json"
    assert main(["compare", CNN, "--load_input", x, "--load_expected", y, "--batch_size", "16",
                 "--learning_rate", "0.05", "--loss", "2", "--epoch", "2",
                 "--report", str(report)]) == 0
    assert [s["step"] for s in json.loads(report.read_text())["steps"]] == [1, 2, 3, 4]


def test_compare_peer_refusals(data, capsys):
    lx, ly = data["layernorm/x"][:8], data["layernorm/y"][:8]
    with pytest.raises(PeerRefused, match="Error"):
        compare_with_onert(os.path.join(KERAS, "layernorm.tflite"), [lx], ly,
                           cj.TrainConfig(batch_size=4, loss="mse"), steps=1)
    with pytest.raises(PeerRefused, match="shuffle"):
        compare_with_onert(CNN, [data["branching_cnn/x"][:8]], data["branching_cnn/y"][:8],
                           cj.TrainConfig(batch_size=4, shuffle=True), steps=1)


def test_compare_cli_exit_codes_for_refusals(data, tmp_path, capsys):
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, data["layernorm/x"][:8])
    np.save(y, data["layernorm/y"][:8])
    code = main(["compare", os.path.join(KERAS, "layernorm.tflite"), "--load_input", str(x),
                 "--load_expected", str(y), "--batch_size", "4", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("onert cannot run this case: Error")
    assert main(["compare", CNN, "--batch_size", "4"]) == 3
    assert capsys.readouterr().err.startswith("E: data missing")


def test_golden_cli(data, tmp_path, capsys):
    x, y = _cnn_arrays(data, tmp_path)
    out = tmp_path / "g"
    assert main(["golden", CNN, "--input", x, "--expected", y, "-o", str(out), "--loss", "mse",
                 "--dtype", "float64", "--format", "luci"]) == 0
    assert "wrote 11 files" in capsys.readouterr().out
    entries, attrs = read_h5(out / "gradients.h5")
    assert attrs["loss"] > 0 and all(e.value.dtype == np.float64 for e in entries)
    n = len(np.load(x))
    assert (out / "branching_cnn.tflite.output0.shape").read_text() == f"{n},3"
    assert main(["golden", CNN, "--input", x, "--expected", str(out / "index.json"),
                 "-o", str(tmp_path / "bad")]) == 1
    assert capsys.readouterr().err.startswith("E: ")
    assert not (tmp_path / "bad" / "gradients.h5").exists()
