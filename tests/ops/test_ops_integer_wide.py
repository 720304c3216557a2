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
