"""The fixed-point helpers of the integer kernels against Python's unbounded integers, on
random int32 values over the whole range and random multipliers and shifts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from circle_jax.ops.integer.fixed_point import (
    i64_add,
    i64_from_i32,
    i64_shl,
    mbqm,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_i64,
    multiply_by_quantized_multiplier_single,
    multiply_by_quantized_multiplier_wide,
    quantize_multiplier,
    quantize_multipliers,
    quantize_scale_ratio,
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


def test_int64_accumulator_rescaling() -> None:
    """64-bit values ``x * 2**16 + y`` (|v| < 2**47, LiteRT's int64 accumulator range) as
    uint32 word pairs, rescaled as LiteRT's int64 MultiplyByQuantizedMultiplier; ``x`` and
    ``y`` narrowed by ``r`` bits so that most results fit in int32 at each shift."""
    y = rng.integers(-2**31, 2**31, X.size)
    for shift in (-31, -24, -17, -16, -9, 0, 7):
        r = min(31, max(0, 17 + shift))
        x, low = X.astype(np.int64) >> r, y >> r
        v = i64_add(i64_shl(i64_from_i32(x.astype(np.int32)), 16),
                    i64_from_i32(low.astype(np.int32)))
        m = int(rng.integers(2**30, 2**31))
        m15 = (m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF
        want = [((int(a) * 2**16 + int(b)) * m15 + (1 << (14 - shift))) >> (15 - shift)
                for a, b in zip(x, low)]
        got = np.asarray(multiply_by_quantized_multiplier_i64(v, m, shift)).tolist()
        fits = [-2**31 <= w < 2**31 for w in want]
        assert sum(fits) > X.size // 2
        assert [g for g, f in zip(got, fits) if f] == [w for w, f in zip(want, fits) if f]


def test_python_int_primitives_match_the_traced_ones() -> None:
    """The table builders' Python-int rescaling equals the traced kernel's."""
    for _ in range(5):
        m, shift = int(rng.integers(2**30, 2**31)), int(rng.integers(-31, 1))
        traced = np.asarray(multiply_by_quantized_multiplier(X.astype(np.int32), m, shift))
        assert traced.tolist() == [mbqm(int(x), m, shift) for x in X]


def test_quantize_multiplier() -> None:
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    assert quantize_multiplier(1.0) == (1 << 30, 1)
    assert quantize_multiplier(1e-12) == (0, 0)  # below 2**-31: LiteRT's multiplier is 0
    m, shift = quantize_multiplier(0.3)
    assert abs(m * 2.0 ** (shift - 31) - 0.3) < 2**-31


def _exact_ties(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scales whose ratio ``a * b / c`` is exactly a half-point of the 31-bit multiplier
    (a 32-bit significand ending in 1, c a power of two): the roundings' ties."""
    a, b = [], []
    while len(a) < n:
        ma, mb = int(rng.integers(2**23, 2**24)), int(rng.integers(2**8, 2**9)) << 15
        p = ma * mb
        if p.bit_length() - ((p & -p).bit_length() - 1) == 32:
            a.append(ma * 2.0**-23)
            b.append(mb * 2.0**-40)
    c = rng.choice([1.0, 0.5, 2.0**-6], n)
    return (np.array(a, np.float32), np.array(b, np.float32), c.astype(np.float32))


def test_traced_scale_ratio_is_quantize_multiplier_of_the_double_ratio() -> None:
    """The traced (m, shift) of ``double(a) * double(b) / double(c)``, computed in 32-bit
    integers, equals the double computation bit for bit: random scales over 2**-20..2**4
    ratios and exact ties."""
    n = 20000
    a = (rng.uniform(0.5, 2, n) * 2.0 ** rng.integers(-12, 0, n)).astype(np.float32)
    b = (rng.uniform(0.5, 2, n) * 2.0 ** rng.integers(-14, -2, n)).astype(np.float32)
    c = (rng.uniform(0.5, 2, n) * 2.0 ** rng.integers(-10, 2, n)).astype(np.float32)
    ties = _exact_ties(200)
    a, b, c = (np.concatenate([u, v]) for u, v in zip((a, b, c), ties))
    m, shift = jax.jit(quantize_scale_ratio)(a, b, c)
    want_m, want_shift = quantize_multipliers(a.astype(np.float64) * b.astype(np.float64)
                                              / c.astype(np.float64))
    assert np.array_equal(np.asarray(m), want_m)
    assert np.array_equal(np.asarray(shift), want_shift)


def test_traced_multipliers_round_as_static_ones() -> None:
    """The rescalings given traced (m, shift), as a QAT step's re-quantized weights give
    them, equal the static ones (right and left shifts)."""
    x = X.astype(np.int32)[:500] >> 8
    for real in (3e-5, 0.4, 1.7):
        m, shift = quantize_multiplier(real)
        for fn, extra in ((multiply_by_quantized_multiplier, ("away",)),
                          (multiply_by_quantized_multiplier, ("up",)),
                          (multiply_by_quantized_multiplier_single, ()),
                          (multiply_by_quantized_multiplier_wide, ())):
            if shift > 0 and fn is not multiply_by_quantized_multiplier:
                continue  # LiteRT's 16-bit variants take multipliers below one
            traced = jax.jit(lambda v, mm, ss: fn(v, mm, ss, *extra))  # noqa: B023
            got = traced(x, jnp.int32(m), jnp.int32(shift))
            assert np.array_equal(np.asarray(got), np.asarray(fn(x, m, shift, *extra)))
