"""LiteRT's double-precision requantization of a 64-bit accumulator, exact under JAX's
default 32-bit mode.

LiteRT's 16x8 FULLY_CONNECTED with an int64 bias (or ``quantized_bias_type`` INT64) runs
its reference kernel: the accumulator ``acc`` is an int64, and the output is

    y = (int32) round((double) acc * ((double) s_x * (double) s_w[c] / (double) s_y))

(C's ``round``: ties away from zero), no fixed-point multiplier at all. Here the effective
scale ``e`` is computed in float64 on the host (static), split as ``e = M * 2**-S`` with a
53-bit integer ``M``, and the product is formed exactly on 16-bit limbs of ``|acc|``
(``|acc| < 2**53``, so ``(double) acc`` is exact): ``N = |acc| * M``, up to 106 bits.
Then the two roundings LiteRT makes are made on ``N``: to 53 significant bits, to nearest
with ties to even (the double product), and at bit ``S`` half up (``round`` of the
magnitude); the sign is put back. ``|y| >= 2**20`` comes back as ``±2**20`` (the caller
clamps to int16), and ``|p| >= 2**31`` (where the C cast is undefined; x86 gives
INT32_MIN) as INT32_MIN.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

Array = Any
_LIMBS = 8  # 16-bit limbs of the 128-bit product
_MASK = 0xFFFF


def split_scale(e: Any) -> tuple[np.ndarray, np.ndarray]:
    """(limbs [..., 4] of the 53-bit integer ``M``, ``S``) with ``e = M * 2**-S`` exactly,
    for positive finite float64 ``e``."""
    frac, exp = np.frexp(np.asarray(e, np.float64))
    m = np.round(np.ldexp(frac, 53)).astype(np.uint64)  # exact: frac has 53 bits
    limbs = np.stack([(m >> np.uint64(16 * i)) & np.uint64(_MASK) for i in range(4)], -1)
    return limbs.astype(np.uint32), (53 - exp).astype(np.int32)


def _magnitude_limbs(hi: Array, lo: Array) -> tuple[Array, Array]:
    """(sign, limbs [..., 4] of ``|v|``) of a 64-bit two's-complement (hi, lo) pair."""
    neg = (hi >> 31) == 1
    nlo = ~lo + jnp.uint32(1)
    nhi = ~hi + (nlo == 0).astype(jnp.uint32)
    hi, lo = jnp.where(neg, nhi, hi), jnp.where(neg, nlo, lo)
    return neg, jnp.stack([lo & _MASK, lo >> 16, hi & _MASK, hi >> 16], -1)


def _multiply(a: Array, b: np.ndarray) -> Array:
    """Limbs [..., 8] of the product of two 4-limb numbers (column sums below 2**20)."""
    b = jnp.asarray(b)
    prods = {(i, j): a[..., i] * b[..., j] for i in range(4) for j in range(4)}
    out, carry = [], jnp.zeros_like(a[..., 0])
    for c in range(_LIMBS):
        col = carry
        for (i, j), p in prods.items():
            if i + j == c:
                col = col + (p & _MASK)
            elif i + j == c - 1:
                col = col + (p >> 16)
        out.append(col & _MASK)
        carry = col >> 16
    return jnp.stack(out, -1)


def _shift_right(n: Array, s: Array) -> Array:
    """Limbs of ``floor(n / 2**s)`` for per-element ``0 <= s < 16 * _LIMBS``."""
    s = jnp.broadcast_to(jnp.asarray(s, jnp.int32), n.shape[:-1])
    pad = jnp.concatenate([n, jnp.zeros_like(n)], -1)
    k = jnp.arange(_LIMBS)
    word, bit = (s // 16)[..., None], _u32((s % 16)[..., None])
    shape = n.shape[:-1] + (_LIMBS,)
    first = jnp.take_along_axis(pad, jnp.broadcast_to(k + word, shape), -1)
    second = jnp.take_along_axis(pad, jnp.broadcast_to(k + word + 1, shape), -1)
    return ((first >> bit) | (second << (16 - bit))) & _MASK


def _bit(n: Array, t: Array) -> Array:
    """Bit ``t`` (per element, ``0 <= t < 128``) of ``n``, as uint32 0/1."""
    return _shift_right(n, t)[..., 0] & 1


def _any_below(n: Array, t: Array) -> Array:
    """Whether any bit of ``n`` below position ``t`` (per element) is set."""
    lo = 16 * jnp.arange(_LIMBS)
    keep = jnp.clip(t[..., None] - lo, 0, 16)
    mask = jnp.where(keep >= 16, jnp.uint32(_MASK), (jnp.uint32(1) << _u32(keep)) - 1)
    return jnp.any((n & mask) != 0, axis=-1)


def _u32(x: Array) -> Array:
    return jnp.asarray(x).astype(jnp.uint32)


def _add_small(n: Array, v: Array) -> Array:
    """``n + v`` for per-element ``v < 2**16`` (carry through the limbs)."""
    out, carry = [], jnp.asarray(v, jnp.uint32)
    for i in range(_LIMBS):
        col = n[..., i] + carry
        out.append(col & _MASK)
        carry = col >> 16
    return jnp.stack(out, -1)


def _bit_length(n: Array) -> Array:
    """The number of significant bits of ``n`` (0 for 0)."""
    lengths = jnp.where(n > 0, 32 - lax.clz(n).astype(jnp.int32) + 16 * jnp.arange(_LIMBS), 0)
    return jnp.max(lengths, axis=-1)


def requantize_double(hi: Array, lo: Array, m_limbs: np.ndarray, s: np.ndarray) -> Array:
    """``(int32) round((double) v * e)`` of the int64 ``v`` = (hi, lo) (``|v| < 2**53``)
    and ``e = M * 2**-s`` (:func:`split_scale`, broadcasting along the last axis): int32,
    with the module docstring's saturation."""
    neg, a = _magnitude_limbs(hi, lo)
    n = _multiply(a, m_limbs)
    length = _bit_length(n)
    s = jnp.broadcast_to(jnp.asarray(s), length.shape)
    # 1. to 53 significant bits, ties to even: q = RNE(n / 2**d)
    d = jnp.maximum(length - 53, 0)
    q = _shift_right(n, d)
    guard = (d > 0) & (_bit(n, jnp.maximum(d - 1, 0)) == 1)
    sticky = _any_below(n, jnp.maximum(d - 1, 0))
    up = guard & (sticky | ((q[..., 0] & 1) == 1))
    q = _add_small(q, up.astype(jnp.uint32))
    # 2. |y| = floor(q * 2**(d - s) + 1/2), with t = s - d > 32 whenever |y| < 2**20
    t = jnp.clip(s - d, 1, 16 * _LIMBS - 1)
    y = _shift_right(_add_small(_shift_right(q, t - 1), 1), 1)
    mag = (y[..., 0] | (y[..., 1] << 16)).astype(jnp.int32)
    magnitude = length - s  # |p| < 2**magnitude
    mag = jnp.where(magnitude > 20, jnp.int32(1 << 20), mag)
    out = jnp.where(neg, -mag, mag)
    return jnp.where(magnitude > 31, jnp.int32(-(1 << 31)), out)


__all__ = ["requantize_double", "split_scale"]
