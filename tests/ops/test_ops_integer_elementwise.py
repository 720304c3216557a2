"""Integer element-wise operators, pooling, padding, concatenation, reductions and the
operators that only move values, against LiteRT, bit-exact (``tests/quantized.py``), over
int8 / uint8 / int16 where LiteRT supports them, with random inputs over the full range."""

from __future__ import annotations

import numpy as np
import pytest

import circle_jax as cj
from tests.conformance import run_litert
from tests.quantized import Q, check_quantized, check_refused, every_value, full_range

rng = np.random.default_rng(126)
DTYPES = ["int8", "uint8", "int16"]


def zp(dtype: str) -> int:
    """A random zero point (0 for int16, symmetric as LiteRT requires)."""
    return {"int8": int(rng.integers(-30, 30)), "uint8": int(rng.integers(100, 160)),
            "int16": 0}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("act, shapes", [("NONE", ((2, 3, 4), (2, 3, 4))),
                                         ("RELU6", ((2, 3, 4), (1, 1, 4)))],
                         ids=["same-shape", "broadcast-relu6"])
def test_binary(op: str, dtype: str, act: str, shapes: tuple) -> None:
    a, b = (full_range(rng, s, dtype) for s in shapes)
    check_quantized(op, [Q(a, (0.03, zp(dtype))), Q(b, (0.07, zp(dtype)))],
                    {"fused_activation_function": act},
                    out_q=(0.5 if op == "MUL" else 0.11, zp(dtype)))


def test_add_of_a_constant() -> None:
    a = full_range(rng, (1, 4, 4, 3), "int8")
    c = full_range(rng, (3,), "int8")
    check_quantized("ADD", [Q(a, (0.02, 3)), Q(c, (0.01, -2), const=True)], None,
                    out_q=(0.03, 1), eager=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, options", [("RELU", None), ("RELU6", None),
                                         ("RELU_N1_TO_1", None),
                                         ("LEAKY_RELU", {"alpha": 0.2})])
def test_relu_family(op: str, options: dict | None, dtype: str) -> None:
    x = full_range(rng, (2, 3, 5), dtype)
    if op == "RELU_N1_TO_1" and dtype == "int16":  # LiteRT has no such kernel: refused
        b = cj.Builder()
        y = b.tensor("y", x.shape, "int16", quantization=(0.04, 0))
        b.op(op, [b.input("x", x.shape, "int16", quantization=(0.05, 0))], outputs=[y])
        b.output(y)
        with pytest.raises(cj.UnsupportedOperatorError) as e:
            cj.load(b.to_bytes("tflite"))
        assert "\n" not in str(e.value) and "RELU_N1_TO_1" in str(e.value)
        return
    check_quantized(op, [Q(x, (0.05, zp(dtype)))], options, out_q=(0.04, zp(dtype)))


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("op", ["LOGISTIC", "TANH"])
def test_table_activations(op: str, dtype: str) -> None:
    x = np.arange(*{"int8": (-128, 128), "uint8": (0, 256)}[dtype]).astype(dtype)
    lo = -128 if dtype == "int8" else 0
    out_q = (1 / 256, lo) if op == "LOGISTIC" else (1 / 128, lo + 128)
    check_quantized(op, [Q(x.reshape(4, 64), (0.06, zp(dtype)))], None, out_q=out_q)


@pytest.mark.parametrize("op", ["LOGISTIC", "TANH"])
@pytest.mark.parametrize("scale", [2.4e-4, 1 / 3000, 3.1e-3], ids=["narrow", "wide", "saturating"])
def test_int16_sigmoid_activations(op: str, scale: float) -> None:
    """LiteRT's 16-bit kernel on all 65,536 int16 inputs."""
    x = every_value("int16").reshape(256, 256)
    check_quantized(op, [Q(x, (scale, 0))], None, out_q=(1 / 32768, 0))


@pytest.mark.parametrize("op, scale", [("LOGISTIC", 2.0 ** -12), ("TANH", 2.0 ** -11)])
def test_int16_sigmoid_activations_power_of_two_input_scale_refused(op: str, scale: float
                                                                    ) -> None:
    """LiteRT takes another (gemmlowp) kernel for these scales: refused in one line."""
    msg = check_refused(op, [Q(every_value("int16"), (scale, 0))], out_q=(1 / 32768, 0),
                        litert_refuses=False)
    assert f"int16 {op} with input scale 2**{int(np.log2(scale))}" in msg


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("x_q, out_q", [((0.05, 0.03), (0.01, 0.04)),
                                        ((0.004, 0.00025), (0.004, 0.00025)),
                                        ((0.08, 0.02), (0.3, 0.002))],
                         ids=["typical", "small-scales", "saturating"])
def test_hard_swish(dtype: str, x_q: tuple, out_q: tuple) -> None:
    """Every input value; the input scales cover the fixed-point "reluish" multiplier with
    a left shift (s_in > 3 / 256) and a right shift."""
    x = every_value(dtype)
    check_quantized("HARD_SWISH", [Q(x, (x_q[0], zp(dtype)))], None,
                    out_q=(out_q[0], zp(dtype)))


