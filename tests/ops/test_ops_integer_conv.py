"""Integer CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV and BATCH_MATMUL against
LiteRT, bit-exact (``tests/quantized.py``): int8 activations with per-channel and per-tensor
int8 weights, uint8 with uint8 weights and a weight zero point, 16x8 (int16 activations,
int8 weights, int64 or int32 bias); random inputs and weights over the full ranges."""

from __future__ import annotations

import numpy as np
import pytest

import circle_jax as cj
from tests.quantized import Q, check_quantized, check_refused, full_range

rng = np.random.default_rng(26)

# (activation type, weight type, per-channel weights, bias type)
SCHEMES = [("int8", "int8", True, "int32"), ("int8", "int8", False, "int32"),
           ("uint8", "uint8", False, "int32"), ("int16", "int8", True, "int64")]
IDS = ["int8-per-channel", "int8-per-tensor", "uint8", "int16x8"]
FC_SCHEMES = SCHEMES + [("int16", "int8", False, "int32")]
FC_IDS = IDS + ["int16x8-int32-bias"]


def _zero_point(dtype: str) -> int:
    return {"int8": int(rng.integers(-20, 20)), "uint8": int(rng.integers(100, 150)),
            "int16": 0}[dtype]


def _weights(shape: tuple[int, ...], scheme: tuple, axis: int) -> tuple[Q, np.ndarray]:
    _, wtype, per_channel, _ = scheme
    w = full_range(rng, shape, wtype)
    if per_channel:
        scales = rng.uniform(0.002, 0.01, shape[axis])
        return Q(w, (scales, [0] * shape[axis], axis), const=True), scales
    zp = _zero_point(wtype) if wtype == "uint8" else 0
    scale = float(rng.uniform(0.002, 0.01))
    return Q(w, (scale, zp), const=True), np.full(shape[axis], scale)


def _bias(x_scale: float, w_scales: np.ndarray, scheme: tuple) -> Q:
    n = w_scales.size
    b = rng.integers(-5000, 5000, n).astype(scheme[3])
    scales = x_scale * w_scales
    return Q(b, (scales, [0] * n, 0) if scheme[2] else (float(scales[0]), 0), const=True)


def _input(shape: tuple[int, ...], scheme: tuple) -> tuple[Q, float]:
    scale = float(rng.uniform(0.02, 0.06))
    return Q(full_range(rng, shape, scheme[0]), (scale, _zero_point(scheme[0]))), scale


def _out(scheme: tuple, scale: float) -> tuple[float, int]:
    return (scale, _zero_point(scheme[0]))


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
@pytest.mark.parametrize("options", [
    {"padding": "SAME", "stride_h": 1, "stride_w": 1, "fused_activation_function": "RELU"},
    {"padding": "VALID", "stride_h": 2, "stride_w": 1, "dilation_h_factor": 2,
     "fused_activation_function": "RELU6"},
], ids=["same-relu", "valid-stride-dilation-relu6"])
def test_conv_2d(scheme: tuple, options: dict) -> None:
    x, xs = _input((2, 7, 6, 3), scheme)
    w, ws = _weights((4, 3, 3, 3), scheme, 0)
    check_quantized("CONV_2D", [x, w, _bias(xs, ws, scheme)], options,
                    out_q=_out(scheme, 0.15))


def test_fully_connected_without_bias() -> None:
    scheme = SCHEMES[0]
    x, _ = _input((3, 6), scheme)
    w, _ = _weights((4, 6), scheme, 0)
    check_quantized("FULLY_CONNECTED", [x, w, None], None, out_q=_out(scheme, 0.1),
                    eager=True)


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
def test_depthwise_conv_2d(scheme: tuple) -> None:
    x, xs = _input((1, 6, 6, 3), scheme)
    w, ws = _weights((1, 3, 3, 6), scheme, 3)
    check_quantized("DEPTHWISE_CONV_2D", [x, w, _bias(xs, ws, scheme)],
                    {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 2,
                     "fused_activation_function": "RELU6"}, out_q=_out(scheme, 0.1))


