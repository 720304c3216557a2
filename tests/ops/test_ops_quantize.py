"""DEQUANTIZE and QUANTIZE against LiteRT, with per-tensor and per-axis quantization params.

The builder does not write quantization parameters yet, so these models are finished by hand:
``Builder.to_object()`` gives circle-schema's ``ModelT``, the test sets ``tensor.quantization``
and packs it with ``circle_jax.formats.writer.pack``.

LiteRT's vectorized x86 QUANTIZE kernels round ties differently from TFLite's reference
semantics (round half away from zero), which circle-jax implements: float -> int rounds ties to
even in all but the last ``size % 8`` elements, 8-bit -> 8-bit requantization rounds ties up in
all but the last ``size % 16``. The rows below therefore compare ties on tensors shorter than
those vector widths (LiteRT's scalar path) and keep random data off ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from circle_schema.v0_10.circle.QuantizationParameters import QuantizationParametersT

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.formats.writer import pack
from tests.conformance import (
    Const,
    assert_close,
    check_op,
    check_op_grads,
    run_circle_jax,
    run_litert,
)

rng = np.random.default_rng(7)

QParams = tuple  # (scale, zero_point) or (scales, zero_points, quantized_dimension)


def _qparams(q: QParams) -> QuantizationParametersT:
    t = QuantizationParametersT()
    t.scale = [float(s) for s in np.atleast_1d(q[0])]
    t.zeroPoint = [int(z) for z in np.atleast_1d(q[1])]
    t.quantizedDimension = q[2] if len(q) > 2 else 0
    return t


def quant_model(op: str, x: np.ndarray, out_dtype: str, in_q: QParams | None = None,
                out_q: QParams | None = None, const: bool = False) -> dict[str, bytes]:
    """.tflite and .circle bytes of a one-op model whose input/output carry quantization."""
    b = Builder()
    t = b.constant("c", x) if const else b.input("x", x.shape, x.dtype.name)
    y = b.op(op, [t], shapes=[x.shape], dtypes=[out_dtype])
    b.output(y)
    out = {}
    for fmt in ("tflite", "circle"):
        m = b.to_object()
        tensors = m.subgraphs[0].tensors
        if in_q is not None:
            tensors[t].quantization = _qparams(in_q)
        if out_q is not None:
            tensors[y].quantization = _qparams(out_q)
        out[fmt] = pack(m, fmt)
    return out


def check_quant(op: str, x: np.ndarray, out_dtype: str, in_q: QParams | None = None,
                out_q: QParams | None = None, const: bool = False) -> np.ndarray:
    """LiteRT vs circle-jax (tflite jit and eager, circle jit); integers must match exactly,
    floats to the oracle's default tolerance. Returns circle-jax's output."""
    data = quant_model(op, x, out_dtype, in_q, out_q, const)
    feeds = [] if const else [x]
    want = run_litert(data["tflite"], feeds)[0]
    got = None
    for fmt, jit in (("tflite", True), ("tflite", False), ("circle", True)):
        got = run_circle_jax(data[fmt], feeds, jit=jit)[0]
        assert got.dtype == want.dtype, f"{fmt}: dtype {got.dtype} != LiteRT {want.dtype}"
        assert_close(got, want, 1e-5, 1e-5, f"{op} {fmt} jit={jit}")
    return got


def circle_jax_out(op: str, x: np.ndarray, out_dtype: str, **kw: Any) -> np.ndarray:
    return run_circle_jax(quant_model(op, x, out_dtype, **kw)["circle"], [x], jit=False)[0]


# --------------------------------------------------------------------------------- DEQUANTIZE


@pytest.mark.parametrize("const", [True, False], ids=["const", "input"])
def test_dequantize_float16(const: bool) -> None:
    x = rng.normal(size=(3, 4)).astype(np.float16)
    check_op("DEQUANTIZE", [Const(x) if const else x])


def test_dequantize_float16_param_gradient() -> None:
    # A float16 constant is a param: the gradient reaches it (through float32). A default
    # load dequantizes the weight-only model (float32 master, no DEQUANTIZE left:
    # tests/test_weight_only_models.py); dequantize=False keeps the operator.
    b = Builder()
    w = b.constant("w16", rng.normal(size=(2, 3)).astype(np.float16))
    x = b.input("x", (2, 3))
    y = b.op("MUL", [b.op("DEQUANTIZE", [w]), x], {"fused_activation_function": "NONE"})
    b.output(y)
    assert cj.load(b.to_bytes("circle")).params["w16"].dtype == jnp.float32
    model = cj.load(b.to_bytes("circle"), dequantize=False)
    assert list(model.params) == ["w16"]
    xv = rng.normal(size=(2, 3)).astype(np.float32)
    g = jax.grad(lambda p: jnp.sum(model.apply(p, xv)[0]))(model.params)["w16"]
    assert g.dtype == jnp.float16
    np.testing.assert_allclose(g, xv.astype(np.float16), rtol=1e-3)
    check_op_grads("DEQUANTIZE", [Const(rng.normal(size=(2, 3)).astype(np.float16))])


@pytest.mark.parametrize("dtype,zero_point", [("int8", -5), ("uint8", 120), ("int16", 0)])
@pytest.mark.parametrize("const", [True, False], ids=["const", "input"])
def test_dequantize_per_tensor(dtype: str, zero_point: int, const: bool) -> None:
    # Float32 rounding: LiteRT's vectorized kernel computes q*s - z*s, circle-jax (q - z)*s;
    # they may differ in the last bit, well inside the default 1e-5 tolerance.
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (5, 7)).astype(dtype)
    check_quant("DEQUANTIZE", x, "float32", in_q=(0.0173, zero_point), const=const)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_dequantize_per_axis(axis: int) -> None:
    x = rng.integers(-128, 128, (3, 4, 5)).astype(np.int8)
    n = x.shape[axis]
    scales = rng.uniform(0.005, 0.05, n).astype(np.float32)
    zeros = rng.integers(-3, 4, n)
    check_quant("DEQUANTIZE", x, "float32", in_q=(scales, zeros, axis), const=True)


def test_dequantized_int8_constant_is_folded_not_a_param() -> None:
    data = quant_model("DEQUANTIZE", np.arange(-3, 3, dtype=np.int8), "float32",
                       in_q=(0.5, 1), const=True)
    model = cj.load(data["circle"], dequantize=False)  # a default load makes it a float param
    assert model.params == {}
    np.testing.assert_array_equal(model()[0], (np.arange(-3, 3) - 1) * 0.5)


def test_dequantize_without_params_is_a_clear_error() -> None:
    model = cj.load(quant_model("DEQUANTIZE", np.zeros(3, np.int8), "float32", const=True)
                    ["circle"])
    with pytest.raises(ValueError, match="the input tensor has no quantization parameters"):
        model()


# ----------------------------------------------------------------------------------- QUANTIZE


def off_ties(x: np.ndarray, scale: np.ndarray | float, gap: float = 1e-3) -> np.ndarray:
    """x with elements whose x / scale lies within ``gap`` of a half-integer nudged off it."""
    v = x / scale
    near = np.abs(v - np.floor(v) - 0.5) < gap
    return np.where(near, x + 4 * gap * scale, x).astype(np.float32)


@pytest.mark.parametrize("dtype,scale,zero_point",
                         [("int8", 0.037, 3), ("uint8", 0.0131, 128), ("int16", 0.00071, 0)])
def test_quantize_per_tensor(dtype: str, scale: float, zero_point: int) -> None:
    x = rng.normal(size=(4, 6, 9)).astype(np.float32) * 2
    x.flat[:2] = 1e3, -1e3  # clamped to the dtype's range
    check_quant("QUANTIZE", off_ties(x, np.float32(scale)), dtype, out_q=(scale, zero_point))


@pytest.mark.parametrize("dtype,zero_point", [("int8", 0), ("uint8", 128), ("int16", 0)])
def test_quantize_rounds_half_away_from_zero(dtype: str, zero_point: int) -> None:
    # Fewer than 8 elements: LiteRT's scalar path, TFLite's reference semantics (std::round).
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997], np.float32)
    got = check_quant("QUANTIZE", x, dtype, out_q=(1.0, zero_point))
    np.testing.assert_array_equal(got.astype(int) - zero_point, [-3, -2, -1, 1, 2, 3, 0])
    check_quant("QUANTIZE", x / 4, dtype, out_q=(0.25, zero_point))


@pytest.mark.parametrize("axis,dtype", [(0, "int8"), (1, "int8"), (2, "int16")])
def test_quantize_per_axis(axis: int, dtype: str) -> None:
    # LiteRT's per-axis kernel is scalar: ties (x / scale = k + 0.5) are included.
    x = rng.normal(size=(3, 4, 40)).astype(np.float32) * 2
    n = x.shape[axis]
    scales = np.array([0.25, 0.0131, 0.0037, 0.02] * 10, np.float32)[:n]
    zeros = rng.integers(-3, 4, n) if dtype == "int8" else np.zeros(n, int)
    shape = [1, 1, 1]
    shape[axis] = n
    s = scales.reshape(shape)
    x = np.where(rng.random(x.shape) < 0.1, (np.round(x / s) + 0.5) * s, x).astype(np.float32)
    check_quant("QUANTIZE", x, dtype, out_q=(scales, zeros, axis))


def test_quantize_to_float_is_rejected() -> None:
    model = cj.load(quant_model("QUANTIZE", np.zeros(3, np.float32), "float32",
                                out_q=(0.1, 0))["circle"])
    with pytest.raises(ValueError, match="QUANTIZE to float32 is not supported"):
        model(np.zeros(3, np.float32))


# Requantization: (input, output) dtypes LiteRT supports, and scale pairs whose ratio gives
# many ties in the fixed-point shift (1/3, 0.0246), a ratio > 1 and equal scales.
REQUANT_TYPES = [("int8", "int8"), ("uint8", "int8"), ("int8", "uint8"), ("uint8", "uint8"),
                 ("int8", "int16"), ("uint8", "int16"), ("int16", "int16"), ("int16", "int8")]
REQUANT_SCALES = [((1.0, 3.0)), ((0.0123, 0.5)), ((0.3, 0.01)), ((0.05, 0.05))]


def _zero_point(dtype: str, k: int) -> int:
    return {"int8": (0, -4, 7, 0), "uint8": (128, 130, 9, 200), "int16": (0,) * 4}[dtype][k]


def _chunks(x: np.ndarray, size: int) -> Sequence[np.ndarray]:
    return [x[i:i + size] for i in range(0, x.size, size)]


@pytest.mark.parametrize("src,dst", REQUANT_TYPES, ids=str)
def test_requantize(src: str, dst: str) -> None:
    info = np.iinfo(src)
    x = (np.arange(info.min, info.max + 1) if info.bits == 8
         else rng.integers(info.min, info.max + 1, 3000)).astype(src)
    # 8-bit -> 8-bit goes through LiteRT in pieces shorter than its 16-lane vector path.
    size = 15 if info.bits == 8 and np.iinfo(dst).bits == 8 else x.size
    for k, (s_in, s_out) in enumerate(REQUANT_SCALES):
        kw = {"in_q": (s_in, _zero_point(src, k)), "out_q": (s_out, _zero_point(dst, k))}
        got = circle_jax_out("QUANTIZE", x, dst, **kw)
        want = np.concatenate([run_litert(quant_model("QUANTIZE", c, dst, **kw)["tflite"], [c])[0]
                               for c in _chunks(x, size)])
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=f"{src}->{dst} {kw}")
    check_quant("QUANTIZE", x[:15], dst, in_q=(0.05, _zero_point(src, 1)),
                out_q=(0.07, _zero_point(dst, 1)))


def test_requantize_int16_to_uint8_numpy_reference() -> None:
    # LiteRT refuses int16 -> uint8 (quantize.cc: output must be int8/int16/int32); checked
    # against exact rational arithmetic instead (no ties: the ratio 4/3 never lands on .5).
    x = np.arange(-600, 600, dtype=np.int16)
    got = circle_jax_out("QUANTIZE", x, "uint8", in_q=(0.4, 0), out_q=(0.3, 10))
    ratio = np.float64(np.float32(0.4)) / np.float64(np.float32(0.3))
    want = np.clip(np.floor(x * ratio + 0.5) + 10, 0, 255)
    np.testing.assert_array_equal(got, want)