def test_hard_swish_refusals() -> None:
    """int16 (LiteRT has no int16 kernel) and an output scale below input scale / 128
    (LiteRT's Prepare fails)."""
    msg = check_refused("HARD_SWISH", [Q(every_value("int16"), (0.01, 0))], out_q=(0.01, 0))
    assert "int16" in msg
    msg = check_refused("HARD_SWISH", [Q(every_value("int8"), (0.5, 0))], out_q=(0.001, 0),
                        error=cj.CircleFormatError)
    assert "HARD_SWISH needs output scale above input scale / 128" in msg


@pytest.mark.parametrize("scales", [(0.02, 0.03, 0.3), (0.05, 0.05, 0.02), (0.1, 0.013, 2.0)],
                         ids=["mixed", "equal-saturating", "coarse-out"])
def test_squared_difference(scales: tuple[float, float, float]) -> None:
    """Every pair of int8 values (65,536 outputs)."""
    a, b = np.meshgrid(every_value("int8"), every_value("int8"))
    check_quantized("SQUARED_DIFFERENCE", [Q(a, (scales[0], zp("int8"))),
                                           Q(b, (scales[1], zp("int8")))],
                    None, out_q=(scales[2], zp("int8")))


def test_squared_difference_broadcast_of_a_constant() -> None:
    a = full_range(rng, (2, 3, 4), "int8")
    c = full_range(rng, (4,), "int8")
    check_quantized("SQUARED_DIFFERENCE", [Q(a, (0.04, 5)), Q(c, (0.03, -7), const=True)],
                    None, out_q=(0.05, -100))


def test_squared_difference_refusals() -> None:
    """uint8 and int16 (LiteRT's kernel is int8 only), and an output multiplier
    ``(2 max(s1, s2))**2 / (2**14 s_out)`` not below 1 (LiteRT aborts: not run here)."""
    for dtype in ("uint8", "int16"):
        x = full_range(rng, (2, 3), dtype)
        msg = check_refused("SQUARED_DIFFERENCE", [Q(x, (0.05, 0)), Q(x, (0.05, 0))],
                            out_q=(0.05, 0))
        assert f"is {dtype}; the integer kernel takes int8" in msg
    x = full_range(rng, (2, 3), "int8")
    msg = check_refused("SQUARED_DIFFERENCE", [Q(x, (2.0, 0)), Q(x, (1.0, 0))],
                        out_q=(1e-4, 0), error=cj.CircleFormatError, litert_refuses=False)
    assert "SQUARED_DIFFERENCE needs output scale above" in msg


@pytest.mark.parametrize("zero_point", [-128, -5, 60])
@pytest.mark.parametrize("scales", [(0.05, 0.02), (2.0, 0.005), (0.3, 0.05)],
                         ids=["saturating-top", "fine-out", "coarse-out"])
def test_int8_rsqrt(zero_point: int, scales: tuple[float, float]) -> None:
    """Every input at or above the zero point (LiteRT refuses negative reals)."""
    x = every_value("int8", lo=zero_point)
    check_quantized("RSQRT", [Q(x, (scales[0], zero_point))], None,
                    out_q=(scales[1], int(rng.integers(-100, 0))))


@pytest.mark.parametrize("scales", [(1e-3, 1e-3), (0.02, 2e-4)],
                         ids=["small-output", "large-output"])
def test_int16_rsqrt(scales: tuple[float, float]) -> None:
    """Every non-negative int16 input (32,768 values)."""
    check_quantized("RSQRT", [Q(every_value("int16", lo=0), (scales[0], 0))], None,
                    out_q=(scales[1], 0))


