"""Graph passes: each pass alone, the pipeline `load` runs, one parse per load, and every
pass's output written as .tflite and .circle computing in LiteRT (and onert, where onert
runs the source) what circle-jax computes on the pass's IR.

Tolerances: rtol 1e-5 with an atol of 1e-5 times the output's scale (max |LiteRT output|,
at least 1): float32 kernels of XLA and LiteRT sum in different orders; a wrong weight, bias
or operator moves outputs by far more.
"""

from __future__ import annotations

import os
from collections import Counter
from functools import partial
from typing import Any

import flatbuffers
import jax
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from circle_schema.v0_10 import circle as schema

import circle_jax as cj
from circle_jax import passes
from circle_jax.formats.reader import read_model, unpack
from circle_jax.formats.writer import write_model
from circle_jax.graph import ir
from circle_jax.model import Model
from tests.conformance import run_litert
from tests.formats.test_writer import differences
from tests.paths import KERAS_DATA, shared_model

TRANSFORMER = "aeq_toy_transformer_kv_cache_2sig.tflite"
MNIST_CIRCLE = "onert_micro_simple_mnist_model.circle"  # two FULLY_CONNECTED without bias
MELSPEC = "oww_melspectrogram.tflite"  # one convolution weight read by two operators
BRANCHING = os.path.join(KERAS_DATA, "branching_cnn.tflite")  # a bias read by three convs


def _feeds(model: Model) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for spec in model.inputs:
        shape = spec.shape
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            out.append(rng.integers(0, 8, shape).astype(spec.dtype))
        else:
            out.append(rng.uniform(-1, 1, shape).astype(spec.dtype))
    return out


def _assert_same(got: Any, want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w))), 1.0)
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5 * scale)


