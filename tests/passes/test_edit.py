"""The editing primitives passes are written with (`circle_jax.passes.edit`): a pass that
adds a constant, tensors and an operator, and a model built from nothing, written and run
in LiteRT.

Tolerances as in `test_pipeline`: rtol 1e-5 with an atol of 1e-5 times the output's scale.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert.interpreter import Interpreter

import circle_jax as cj
from circle_jax import passes
from circle_jax.formats.reader import read_model, unpack
from circle_jax.formats.writer import write_model
from circle_jax.graph import ir
from circle_jax.model import Model
from tests.conformance import run_litert
from tests.passes.test_pipeline import _assert_same, _feeds
from tests.paths import shared_model


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