def test_rsqrt_of_negative_reals() -> None:
    """LiteRT stops with an error on inputs below the zero point; circle-jax gives the type's
    maximum there (documented), and uint8 (no LiteRT kernel) is refused."""
    x = np.array([-128, -20, -1, 0], np.int8)
    b = cj.Builder()
    y = b.op("RSQRT", [b.input("x", x.shape, "int8", quantization=(0.05, 0))],
             quantization=[(0.02, 3)], dtypes=["int8"])
    b.output(y)
    with pytest.raises(RuntimeError):
        run_litert(b.to_bytes("tflite"), [x])
    model = cj.load(b.to_bytes("tflite"))
    assert model.apply(model.params, x)[0].tolist() == [127] * 4
    msg = check_refused("RSQRT", [Q(every_value("uint8", lo=10), (0.05, 10))], out_q=(0.02, 3))
    assert "is uint8; the integer kernel takes int8/int16" in msg


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_softmax(dtype: str, beta: float) -> None:
    x = full_range(rng, (3, 2, 10), dtype)
    out_q = (1 / 256, -128 if dtype == "int8" else 0)
    check_quantized("SOFTMAX", [Q(x, (0.07, zp(dtype)))], {"beta": beta}, out_q=out_q,
                    eager=beta == 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_pooling(op: str, dtype: str, padding: str) -> None:
    x = full_range(rng, (1, 7, 6, 3), dtype)
    q = (0.05, zp(dtype))
    check_quantized(op, [Q(x, q)], {"padding": padding, "stride_w": 2, "stride_h": 2,
                                    "filter_width": 3, "filter_height": 3,
                                    "fused_activation_function": "RELU6"}, out_q=q)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pad(dtype: str) -> None:
    x = full_range(rng, (1, 3, 4, 2), dtype)
    q = (0.05, zp(dtype))
    pads = Q(np.array([[0, 0], [1, 2], [0, 1], [1, 0]], np.int32), None, const=True)
    check_quantized("PAD", [Q(x, q), pads], None, out_q=q)


def test_padv2_pads_with_its_constant() -> None:
    x = full_range(rng, (2, 3), "int8")
    pads = Q(np.array([[1, 0], [0, 2]], np.int32), None, const=True)
    value = Q(np.array(17, np.int8), (0.05, -4), const=True)
    out = check_quantized("PADV2", [Q(x, (0.05, -4)), pads, value], None, out_q=(0.05, -4))
    assert out[0, 0] == 17


@pytest.mark.parametrize("dtype", DTYPES)
def test_concatenation(dtype: str) -> None:
    q = (0.05, zp(dtype))
    a, b = full_range(rng, (1, 2, 3, 3), dtype), full_range(rng, (1, 2, 3, 2), dtype)
    check_quantized("CONCATENATION", [Q(a, q), Q(b, q)], {"axis": 3}, out_q=q)


def test_uint8_concatenation_requantizes() -> None:
    a, b = full_range(rng, (2, 3), "uint8"), full_range(rng, (2, 5), "uint8")
    check_quantized("CONCATENATION", [Q(a, (0.05, 120)), Q(b, (0.09, 131))], {"axis": 1},
                    out_q=(0.07, 125), eager=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["MEAN", "SUM"])
@pytest.mark.parametrize("axes, keep", [([1, 2], True), ([1, 2], False), ([0, 3], True),
                                        ([3], False)],
                         ids=["spatial-keep", "spatial", "outer-keep", "last"])
def test_reductions(op: str, dtype: str, axes: list[int], keep: bool) -> None:
    x = full_range(rng, (2, 5, 6, 3), dtype)
    out_q = ((0.03 if op == "MEAN" else 0.9), zp(dtype))
    check_quantized(op, [Q(x, (0.05, zp(dtype))), Q(np.array(axes, np.int32), const=True)],
                    {"keep_dims": keep}, out_q=out_q, eager=op == "SUM" and dtype == "uint8")


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_spatial_mean_stress(dtype: str) -> None:
    """LiteRT's specialised 4-d MEAN over axes (1, 2) with keep_dims, on 12 seeded random
    shapes (17 to 40 channels: int8's SIMD blocks of 16 round differently from its scalar
    tail), scales and zero points; before the block rule 25 of 150 random int8 cases
    differed by 1."""
    r = np.random.default_rng(11)
    lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
    for _ in range(12):
        shape = (int(r.integers(1, 3)), int(r.integers(1, 9)), int(r.integers(1, 9)),
                 int(r.integers(17, 41)))
        s_in = float(r.uniform(0.001, 0.2))
        x_q = (s_in, int(r.integers(lo, hi)))
        y_q = (s_in * float(r.uniform(0.3, 3)), int(r.integers(lo, hi)))
        check_quantized("MEAN", [Q(full_range(r, shape, dtype), x_q),
                                 Q(np.array([1, 2], np.int32), const=True)],
                        {"keep_dims": True}, out_q=y_q)


def test_mean_with_equal_parameters() -> None:
    x = full_range(rng, (1, 4, 4, 8), "int8")
    check_quantized("MEAN", [Q(x, (0.05, 7)), Q(np.array([1, 2], np.int32), const=True)],
                    {"keep_dims": True}, out_q=(0.05, 7))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, extra, options", [
    ("RESHAPE", [np.array([6, 4], np.int32)], None),
    ("TRANSPOSE", [np.array([2, 0, 1], np.int32)], None),
    ("STRIDED_SLICE", [np.array([0, 1, 0], np.int32), np.array([2, 3, 4], np.int32),
                       np.array([1, 1, 2], np.int32)], None),
    ("GATHER", [np.array([2, 0], np.int32)], {"axis": 1}),
], ids=["reshape", "transpose", "strided_slice", "gather"])
def test_value_moving_operators(op: str, extra: list, options: dict | None,
                                dtype: str) -> None:
    """Operators that only move stored values: their generic kernels, exact as they are."""
    x = full_range(rng, (2, 3, 4), dtype)
    q = (0.05, zp(dtype))
    check_quantized(op, [Q(x, q), *(Q(e, const=True) for e in extra)], options, out_q=q)
