"""16x8 kernels whose accumulator exceeds int32 (int16 activations, int8 weights, int64
bias): LiteRT's reference FULLY_CONNECTED accumulates in int64 and rescales in double
(``circle_jax.ops.integer.double_requant``), its convolutions rescale the int64 sum with
the 15-bit multiplier; circle-jax equals LiteRT bit for bit (``array_equal``) on random
large-depth cases with full-range values, output scales that put the sums over int16's
range (some saturate), per-channel and per-tensor weights. The double rescaling is also
checked against numpy's IEEE float64 on accumulators up to 2**53."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.quantized import Q, check_quantized, full_range


def _case(rng: np.random.Generator, depth: int, per_channel: bool, skew: bool) -> tuple:
    x = full_range(rng, (3, depth), "int16")
    if skew:  # same-signed inputs and weights: the sums grow as depth, not sqrt(depth)
        x = np.abs(x.astype(np.int32)).clip(0, 32767).astype(np.int16)
    w = full_range(rng, (6, depth), "int8")
    if skew:
        w = np.abs(w.astype(np.int32)).clip(0, 127).astype(np.int8)
    xs = float(rng.uniform(1e-4, 1e-3))
    ws = rng.uniform(0.002, 0.01, 6) if per_channel else np.full(6, rng.uniform(0.002, 0.01))
    wq = (ws, [0] * 6, 0) if per_channel else (float(ws[0]), 0)
    acc = np.abs(x.astype(np.int64) @ w.T.astype(np.int64)).max()
    assert acc > (1 << 31) or not skew  # past int32
    bias = rng.integers(-acc // 4, acc // 4, 6).astype(np.int64)
    bq = (xs * ws, [0] * 6, 0) if per_channel else (float(xs * ws[0]), 0)
    ys = float(xs * ws.max() * acc / rng.uniform(8000, 40000))  # outputs over int16's range
    return ([Q(x, (xs, 0)), Q(w, wq, const=True), Q(bias, bq, const=True)], ys)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_16x8_fully_connected_past_int32_equals_litert(per_channel: bool) -> None:
    rng = np.random.default_rng(53)
    for depth, skew in ((4096, True), (2048, False), (16000, True)):
        inputs, ys = _case(rng, depth, per_channel, skew)
        want = check_quantized("FULLY_CONNECTED", inputs, {"fused_activation_function": "NONE"},
                               out_q=(ys, 0))
        inside = np.abs(want.astype(np.int32)) < 32767
        assert inside.mean() > 0.5 and np.abs(want[inside]).max() > 1000  # not saturated


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_16x8_convolution_past_int32_equals_litert(op: str) -> None:
    """LiteRT's 16x8 convolutions: int64 accumulator, int64 MultiplyByQuantizedMultiplier;
    same-signed full-range values over 7x7x64 (depthwise 47x47) taps pass int32."""
    rng = np.random.default_rng(8)
    for trial in range(2):
        c_in, c_out, k = (64, 4, 7) if op == "CONV_2D" else (4, 4, 47)
        x = np.abs(full_range(rng, (1, k + 2, k + 1, c_in), "int16").astype(np.int32))
        x = x.clip(0, 32767).astype(np.int16)
        wshape = (c_out, k, k, c_in) if op == "CONV_2D" else (1, k, k, c_out)
        w = np.abs(full_range(rng, wshape, "int8").astype(np.int32)).clip(0, 127)
        w[..., ::3] *= -1 if trial else 1
        axis = 0 if op == "CONV_2D" else 3
        xs, ws = float(rng.uniform(1e-4, 1e-3)), rng.uniform(0.002, 0.01, c_out)
        acc = 32767 * 127 * k * k * (c_in if op == "CONV_2D" else 1)
        assert acc > 1 << 31
        bias = rng.integers(-(1 << 33), 1 << 33, c_out).astype(np.int64)
        ys = float(xs * ws.max() * acc / 3 / 30000)
        options = {"padding": "VALID", "stride_h": 1, "stride_w": 1}
        if op == "DEPTHWISE_CONV_2D":
            options["depth_multiplier"] = 1
        want = check_quantized(op, [Q(x, (xs, 0)), Q(w.astype(np.int8), (ws, [0] * c_out, axis),
                                                     const=True),
                                    Q(bias, (xs * ws, [0] * c_out, 0), const=True)],
                               options, out_q=(ys, 0))
        inside = np.abs(want.astype(np.int32)) < 32767
        assert inside.mean() > 0.3 and np.abs(want[inside]).max() > 1000


def _double_reference(a: int, e: float) -> int:
    """C's ``(int32) round((double) a * e)`` from numpy's IEEE double product, with the
    module's saturation (|y| >= 2**20 as ±2**20, |p| >= 2**31 as INT32_MIN)."""
    p = float(np.float64(a) * np.float64(e))
    if abs(p) >= 2 ** 31:
        return -(1 << 31)
    whole = math.floor(abs(p))
    y = min(whole + (abs(p) - whole >= 0.5), 1 << 20)
    return -y if p < 0 else y


def test_double_requantization_equals_ieee_double() -> None:
    """``requantize_double`` against numpy's float64 product on accumulators up to 2**53
    (where the product's rounding to 53 bits decides: without that step, 29,061 of 12.6
    million values differ) and near-ties; LiteRT's kernels do not reach such sums."""
    import jax

    from circle_jax.ops.integer.double_requant import requantize_double, split_scale

    rng = np.random.default_rng(5)
    e = rng.uniform(0.5, 1, 16) * 2.0 ** rng.integers(-40, -2, 16)
    bits = rng.integers(0, 53, (4000, 1))
    a = rng.integers(-(1 << 62), 1 << 62, (4000, 16)) >> (62 - bits)
    k = rng.integers(-30000, 30000, (1000, 16))
    a[:1000] = np.round((k + 0.5) / e) + rng.integers(-1, 2, (1000, 16))
    a = np.clip(a, -(1 << 53) + 1, (1 << 53) - 1).astype(np.int64)
    u = a.view(np.uint64)
    hi = (u >> np.uint64(32)).astype(np.uint32)
    lo = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    got = np.asarray(jax.jit(requantize_double)(hi, lo, *split_scale(e)))
    want = np.vectorize(_double_reference)(a, e[None, :])
    np.testing.assert_array_equal(got, want)
