"""Fixed-point arithmetic of LiteRT's integer kernels, exact under JAX's default 32-bit mode.

A real multiplier ``r`` (a ratio of scales) is stored as an int32 fraction ``m`` in
[2**30, 2**31) and a power-of-two exponent ``shift``: ``r ~= m * 2**(shift - 31)``
(:func:`quantize_multiplier`: ``m = round(frac * 2**31)`` half away from zero, with
``frac`` in [0.5, 1) from ``frexp``; an ``m`` of 2**31 becomes 2**30 with ``shift + 1``; a
shift below -31 gives the multiplier 0).

``x * r`` on an int32 ``x`` (:func:`multiply_by_quantized_multiplier`) is computed in two
roundings, as LiteRT's default build does:

1. ``x * 2**max(shift, 0)`` (int32), then the *saturating rounding doubling high multiply*
   with ``m``: ``(x * m + nudge) / 2**31`` over 64 bits, truncated toward zero, with
   ``nudge = 2**30`` for a non-negative product and ``1 - 2**30`` for a negative one (round
   to nearest, ties away from zero);
2. a *rounding divide by a power of two* of ``max(-shift, 0)`` bits: round to nearest, ties
   away from zero (LiteRT's own kernels) or toward +infinity (the GEMMs LiteRT hands to ruy,
   whose x86 kernels shift so: measured, 1 output in a few hundred differs otherwise).

JAX without ``jax_enable_x64`` has no int64, so the 64-bit product of step 1 is formed from
16-bit halves in uint32 arithmetic (:func:`rounding_doubling_high_mul`): every value is
exact, nothing is approximated in floating point.

The int16 kernels with 64-bit accumulators (16x8 convolutions and fully connected layers)
use LiteRT's int64 variant (:func:`multiply_by_quantized_multiplier_wide`): the multiplier is
first reduced to 15 bits, ``(m + 2**15) >> 16`` (``0x7FFF`` from ``0x7FFF0000`` up), and
``x * m15`` is shifted right by ``15 - shift`` with round half up. An int16 BATCH_MATMUL's
accumulator exceeds int32: it is kept as a 64-bit two's-complement pair of uint32 words
(:func:`i64_from_i32`, :func:`i64_add`, :func:`i64_mul`) and rescaled by
:func:`multiply_by_quantized_multiplier_i64`.

The same primitives on Python ints (:func:`srdhm`, :func:`rdbpot`, :func:`mbqm`, ...) build
the tables of kernels whose output is a function of one 8-bit input (RSQRT, HARD_SWISH).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

Array = Any

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


# ----------------------------------------------------------------------------- static side


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(m, shift) with ``real ~= m * 2**(shift - 31)``, m in [2**30, 2**31) (0 for 0)."""
    if real == 0.0:
        return 0, 0
    frac, shift = math.frexp(real)
    m = int(math.floor(abs(frac) * (1 << 31) + 0.5)) * (1 if frac > 0 else -1)
    if abs(m) == 1 << 31:
        m //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return m, shift


