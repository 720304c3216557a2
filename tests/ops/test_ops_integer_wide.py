"""16x8 FULLY_CONNECTED whose accumulator exceeds int32 (int16 activations, int8 weights,
int64 bias): LiteRT's reference kernel accumulates in int64 and rescales in double
(``circle_jax.ops.integer.double_requant``); circle-jax equals it bit for bit
(``array_equal``) on random large-depth cases with full-range values, output scales that
put the sums over int16's range (some saturate), per-channel and per-tensor weights."""

from __future__ import annotations

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
    for depth, skew in ((4096, True), (2048, False), (30000, True)):
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