def _count_parses_and_writes(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count object-API parses, raw root reads and FlatBuffer ``Finish`` calls."""
    counts: Counter = Counter()

    def counted(owner: Any, name: str, key: str, cls_method: bool) -> None:
        original = getattr(owner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(*args[1:], **kwargs) if cls_method else original(*args, **kwargs)

        monkeypatch.setattr(owner, name, classmethod(call) if cls_method else call)

    counted(schema.Model.ModelT, "InitFromBuf", "parse", True)
    counted(schema.Model.Model, "GetRootAs", "parse", True)
    counted(flatbuffers.Builder, "Finish", "serialize", False)
    return counts


@pytest.mark.parametrize("name, options, changed", [
    (TRANSFORMER, {"signature": "signature_2"}, {"select_signature", "untie_shared_constants"}),
    (MNIST_CIRCLE, {"numerics": "keras"}, {"add_missing_biases"}),
    (MELSPEC, {}, {"untie_shared_constants"}),
])
def test_load_parses_once_and_serializes_nothing(name: str, options: dict, changed: set,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _count_parses_and_writes(monkeypatch)
    model = cj.load(shared_model(name), **options)
    assert dict(counts) == {"parse": 1}
    assert {r.name for r in model.passes if r.changes} == changed
    write_model(model.ir)  # the counters see a write
    assert counts["serialize"] == 1 and counts["parse"] == 2


def test_the_counters_count() -> None:
    with pytest.MonkeyPatch.context() as mp:
        counts = _count_parses_and_writes(mp)
        data = write_model(read_model(shared_model(MNIST_CIRCLE)))
        unpack(data)
        assert counts == {"parse": 3, "serialize": 1}  # read, the writer's source, unpack


def test_passes_are_pure_and_record_what_they_changed() -> None:
    before = read_model(shared_model(MNIST_CIRCLE))
    after = passes.add_missing_biases(before)
    assert before.passes == () and len(before.main.tensors) + 2 == len(after.main.tensors)
    (rec,) = after.passes
    assert rec.name == "add_missing_biases"
    assert rec.changes == {"arith.constant1/bias": "zero bias of FULLY_CONNECTED #3",
                           "arith.constant/bias": "zero bias of FULLY_CONNECTED #4"}
    for op in (after.main.operators[3], after.main.operators[4]):
        bias = after.main.tensors[op.inputs[2]]
        assert bias.origin is None and bias.buffer == ir.NEW_BUFFER
        assert not np.any(bias.data) and bias.shape == (after.main.tensors[op.outputs[0]]
                                                         .shape[-1],)
    again = passes.untie_shared_constants(read_model(shared_model(MELSPEC)))
    assert again.passes[0].changes == {"convolution/op9": "convolution"}
    assert again.passes[0].describe() == [
        "pass untie_shared_constants (copy: shared tensor): 1 change(s)",
        "  convolution/op9: convolution"]
    none = passes.untie_shared_constants(before)
    assert none.passes[0].describe() == ["pass untie_shared_constants: no change"]


def test_select_signature_swaps_subgraphs_and_renumbers_references() -> None:
    m = read_model(shared_model(TRANSFORMER))
    k = next(s.subgraph_index for s in m.signature_defs if s.key == "signature_2")
    out = passes.select_signature(m, "signature_2")
    assert k != 0 and out.main.origin == k and out.subgraphs[k].origin == 0
    assert [sg.index for sg in out.subgraphs] == list(range(len(m.subgraphs)))
    assert {s.key: s.subgraph_index for s in out.signature_defs} == {
        "signature_2": 0, "signature_1": k}
    with pytest.raises(cj.CircleFormatError, match="no signature 'x'"):
        passes.select_signature(m, "x")


def test_pipeline_follows_the_load_options() -> None:
    names = [p.func.__name__ if isinstance(p, partial) else p.__name__
             for p in passes.pipeline(signature="s", untie=True, add_bias=True)]
    assert names == ["select_signature", "untie_shared_constants", "add_missing_biases"]
    assert passes.pipeline() == []


def _trained_apart(model: Model) -> dict[str, Any]:
    """The model's params with every untied copy and added bias moved off its initial value."""
    rng = np.random.default_rng(1)
    params = dict(model.params)
    for name in [*model.rewrites.untied, *model.rewrites.added_bias]:
        p = np.asarray(params[name])
        params[name] = p + rng.uniform(0.05, 0.1, p.shape).astype(p.dtype)
    return params


@pytest.mark.parametrize("path, options", [
    (shared_model(TRANSFORMER), {"signature": "signature_2"}),
    (shared_model(MNIST_CIRCLE), {"numerics": "keras"}),
    (BRANCHING, {}),
], ids=["select_signature", "add_missing_biases", "untie_shared_constants"])
def test_every_pass_output_runs_in_litert_as_in_circle_jax(path: str, options: dict) -> None:
    model = cj.load(path, **options)
    assert any(r.changes for r in model.passes)
    params = _trained_apart(model)
    feeds = _feeds(model)
    ours = jax.jit(model.apply)(params, *feeds)
    tflite = model.export(params, file_format="tflite")
    _assert_same(ours, run_litert(tflite, feeds))
    circle = model.export(params, file_format="circle")
    assert circle[4:8] == b"CIR0"
    a, b = unpack(tflite), unpack(circle)
    a.version = b.version
    assert differences(a, b) == []  # the .circle holds the same model as the .tflite
    again = cj.load(circle, tie_shared_weights=True)  # the copies are tensors of the file
    assert len(again.params) == len(model.params)
    _assert_same(jax.jit(again.apply)(again.params, *feeds), [np.asarray(o) for o in ours])


@pytest.mark.parametrize("path, options", [
    (shared_model(MNIST_CIRCLE), {"numerics": "keras"}),
    (BRANCHING, {}),
], ids=["add_missing_biases", "untie_shared_constants"])
def test_the_circle_output_runs_in_onert(path: str, options: dict, tmp_path: Any) -> None:
    from onert.infer import session

    model = cj.load(path, **options)
    assert model.rewrites
    params = _trained_apart(model)
    path = tmp_path / "m.circle"
    path.write_bytes(model.export(params, file_format="circle"))
    feeds = _feeds(model)
    got = session(str(path)).infer(feeds)
    _assert_same(got, [np.asarray(o) for o in model.apply(params, *feeds)])


def scale_outputs(model: ir.Model, factor: float) -> ir.Model:
    """A test pass: every main output multiplied by ``factor`` through a new MUL operator
    (new constant, tensors, operator and, when the file has no MUL, operator code)."""
    model, c = passes.add_constant(model, 0, "scale", np.float32(factor))
    outputs = []
    changes = {}
    for i in model.main.outputs:
        t = model.main.tensors[i]
        model, y = passes.add_tensor(model, 0, f"{t.name}/scaled", t.shape, t.dtype)
        model = passes.add_operator(model, 0, "MUL", (i, c), (y,),
                                    {"fused_activation_function": ir.ACT_NONE})
        outputs.append(y)
        changes[f"{t.name}/scaled"] = f"{t.name} x {factor}"
    model = passes.set_outputs(model, 0, outputs)
    return passes.record(model, "scale_outputs", changes)


def test_a_pass_that_adds_an_operator_exports_and_runs_in_litert() -> None:
    source = read_model(shared_model("aeq_conv_fc_mnist.tflite"))
    assert "MUL" not in {op.type for op in source.main.operators}
    out = scale_outputs(source, 3.0)
    model = Model(out)
    feeds = _feeds(model)
    data = write_model(out, "tflite")
    written = read_model(data)
    assert written.main.operators[-1].type == "MUL" and written.main.operators[-1].origin == 6
    assert len(unpack(data).operatorCodes) == len(unpack(source.source).operatorCodes) + 1
    want = run_litert(source.source, feeds)
    got = run_litert(data, feeds)
    _assert_same(got, [3.0 * w for w in want])
    (sig,) = written.signature_defs  # the signature's output follows the new output
    assert tuple(sig.outputs.values()) == written.main.outputs != source.main.outputs
    runner = Interpreter(model_content=data).get_signature_runner(sig.key)
    by_name = runner(**{n: feeds[list(written.main.inputs).index(i)]
                        for n, i in sig.inputs.items()})
    _assert_same([by_name[n] for n in sig.outputs], got)
    _assert_same(model(*feeds), got)
    _assert_same(cj.load(data)(*feeds), got)


def test_a_model_built_from_nothing_is_written_and_runs_in_litert() -> None:
    """The writer's other path: no source bytes, every element built from the IR alone."""
    empty = ir.Subgraph(0, "main", (), (), (), ())
    m = ir.Model((empty,), "TFL3", 3, "built by passes.edit", {"note": b"kept"})
    m, x = passes.add_tensor(m, 0, "x", (2, 3))
    m, w = passes.add_constant(m, 0, "w", np.arange(12, dtype=np.float32).reshape(4, 3))
    m, y = passes.add_tensor(m, 0, "y", (2, 4))
    m = passes.add_operator(m, 0, "FULLY_CONNECTED", (x, w, -1), (y,),
                            {"fused_activation_function": ir.ACT_RELU})
    m = passes.set_outputs(passes.set_inputs(m, 0, (x,)), 0, (y,))
    data = write_model(m)
    back = read_model(data)
    assert back.metadata == {"note": b"kept"} and back.description == "built by passes.edit"
    feed = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    want = np.maximum(feed @ np.arange(12, dtype=np.float32).reshape(4, 3).T, 0)
    _assert_same(run_litert(data, [feed]), [want])
    _assert_same(Model(m)(feed), [want])


def test_a_copied_tensor_keeps_every_field_of_its_source_but_name_and_buffer() -> None:
    """An untied copy starts from its source tensor's object (``origin``): fields the IR
    does not model (``hasRank``, sparsity, ...) come along; only the name and a buffer of
    its own differ, and the file's other tensors and operators are unchanged."""
    source = read_model(BRANCHING)
    out = passes.untie_shared_constants(source)
    ((copy_name, shared),) = list(out.passes[0].changes.items())[:1]
    written, before = unpack(write_model(out)), unpack(source.source)
    sg, old = written.subgraphs[0], before.subgraphs[0]
    names = [t.name.decode() for t in sg.tensors]
    copy_t, orig_t = sg.tensors[names.index(copy_name)], sg.tensors[names.index(shared)]
    assert {d.split(":")[0] for d in differences(orig_t, copy_t, "t")} == {"t.buffer", "t.name"}
    assert len(written.buffers) == len(before.buffers) + len(out.passes[0].changes)
    assert differences(old.tensors, sg.tensors[:len(old.tensors)]) == []
    copies = {names.index(n) for n in out.passes[0].changes}
    readers = [j for j, op in enumerate(sg.operators) if copies & set(op.inputs)]
    assert len(readers) == len(copies) == 2  # one bias read by three convolutions
    assert differences([o for j, o in enumerate(old.operators) if j not in readers],
                       [o for j, o in enumerate(sg.operators) if j not in readers]) == []
