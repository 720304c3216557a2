"""The fake-quant pass (`circle_jax.passes.fake_quant`): the float model a fully quantized
file becomes for quantization-aware training, and the plan of where it rounds.

The pass alone is checked against the source file's own tensors (the real values of its
integers written out with numpy); the forward it lowers to (``qat_forward="fake_quant"``)
against LiteRT on the export, per operator (tolerances there). QAT's export, settings and
integer forward: `test_qat`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax import passes
from circle_jax.formats.reader import read_model
from tests.passes.test_qat import (
    DATA,
    END_TO_END,
    _as_input,
    _litert,
    _producer,
    _real,
    _train,
    forced,
)


def _real_values(t: object) -> np.ndarray:
    """numpy's ``scale * (q - zero_point)`` of a quantized constant, per channel along its
    quantized dimension."""
    q = t.quantization
    shape = [1] * t.data.ndim
    if len(q.scale) > 1:
        shape[q.quantized_dimension] = len(q.scale)
    scale = np.asarray(q.scale, np.float64).reshape(shape)
    zero = np.asarray(q.zero_point, np.float64).reshape(shape)
    return (scale * (t.data.astype(np.float64) - zero)).astype(np.float32)


@pytest.mark.parametrize("name", ["full_int8", "int16x8"])
def test_fake_quantize_makes_every_quantized_tensor_float_and_plans_its_rounding(
        name: str) -> None:
    source = read_model(DATA / f"{name}.tflite")
    out = passes.fake_quantize(source)
    sg, before = out.main, source.main
    quantized = [t for t in before.tensors  # integers with a scale: biases' int32 too
                 if np.issubdtype(np.dtype(t.dtype), np.integer) and t.quantization is not None
                 and len(t.quantization.scale) > 0]
    assert quantized and source.passes == ()  # the source is left as it was
    assert [t.name for t in sg.tensors] == [t.name for t in before.tensors]
    (rec,) = out.passes
    assert rec.name == "fake_quantize" and rec.changes == {t.name: t.dtype for t in quantized}
    for t in quantized:
        got = sg.tensors[t.index]
        assert got.dtype == "float32" and got.quantization is None
        if t.data is not None:
            np.testing.assert_allclose(got.data, _real_values(t), rtol=1e-6, atol=0)
    assert [op.type for op in sg.operators] == [
        "DEQUANTIZE" if op.type in ("QUANTIZE", "DEQUANTIZE") else op.type
        for op in before.operators]
    plan = passes.fake_quant_plan(source)
    planned = {**plan.activations, **plan.weights, **plan.biases}
    assert set(planned) == {(0, t.index) for t in quantized}
    assert {i for _, i in plan.activations} == {t.index for t in quantized if t.data is None}
    assert plan.biases  # every layer of these models has its quantized bias
    for (_, i), b in plan.biases.items():
        op = next(op for op in before.operators if i in op.inputs)
        assert (b.input, b.weight) == (op.inputs[0], op.inputs[1])


# full_int8 differs from full_int8_float_io only by its int8 I/O, which
# test_qat.test_qat_model_is_float_with_the_files_weights and test_qat's golden test run
# through LiteRT.
@pytest.mark.parametrize("name", ["full_int8_float_io", "int16x8"])
def test_fake_quant_forward_matches_the_export_per_operator(name: str) -> None:
    """qat_forward="fake_quant": after training, LiteRT on the export against the
    simulation: every operator within 1 step of its grid given its integer inputs; the
    output within the measured bound."""
    model = cj.load(DATA / f"{name}.tflite", qat=True, qat_forward="fake_quant")
    params = _train(model)
    exported = model.export(params)
    assert exported != model.export()  # the weights moved
    sg = model.simulated.main
    out = sg.tensors[sg.outputs[0]]
    last = out.index if out.dtype != "float32" else next(
        op.inputs[0] for op in sg.operators if out.index in op.outputs)
    tensors = jax.jit(model.tensors)
    worst = 0.0
    for n, xi in enumerate(np.load(DATA / "inputs.npz")["x"][:, None]):
        litert_tensors = _litert(exported, _as_input(model, xi))
        want = {t.index: _real(t, litert_tensors[t.name]) for t in sg.tensors
                if t.data is None and t.quantization is not None
                and t.dtype in ("int8", "int16") and t.name in litert_tensors}
        if n == 0:  # per operator, on one digit (it iterates through the graph)
            own = forced(tensors, params, xi, want, len(sg.operators))
            for i, got in own.items():
                t = sg.tensors[i]
                steps = np.abs(got - want[i]).max() / t.quantization.scale[0]
                # LiteRT's int16 SOFTMAX reads exp from a table (measured: 10 steps)
                bound = 16 if t.dtype == "int16" and _producer(sg, i) == "SOFTMAX" else 1
                # + 0.01: float32 holds an int16 grid's real values to ~2e-3 steps
                assert steps <= bound + 0.01, f"{name}: tensor {t.name!r}: {steps}"
            assert len(own) >= 10
        zeros = {i: jnp.zeros(v.shape) for i, v in want.items()}  # the traced structure
        sim = np.asarray(tensors(params, xi, taps=zeros)[0][0])
        lt = sg.tensors[last]
        steps = np.abs(sim.reshape(-1) - want[last].reshape(-1)) / lt.quantization.scale[0]
        worst = max(worst, float(steps.max()))
    assert worst <= END_TO_END[sg.tensors[last].dtype] + 0.01, (name, worst)