@pytest.mark.parametrize("scheme", FC_SCHEMES, ids=FC_IDS)
@pytest.mark.parametrize("keep", [False, True], ids=["flatten", "keep_num_dims"])
def test_fully_connected(scheme: tuple, keep: bool) -> None:
    x, xs = _input((2, 3, 8), scheme)
    w, ws = _weights((5, 8), scheme, 0)
    check_quantized("FULLY_CONNECTED", [x, w, _bias(xs, ws, scheme)],
                    {"keep_num_dims": keep, "fused_activation_function": "RELU"},
                    out_q=_out(scheme, 0.2))


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
def test_transpose_conv(scheme: tuple) -> None:
    x, xs = _input((1, 4, 3, 3), scheme)
    w, ws = _weights((2, 3, 3, 3), scheme, 0)
    shape = Q(np.array([1, 8, 6, 2], np.int32), None, const=True)
    check_quantized("TRANSPOSE_CONV", [shape, w, x, _bias(xs, ws, scheme)],
                    {"padding": "SAME", "stride_h": 2, "stride_w": 2},
                    out_q=_out(scheme, 0.1), out_dtype=scheme[0])


@pytest.mark.parametrize("adjoint", [(False, False), (True, True)], ids=["plain", "adjoint"])
def test_batch_matmul(adjoint: tuple[bool, bool]) -> None:
    a = full_range(rng, (2, 3, 4) if not adjoint[0] else (2, 4, 3), "int8")
    b = full_range(rng, (4, 5) if not adjoint[1] else (5, 4), "int8")
    check_quantized("BATCH_MATMUL", [Q(a, (0.05, _zero_point("int8"))),
                                     Q(b, (0.04, _zero_point("int8")))],
                    {"adjoint_lhs": adjoint[0], "adjoint_rhs": adjoint[1]},
                    out_q=(0.05 * 0.04 * 20.0, _zero_point("int8")))


@pytest.mark.parametrize("types", [("int16", "int16"), ("int16", "int8")], ids=["16x16", "16x8"])
@pytest.mark.parametrize("shapes, adjoint", [
    (((2, 3, 8), (8, 5)), (False, False)),
    (((2, 40, 3), (2, 6, 40)), (True, True)),
    (((1, 2, 4, 64), (3, 1, 64, 4)), (False, False)),
], ids=["plain", "adjoint", "broadcast-depth64"])
def test_int16_batch_matmul(types: tuple[str, str], shapes: tuple, adjoint: tuple) -> None:
    """int16 x int16 and int16 x int8 (zero points 0), LiteRT's 64-bit accumulator: output
    scales put the sums over the full int16 range, saturating some."""
    a, b = full_range(rng, shapes[0], types[0]), full_range(rng, shapes[1], types[1])
    depth = shapes[0][-2] if adjoint[0] else shapes[0][-1]
    sa, sb = float(rng.uniform(1e-4, 1e-3)), float(rng.uniform(1e-4, 1e-2))
    typical = np.sqrt(depth) * 32768 * (32768 if types[1] == "int16" else 128) / 3
    check_quantized("BATCH_MATMUL", [Q(a, (sa, 0)), Q(b, (sb, 0))],
                    {"adjoint_lhs": adjoint[0], "adjoint_rhs": adjoint[1]},
                    out_q=(sa * sb * typical / 20000, 0))


def test_batch_matmul_refusals() -> None:
    """Types LiteRT has no kernel for (uint8, int8 x int16) and int16 zero points."""
    for ta, tb in (("uint8", "uint8"), ("int8", "int16")):
        a, b = full_range(rng, (2, 4), ta), full_range(rng, (4, 3), tb)
        msg = check_refused("BATCH_MATMUL", [Q(a, (0.05, 0)), Q(b, (0.05, 0))], None,
                            out_q=(0.1, 0), out_shape=(2, 3))
        assert f"is {ta if ta == 'uint8' else tb}; the integer kernel takes" in msg
    a, b = full_range(rng, (2, 4), "int16"), full_range(rng, (4, 3), "int16")
    msg = check_refused("BATCH_MATMUL", [Q(a, (0.05, 3)), Q(b, (0.05, 0))], None,
                        out_q=(0.1, 0), out_shape=(2, 3), error=cj.CircleFormatError)
    assert "int16 BATCH_MATMUL needs zero points 0" in msg
