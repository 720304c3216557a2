"""The fixed-point helpers of the integer kernels against Python's unbounded integers, on
random int32 values over the whole range and random multipliers and shifts."""

from __future__ import annotations

import numpy as np
import pytest

from circle_jax.ops.integer.fixed_point import (
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_single,
    multiply_by_quantized_multiplier_wide,
    quantize_multiplier,
    rounding_doubling_high_mul,
)

rng = np.random.default_rng(31)
X = np.concatenate([rng.integers(-2**31, 2**31, 2000), [-2**31, 2**31 - 1, 0, 1, -1]])


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


def _high_mul(a: int, m: int) -> int:
    p = a * m
    return _trunc_div(p + (1 << 30) if p >= 0 else p + 1 - (1 << 30), 1 << 31)


def _divide_pot(x: int, e: int, ties: str) -> int:
    if e == 0:
        return x
    if ties == "up":
        return (x + (1 << (e - 1))) >> e
    mask = (1 << e) - 1
    return (x >> e) + ((x & mask) > ((mask >> 1) + (x < 0)))


@pytest.mark.parametrize("ties", ["away", "up"])
def test_two_roundings(ties: str) -> None:
    for _ in range(10):
        m, shift = int(rng.integers(2**30, 2**31)), int(rng.integers(-31, 1))
        got = np.asarray(multiply_by_quantized_multiplier(X.astype(np.int32), m, shift, ties))
        want = [_divide_pot(_high_mul(int(x), m), -shift, ties) for x in X]
        assert got.tolist() == want


def test_doubling_high_mul() -> None:
    m = int(rng.integers(2**30, 2**31))
    got = np.asarray(rounding_doubling_high_mul(X.astype(np.int32), np.uint32(m)))
    assert got.tolist() == [_high_mul(int(x), m) for x in X]


def test_single_and_wide_roundings() -> None:
    for _ in range(10):
        m, shift = int(rng.integers(2**30, 2**31)), int(rng.integers(-31, 1))
        t = 31 - shift
        want = [(int(x) * m + (1 << (t - 1))) >> t for x in X]
        got = np.asarray(multiply_by_quantized_multiplier_single(X.astype(np.int32), m, shift))
        assert got.tolist() == want
        m15 = (m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF
        w = [(int(x) * m15 + (1 << (14 - shift))) >> (15 - shift) for x in X]
        fits = [-2**31 <= v < 2**31 for v in w]
        got = np.asarray(multiply_by_quantized_multiplier_wide(X.astype(np.int32), m, shift))
        assert [g for g, f in zip(got.tolist(), fits) if f] == [v for v, f in zip(w, fits) if f]


def test_quantize_multiplier() -> None:
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    assert quantize_multiplier(1.0) == (1 << 30, 1)
    assert quantize_multiplier(1e-12) == (0, 0)  # below 2**-31: LiteRT's multiplier is 0
    m, shift = quantize_multiplier(0.3)
    assert abs(m * 2.0 ** (shift - 31) - 0.3) < 2**-31
