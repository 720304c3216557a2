"""Converter-made quantized models (tests/data/quantized/, written by
scripts/make_quantized_models.py with TensorFlow's TFLiteConverter) against LiteRT.

The full-integer variants (int8 with int8 or float32 inputs and outputs, 16x8; the operators
model in int8 and 16x8) run bit-exactly end to end, and so does every intermediate tensor
(LiteRT run with ``experimental_preserve_all_tensors``); the dynamic-range (hybrid) variant is
refused in one line when loaded with ``dequantize=False`` (it runs dequantized by default: tests in
tests/passes/test_dequantize.py); the float16-weight variant runs in float32 (weights
dequantized at load) within the float tolerance of tests/test_sweep.py.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from tests.conformance import run_litert_all

DATA = Path(__file__).parent / "data" / "quantized"
INTEGER = ["full_int8", "full_int8_float_io", "int16x8"]


def _inputs(name: str) -> list[np.ndarray]:
    """The 8 recorded digits, quantized with the input's parameters for int8 inputs."""
    x = np.load(DATA / "inputs.npz")["x"]
    ir = read_model(str(DATA / f"{name}.tflite")).main
    t = ir.tensors[ir.inputs[0]]
    if t.dtype == "int8":
        q = t.quantization
        x = np.clip(np.round(x / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)
    return [x[i:i + 1] for i in range(len(x))]


def _litert_tensors(data: bytes, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    outputs, tensors = run_litert_all(data, [x])
    return outputs[0], tensors


@pytest.mark.parametrize("name", INTEGER)
def test_full_integer_models_are_bit_exact(name: str) -> None:
    data = (DATA / f"{name}.tflite").read_bytes()
    model = cj.load(data)
    inter = jax.jit(model.intermediates)
    compared = 0
    for x in _inputs(name):
        want, tensors = _litert_tensors(data, x)
        got = np.asarray(jax.jit(model.apply)(model.params, x)[0])
        assert got.dtype == want.dtype and np.array_equal(got, want), name
        for tname, value in inter(model.params, x).items():
            value = np.asarray(value)
            if tname in tensors and value.dtype != np.float32:
                assert np.array_equal(value, tensors[tname]), f"{name}: tensor {tname!r}"
                compared += 1
    assert compared >= 8 * 10  # every integer activation of every sample


@pytest.mark.parametrize("name", ["ops_full_int8", "ops_int16x8"])
def test_operator_models_are_bit_exact(name: str) -> None:
    """The operators model (TANH, LOGISTIC, HARD_SWISH, BATCH_MATMUL, SQUARED_DIFFERENCE,
    RSQRT; 16x8: int16 TANH, LOGISTIC, 16x16 BATCH_MATMUL, RSQRT): output and every integer
    tensor, on 2 of the recorded digits."""
    data = (DATA / f"{name}.tflite").read_bytes()
    model = cj.load(data)
    intermediates = jax.jit(model.intermediates)
    compared = 0
    for x in _inputs(name)[:2]:
        want, tensors = _litert_tensors(data, x)
        inter = intermediates(model.params, x)
        assert np.array_equal(np.asarray(inter[model.outputs[0].name]), want)
        for tname, value in inter.items():
            value = np.asarray(value)
            if tname in tensors and value.dtype != np.float32:
                assert np.array_equal(value, tensors[tname]), f"{name}: tensor {tname!r}"
                compared += 1
    assert compared >= 2 * 10


def test_dynamic_range_model_is_refused_without_dequantizing() -> None:
    """int8 weights with float activations must not run as plain integer weights."""
    with pytest.raises(cj.UnsupportedOperatorError) as e:
        cj.load(DATA / "dynamic_range.tflite", dequantize=False)
    msg = str(e.value)
    assert "\n" not in msg and "(hybrid: float activations; load with dequantize=True)" in msg


def test_float16_weight_model_runs_in_float32() -> None:
    data = (DATA / "float16.tflite").read_bytes()
    model = cj.load(data)
    for x in _inputs("float16")[:3]:
        want, _ = _litert_tensors(data, x)
        got = np.asarray(jax.jit(model.apply)(model.params, x)[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_full_int8_mobilenet_is_bit_exact() -> None:
    """TF's full-int8 MobileNet v1 (alpha 0.25, 96x96; a SHAPE of an int8 tensor, its head's
    spatial MEAN of 256 channels in LiteRT's specialised kernel): output and every integer
    tensor equal LiteRT's on 3 seeded random images. (The MEAN kernel's rounding by channel
    block is pinned by tests/ops/test_ops_integer_elementwise.py's random stress test.)"""
    data = (DATA / "mobilenet_full_int8.tflite").read_bytes()
    model = cj.load(data)
    assert any(op.type == "MEAN" for op in model.ir.main.operators)
    intermediates = jax.jit(model.intermediates)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.integers(-128, 128, (1, 96, 96, 3)).astype(np.int8)
        want, tensors = _litert_tensors(data, x)
        inter = intermediates(model.params, x)
        assert np.array_equal(np.asarray(inter[model.outputs[0].name]), want)
        differing = [t for t, v in inter.items() if t in tensors
                     and np.asarray(v).dtype != np.float32
                     and not np.array_equal(np.asarray(v), tensors[t])]
        assert not differing, differing[:3]