def quantize_multipliers(reals: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_multiplier` of every value: (int64 m, int64 shift) arrays."""
    pairs = [quantize_multiplier(float(r)) for r in np.asarray(reals, np.float64).ravel()]
    m = np.array([p[0] for p in pairs], np.int64).reshape(np.shape(reals))
    s = np.array([p[1] for p in pairs], np.int64).reshape(np.shape(reals))
    return m, s


def quantize_multiplier_smaller_than_one(real: float) -> tuple[int, int]:
    """:func:`quantize_multiplier` of a ratio in (0, 1): the exponent is <= 0."""
    m, shift = quantize_multiplier(real)
    if shift > 0:
        raise ValueError(f"multiplier {real} is not smaller than one")
    return m, shift


def reduced_multiplier(m: Any) -> np.ndarray:
    """LiteRT's 15-bit multiplier of its int64-input rescaling: ``(m + 2**15) >> 16``,
    ``0x7FFF`` from ``0x7FFF0000`` up."""
    m = np.asarray(m, np.int64)
    return np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF).astype(np.int32)


# ----------------------------------------------------------------------------- static side: values
# LiteRT's fixed-point primitives on Python ints of a ``bits``-wide signed type, for the kernels
# whose output depends on one 8-bit input value only: they build a table of every input.


def _trunc_div(a: int, d: int) -> int:
    """C's integer division (toward zero) by a positive ``d``."""
    q = abs(a) // d
    return q if a >= 0 else -q


def wrap(x: int, bits: int = 32) -> int:
    """``x`` converted to a ``bits``-wide signed type (two's complement wrap)."""
    half = 1 << (bits - 1)
    return (x + half) % (1 << bits) - half


def srdhm(a: int, b: int, bits: int = 32) -> int:
    """SaturatingRoundingDoublingHighMul: ``round(a * b / 2**(bits-1))``, ties away from
    zero, saturating the one overflowing case (both operands the type's minimum)."""
    lo = -(1 << (bits - 1))
    if a == b == lo:
        return -lo - 1
    ab = a * b
    nudge = (1 << (bits - 2)) if ab >= 0 else 1 - (1 << (bits - 2))
    return _trunc_div(ab + nudge, 1 << (bits - 1))


def sdhm(a: int, b: int, bits: int = 16) -> int:
    """SaturatingDoublingHighMul: ``a * b / 2**(bits-1)`` truncated toward zero."""
    lo = -(1 << (bits - 1))
    return -lo - 1 if a == b == lo else _trunc_div(a * b, 1 << (bits - 1))


def rdbpot(x: int, exponent: int) -> int:
    """RoundingDivideByPOT: ``round(x / 2**exponent)``, ties away from zero."""
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if (x & mask) > threshold else 0)


def saturating_shl(x: int, exponent: int, bits: int = 32) -> int:
    """``x * 2**exponent`` clamped to the ``bits``-wide type."""
    half = 1 << (bits - 1)
    return min(max(x * (1 << exponent), -half), half - 1)


def gemmlowp_shl(x: int, exponent: int) -> int:
    """gemmlowp's SaturatingRoundingMultiplyByPOT<exponent> on int32 (exponent > 0): the
    type's limit once ``|x| > 2**(31-exponent) - 1``, else ``x << exponent``."""
    threshold = (1 << (31 - exponent)) - 1
    if x > threshold:
        return INT32_MAX
    if x < -threshold:
        return INT32_MIN
    return x << exponent


def mbqm(x: int, m: int, shift: int) -> int:
    """:func:`multiply_by_quantized_multiplier` on one int32 value (ties away from zero)."""
    return rdbpot(srdhm(wrap(x * (1 << max(shift, 0))), m), max(-shift, 0))


# ----------------------------------------------------------------------------- traced side

def quantize_scale_ratio(a: Array, b: Array, c: Array) -> tuple[Array, Array]:
    """:func:`quantize_multiplier` of ``double(a) * double(b) / double(c)`` for traced
    float32 scales (normal, positive; a weight scale re-quantized inside a training step),
    as int32 (m, shift) arrays, exactly: no float64 under JAX's 32-bit mode.

    With ``a = ma * 2**ea`` (24-bit integer ``ma``) and likewise ``b``, ``c``, the ratio is
    ``ma * mb / mc * 2**(ea + eb - ec)``. The long division ``floor(ma * mb * 2**32 / mc)``
    (bytes of the 80-bit dividend, remainders below 2**24) gives the 54 leading bits ``Q``
    of the ratio, ``X = Q / 2**23`` in [2**30, 2**31). Rounding the ratio to double (to
    nearest even, 53 bits) and then ``frac * 2**31`` half away from zero (LiteRT's two
    roundings) rounds up exactly when ``X >= n + 1/2 - 2**-23`` (the double that lies half
    an ulp below a half-point is rounded onto it): ``m = floor((Q + 2**22 + 1) / 2**23)``.
    """
    def split(s: Array) -> tuple[Array, Array]:
        bits = lax.bitcast_convert_type(jnp.asarray(s, jnp.float32), jnp.uint32)
        exp = (bits >> 23).astype(jnp.int32) - 150
        return (bits & jnp.uint32(0x7FFFFF)) | jnp.uint32(0x800000), exp

    (ma, ea), (mb, eb), (mc, ec) = split(a), split(b), split(c)
    ma, mb, mc = jnp.broadcast_arrays(ma, mb, mc)
    p_hi, p_lo = _mul_u64(ma, mb)  # < 2**48
    digits = [p_hi >> 8, p_hi & 0xFF, p_lo >> 24, (p_lo >> 16) & 0xFF, (p_lo >> 8) & 0xFF,
              p_lo & 0xFF] + [jnp.zeros_like(p_lo)] * 4
    rem = hi = lo = jnp.zeros_like(p_lo)
    for d in digits:  # quotient < 2**57: (hi, lo) never overflows
        cur = (rem << 8) | d
        q = cur // mc
        rem = cur - q * mc
        hi, lo = (hi << 8) | (lo >> 24), (lo << 8) | q
    top = 63 - lax.clz(hi).astype(jnp.int32)  # the leading bit: 54, 55 or 56
    j = _u32(top - 53)
    q_lo, q_hi = (lo >> j) | (hi << (32 - j)), hi >> j  # Q in [2**53, 2**54)
    q_hi, q_lo = _add_u64(q_hi, q_lo, jnp.uint32(0), jnp.uint32((1 << 22) + 1))
    m = ((q_hi << 9) | (q_lo >> 23)).astype(jnp.int32)  # may be 2**31: wraps negative
    shift = top - 31 + (ea + eb - ec)
    carry = m == jnp.int32(INT32_MIN)
    m = jnp.where(carry, jnp.int32(1 << 30), m)
    shift = shift + carry.astype(jnp.int32)
    small = shift < -31
    return jnp.where(small, 0, m), jnp.where(small, 0, shift)




def _u32(x: Array) -> Array:
    return jnp.asarray(x).astype(jnp.uint32)


def _mul_u64(mag: Array, m: Array) -> tuple[Array, Array]:
    """The 64-bit product of two uint32 values as (high, low) uint32 words, from 16-bit
    halves (every partial product fits in 32 bits)."""
    mask = jnp.uint32(0xFFFF)
    al, ah = mag & mask, mag >> 16
    ml, mh = m & mask, m >> 16
    ll, lh, hl, hh = al * ml, al * mh, ah * ml, ah * mh
    mid = (ll >> 16) + (lh & mask) + (hl & mask)
    lo = (ll & mask) | (mid << 16)
    hi = hh + (lh >> 16) + (hl >> 16) + (mid >> 16)
    return hi, lo


def _add_u64(hi: Array, lo: Array, add_hi: Array, add_lo: Array) -> tuple[Array, Array]:
    lo2 = lo + add_lo
    return hi + add_hi + (lo2 < lo).astype(jnp.uint32), lo2


def rounding_doubling_high_mul(a: Array, m: Array) -> Array:
    """``round(a * m / 2**31)`` (int32 ``a``, non-negative int32 ``m``; ties away from zero,
    LiteRT's SaturatingRoundingDoublingHighMul; no saturation case since m >= 0)."""
    a = jnp.asarray(a, jnp.int32)
    neg = a < 0
    mag = _u32(jnp.where(neg, -a, a))  # |INT32_MIN| = 2**31 fits in uint32
    hi, lo = _mul_u64(mag, _u32(m))
    nudge = jnp.where(neg, jnp.uint32((1 << 30) - 1), jnp.uint32(1 << 30))
    hi, lo = _add_u64(hi, lo, jnp.uint32(0), nudge)
    q = ((hi << 1) | (lo >> 31)).astype(jnp.int32)  # < 2**31: |a| <= 2**31, m < 2**31
    return jnp.where(neg, -q, q)


def multiply_by_quantized_multiplier_single(x: Array, m: Any, shift: Any) -> Array:
    """``x * m * 2**(shift - 31)`` rounded once, to nearest with ties toward +infinity:
    ``(x * m + 2**(t-1)) >> t`` over 64 bits with ``t = 31 - shift`` (LiteRT's 16x8
    FULLY_CONNECTED). Exact: the 62-bit product is formed from 16-bit halves. ``m`` and
    ``shift`` static or traced."""
    if _static(m, shift):
        t = 31 - np.asarray(shift, np.int64)
        if np.any(t < 1) or np.any(t > 62):
            raise ValueError(f"shift {shift} is out of range")
    t = jnp.clip(31 - jnp.asarray(shift, jnp.int32), 1, 62)
    x = jnp.asarray(x, jnp.int32)
    neg = x < 0
    m = np.asarray(m, np.int64).astype(np.uint32) if _static(m) else m
    hi, lo = _mul_u64(_u32(jnp.where(neg, -x, x)), _u32(m))
    # floor((x*m + 2**(t-1)) / 2**t) = sign * floor((|x|*m + 2**(t-1) - [x<0]) / 2**t)
    e = t - 1  # 2**e as (hi, lo) words, and 2**e - 1
    low = e < 32
    n_hi = jnp.where(low, jnp.uint32(0), jnp.uint32(1) << _u32(jnp.clip(e - 32, 0, 31)))
    n_lo = jnp.where(low, jnp.uint32(1) << _u32(jnp.clip(e, 0, 31)), jnp.uint32(0))
    m_hi = jnp.where(low, jnp.uint32(0), n_hi - 1)
    m_lo = jnp.where(low, n_lo - 1, jnp.uint32(0xFFFFFFFF))
    hi, lo = _add_u64(hi, lo, jnp.where(neg, m_hi, n_hi), jnp.where(neg, m_lo, n_lo))
    low_part = (hi << _u32(jnp.clip(32 - t, 0, 31))) | (lo >> _u32(jnp.clip(t, 0, 31)))
    q = jnp.where(t >= 32, hi >> _u32(jnp.clip(t - 32, 0, 31)), low_part).astype(jnp.int32)
    return jnp.where(neg, -q, q)


def rounding_divide_by_pot(x: Array, exponent: Array) -> Array:
    """``round(x / 2**exponent)``, ties away from zero (int32, exponent in [0, 31])."""
    x = jnp.asarray(x, jnp.int32)
    e = jnp.asarray(exponent, jnp.int32)
    mask = (jnp.int32(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(jnp.int32)
    return (x >> e) + (remainder > threshold).astype(jnp.int32)


def rounding_divide_by_pot_up(x: Array, exponent: Array) -> Array:
    """``round(x / 2**exponent)``, ties toward +infinity (ruy's rounding right shift),
    without forming ``x + 2**(exponent - 1)`` (no overflow)."""
    x = jnp.asarray(x, jnp.int32)
    e = jnp.asarray(exponent, jnp.int32)
    half = (x >> jnp.maximum(e - 1, 0)) & 1
    return (x >> e) + jnp.where(e > 0, half, 0)


def _static(*values: Any) -> bool:
    """Whether every value is a Python or numpy number (not traced)."""
    return all(isinstance(v, (int, np.integer, np.ndarray)) for v in values)


def multiply_by_quantized_multiplier(x: Array, m: Any, shift: Any, ties: str = "away"
                                     ) -> Array:
    """``x * m * 2**(shift - 31)`` with LiteRT's two roundings (int32 ``x``; ``m`` and
    ``shift`` static ints or arrays, or traced int32 arrays, broadcasting against ``x``).
    ``ties="up"``: the final shift rounds ties toward +infinity, as ruy's x86 kernels do
    (LiteRT's GEMM-based kernels, see ``conv.py``)."""
    x = jnp.asarray(x, jnp.int32)
    divide = rounding_divide_by_pot_up if ties == "up" else rounding_divide_by_pot
    if not _static(m, shift):
        shift = jnp.asarray(shift, jnp.int32)
        x = x * (jnp.int32(1) << jnp.maximum(shift, 0))
        return divide(rounding_doubling_high_mul(x, _u32(m)), jnp.maximum(-shift, 0))
    m = np.asarray(m, np.int64)
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0).astype(np.int32)
    right = np.maximum(-shift, 0).astype(np.int32)
    if np.any(left):
        x = x * (jnp.int32(1) << jnp.asarray(left))
    y = rounding_doubling_high_mul(x, m.astype(np.uint32))
    if not np.any(right):
        return y
    return divide(y, right)


def multiply_by_quantized_multiplier_wide(x: Array, m: Any, shift: Any) -> Array:
    """LiteRT's int64-input variant on an int32 ``x``: ``(x * m15 + 2**(t-1)) >> t`` with
    ``m15`` the 15-bit multiplier and ``t = 15 - shift`` (round half up). Exact: the 47-bit
    product is formed from 16-bit halves of ``x``. ``m`` and ``shift`` static or traced."""
    if _static(m, shift):
        m15 = reduced_multiplier(m)
        total = (15 - np.asarray(shift, np.int64)).astype(np.int32)
        if np.any(total < 1) or np.any(total > 46):
            raise ValueError(f"shift {shift} is out of LiteRT's range for 16-bit kernels")
    else:
        m = jnp.asarray(m, jnp.int32)  # in [0, 2**31): (m + 2**15) >> 16 without overflow
        m15 = jnp.where(m < 0x7FFF0000, (m >> 16) + ((m >> 15) & 1), 0x7FFF)
        total = jnp.clip(15 - jnp.asarray(shift, jnp.int32), 1, 46)
    x = jnp.asarray(x, jnp.int32)
    # x * m15 = xh * m15 * 2**16 + xl * m15, with xl in [0, 2**16) and |xh| < 2**15
    xh, xl = x >> 16, x & 0xFFFF
    a = xh * jnp.asarray(m15)           # < 2**30 in magnitude
    b = xl * jnp.asarray(m15)           # in [0, 2**31)
    # (a * 2**16 + b + 2**(t-1)) >> t, without forming the 47-bit sum: split b's low 16 bits
    b_hi, b_lo = b >> 16, b & 0xFFFF
    high = a + b_hi                      # the value's bits from 16 up, b_lo below
    return _shift_round_half_up(high, b_lo, jnp.asarray(total))


def _shift_round_half_up(high: Array, low16: Array, t: Array) -> Array:
    """``(high * 2**16 + low16 + 2**(t-1)) >> t`` for int32 ``high``, ``low16`` in
    [0, 2**16), 1 <= t <= 46 (arithmetic shift: floor)."""
    # Split by whether the rounding bit lies in the low 16 bits.
    t = jnp.broadcast_to(t, jnp.broadcast_shapes(jnp.shape(high), jnp.shape(t)))
    small = t <= 16
    # t <= 16: value = high * 2**16 + low16 + 2**(t-1); floor-divide by 2**t
    ts = jnp.clip(t, 1, 16)
    low_sum = low16 + (jnp.int32(1) << (ts - 1))          # < 2**17
    carry = low_sum >> 16
    part = (high + carry) * (jnp.int32(1) << (16 - ts)) + ((low_sum & 0xFFFF) >> ts)
    # t > 16: add 2**(t-17) to high, floor-divide by 2**(t-16); low16 never carries
    tb = jnp.clip(t - 16, 1, 30)
    big = (high + (jnp.int32(1) << (tb - 1))) >> tb
    return jnp.where(small, part, big)


# 64-bit two's-complement integers as (high, low) uint32 words, for LiteRT's int64
# accumulators (JAX's default mode has no int64).


def i64_from_i32(x: Array) -> tuple[Array, Array]:
    """An int32 array sign-extended to 64 bits."""
    x = jnp.asarray(x, jnp.int32)
    return (lax.bitcast_convert_type(x >> 31, jnp.uint32),
            lax.bitcast_convert_type(x, jnp.uint32))


def i64_shl(v: tuple[Array, Array], s: int) -> tuple[Array, Array]:
    """``v * 2**s`` (static 0 <= s < 32; the value must stay within 64 bits)."""
    hi, lo = v
    if s == 0:
        return hi, lo
    return (hi << s) | (lo >> (32 - s)), lo << s


def i64_add(a: tuple[Array, Array], b: tuple[Array, Array]) -> tuple[Array, Array]:
    return _add_u64(*a, *b)


def i64_mul(v: tuple[Array, Array], m: int) -> tuple[Array, Array]:
    """``v * m`` for a static ``0 <= m < 2**32`` (modulo 2**64: exact while the product fits
    in 64 bits)."""
    hi, lo = v
    ph, pl = _mul_u64(lo, jnp.uint32(m))
    return hi * jnp.uint32(m) + ph, pl


def i64_round_shift(v: tuple[Array, Array], t: int) -> Array:
    """``(v + 2**(t-1)) >> t`` (arithmetic shift, static 1 <= t <= 62) as int32, for a result
    that fits in int32."""
    half = 1 << (t - 1)
    hi, lo = _add_u64(*v, jnp.uint32(half >> 32), jnp.uint32(half & 0xFFFFFFFF))
    if t < 32:
        return lax.bitcast_convert_type((lo >> t) | (hi << (32 - t)), jnp.int32)
    return lax.bitcast_convert_type(hi, jnp.int32) >> (t - 32)


def multiply_by_quantized_multiplier_i64(v: tuple[Array, Array], m: int, shift: int) -> Array:
    """LiteRT's int64-input MultiplyByQuantizedMultiplier (:func:`reduced_multiplier`, then
    ``(v * m15 + 2**(t-1)) >> t`` with ``t = 15 - shift``) on a 64-bit ``v``."""
    t = 15 - shift
    if not 1 <= t <= 62:
        raise ValueError(f"shift {shift} is out of LiteRT's range for 64-bit accumulators")
    return i64_round_shift(i64_mul(v, int(reduced_multiplier(m))), t)


def saturate(x: Array, lo: int, hi: int, dtype: Any) -> Array:
    """Clamp int32 ``x`` to [lo, hi] and narrow it to ``dtype``."""
    return jnp.clip(x, lo, hi).astype(dtype)


_NAN_PAYLOAD = 0x7FC0DEAD  # a quiet NaN no computation here produces


def rounded_product(a: Array, b: Any) -> Array:
    """``a * b`` in float32, rounded before whatever is added to it next.

    XLA's CPU compiler contracts ``a * b + c`` into one fused multiply-add (a single
    rounding; measured: 501 * (0.05 / 0.9) - 21.333336 gives 6.4999995 instead of LiteRT's
    6.5), and removes optimization barriers and float identities before it does. LiteRT's
    kernels round the product first. Here the product passes through its int32 bit pattern
    and a select no compiler can drop (one NaN payload maps to the canonical NaN), so no
    multiply feeds the add.
    """
    p = jnp.asarray(a, jnp.float32) * jnp.asarray(b, jnp.float32)
    bits = lax.bitcast_convert_type(p, jnp.int32)
    bits = jnp.where(bits == jnp.int32(_NAN_PAYLOAD), jnp.int32(0x7FC00000), bits)
    return lax.bitcast_convert_type(bits, jnp.float32)
