"""Integer kernels of element-wise arithmetic: ADD, SUB, MUL, SQUARED_DIFFERENCE, RSQRT,
SOFTMAX (the activations are in :mod:`.activations`).

LiteRT's rules (scales are the tensors' float32 values; ``x'`` is ``x - x_zp``):

- ADD / SUB: both inputs are brought to a common scale with ``L`` guard bits (L = 20 for
  8-bit types, 15 for int16): ``a = MBQM(x1' * 2**L, M1)``, ``b = MBQM(x2' * 2**L, M2)``,
  ``out = MBQM(a +/- b, Mo) + y_zp`` with ``M1 = s1 / (2 max(s1, s2))``,
  ``M2 = s2 / (2 max(s1, s2))``, ``Mo = 2 max(s1, s2) / (2**L s_out)``; then the fused
  activation's clamp. int16 needs zero points 0 (LiteRT's power-of-two int16 path, taken when
  ``pot_scale_int16`` is set and every scale is a power of two, is refused).
- MUL: ``out = MBQM(x1' * x2', s1 s2 / s_out) + y_zp`` (the ratio in float32, as LiteRT's
  Prepare computes it), then the clamp.
- SQUARED_DIFFERENCE (int8 only, as LiteRT): as ADD with L = 7, the difference squared:
  ``out = MBQM((a - b)**2, (2 max(s1, s2))**2 / (2**14 s_out)) + y_zp``; LiteRT aborts when
  that multiplier is not below one (refused at load).
- RSQRT (int8): a table over every input value of LiteRT's fixed-point ``1 / sqrt(x')``
  (:func:`inv_sqrt_multiplier`, Newton's method) rescaled by ``1 / (sqrt(s_in) s_out)``;
  ``x' = 0`` gives the type's maximum. (int16, zero points 0): LiteRT's interpolated
  513-entry table of ``1 / sqrt`` built in float32 (:func:`~.tables.lut16`). LiteRT stops
  with an error on an input below the zero point (a negative real); circle-jax gives the
  type's maximum there (int16: the table's value, ``32767 s_out`` rounded).
- SOFTMAX (int8, uint8 input): LiteRT's optimized kernel, in float32: a table
  ``T[d] = exp(-s_in * beta * d)`` for d = max - q in [0, 255], the row sum accumulated in
  order, ``p = T[d] * (1 / (sum * s_out))``, int8 output ``round(p) + zp`` (ties away from
  zero), uint8 output ``trunc(p + 0.5)``, clamped.
- SOFTMAX (int16, zero points 0, output scale 1/32768): fixed point with two interpolated
  513-entry tables (:func:`~.tables.lut16`, :func:`~.tables.lut16_lookup`):
  ``e = exp_table(clamp(MBQM(q - max, s_in beta / (10 / 65535)) + 32767))`` (inputs spanning
  [-10, 0]), the int32 row sum normalised to its leading bit,
  ``r = one_over_one_plus_x_table(...)`` and ``out = clamp((e * r + 2**(k-1)) >> k, 0, 32767)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..registry import OpContext, register
from .fixed_point import (
    INT32_MAX,
    gemmlowp_shl,
    mbqm,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    quantize_multiplier_smaller_than_one,
    rdbpot,
    rounded_product,
    saturate,
    srdhm,
    wrap,
)
from .params import (
    QParams,
    activation_range,
    as_int32,
    qparams,
    same_type_params,
)
from .tables import lut16, lut16_lookup

Array = Any


# ----------------------------------------------------------------------------- ADD / SUB


def _is_pot(scale: float) -> bool:
    frac, _ = np.frexp(np.float64(scale))
    return frac == 0.5


def check_add_sub(ctx: OpContext) -> None:
    """Inputs and output of one quantized type, per tensor; int16 with zero points 0 and not
    LiteRT's power-of-two path."""
    a = qparams(ctx, "input", 0)
    b = qparams(ctx, "input", 1, dtypes=(a.dtype,))
    y = qparams(ctx, "output", 0, dtypes=(a.dtype,))
    if a.dtype == "int16":
        if a.zp or b.zp or y.zp:
            raise ValueError("int16 ADD/SUB need zero points 0")
        pot = ctx.options.get("pot_scale_int16", True)
        if pot and all(_is_pot(q.s) for q in (a, b, y)):
            raise NotImplementedError("int16 ADD/SUB with power-of-two scales and "
                                      "pot_scale_int16 (LiteRT's LSTM path) is not supported")


def _add_sub(ctx: OpContext, x1: Array, x2: Array, sign: int) -> Array:
    a, b, y = qparams(ctx, "input", 0), qparams(ctx, "input", 1), qparams(ctx, "output", 0)
    left = 15 if a.dtype == "int16" else 20
    twice_max = 2.0 * np.float64(max(np.float32(a.s), np.float32(b.s)))
    m1 = quantize_multiplier(np.float64(a.s) / twice_max)
    m2 = quantize_multiplier(np.float64(b.s) / twice_max)
    mo = quantize_multiplier(twice_max / np.float64(np.float32(1 << left) * np.float32(y.s)))
    s1 = multiply_by_quantized_multiplier((as_int32(x1) - a.zp) * (1 << left), *m1)
    s2 = multiply_by_quantized_multiplier((as_int32(x2) - b.zp) * (1 << left), *m2)
    out = multiply_by_quantized_multiplier(s1 + sign * s2, *mo) + y.zp
    lo, hi = activation_range(ctx.options.fused_activation_function, y)
    return saturate(out, lo, hi, y.np_dtype)


@register("ADD", check=check_add_sub, integer=True)
def add(ctx: OpContext, x1: Array, x2: Array) -> Array:
    """Integer ADD (broadcasting)."""
    return _add_sub(ctx, x1, x2, 1)


@register("SUB", check=check_add_sub, integer=True)
def sub(ctx: OpContext, x1: Array, x2: Array) -> Array:
    """Integer SUB (broadcasting)."""
    return _add_sub(ctx, x1, x2, -1)


# ----------------------------------------------------------------------------- MUL


def check_mul(ctx: OpContext) -> None:
    a = qparams(ctx, "input", 0)
    qparams(ctx, "input", 1, dtypes=(a.dtype,))
    y = qparams(ctx, "output", 0, dtypes=(a.dtype,))
    if a.dtype == "int16" and (a.zp or y.zp):
        raise ValueError("int16 MUL needs zero points 0")


@register("MUL", check=check_mul, integer=True)
def mul(ctx: OpContext, x1: Array, x2: Array) -> Array:
    """Integer MUL (broadcasting)."""
    a, b, y = qparams(ctx, "input", 0), qparams(ctx, "input", 1), qparams(ctx, "output", 0)
    m = quantize_multiplier(float(np.float32(a.s) * np.float32(b.s) / np.float32(y.s)))
    prod = (as_int32(x1) - a.zp) * (as_int32(x2) - b.zp)
    out = multiply_by_quantized_multiplier(prod, *m) + y.zp
    lo, hi = activation_range(ctx.options.fused_activation_function, y)
    return saturate(out, lo, hi, y.np_dtype)


# ----------------------------------------------------------------------------- SQUARED_DIFFERENCE


def _squared_difference_multipliers(a: QParams, b: QParams, y: QParams
                                    ) -> tuple[tuple[int, int], ...]:
    twice_max = np.float64(2 * max(np.float32(a.s), np.float32(b.s)))
    out = twice_max * twice_max / np.float64(np.float32(1 << 14) * np.float32(y.s))
    if not out < 1.0:
        raise ValueError(f"int8 SQUARED_DIFFERENCE needs output scale above "
                         f"4 max(s1, s2)**2 / 2**14 = {float(out * y.s):.6g}, got {y.s} "
                         "(LiteRT aborts otherwise)")
    return tuple(quantize_multiplier_smaller_than_one(float(r))
                 for r in (np.float64(a.s) / twice_max, np.float64(b.s) / twice_max, out))


def check_squared_difference(ctx: OpContext) -> None:
    """int8 inputs and output (LiteRT has no uint8 / int16 kernel), output multiplier below
    one."""
    a = qparams(ctx, "input", 0, dtypes=("int8",))
    b = qparams(ctx, "input", 1, dtypes=("int8",))
    _squared_difference_multipliers(a, b, qparams(ctx, "output", 0, dtypes=("int8",)))


@register("SQUARED_DIFFERENCE", check=check_squared_difference, integer=True)
def squared_difference(ctx: OpContext, x1: Array, x2: Array) -> Array:
    """Integer (x1 - x2)**2 (broadcasting): both inputs on a common scale with 7 guard bits,
    the difference squared in int32, rescaled to the output."""
    a, b, y = qparams(ctx, "input", 0), qparams(ctx, "input", 1), qparams(ctx, "output", 0)
    m1, m2, mo = _squared_difference_multipliers(a, b, y)
    s1 = multiply_by_quantized_multiplier((as_int32(x1) - a.zp) * (1 << 7), *m1)
    s2 = multiply_by_quantized_multiplier((as_int32(x2) - b.zp) * (1 << 7), *m2)
    d = s1 - s2                                   # |d| < 2**15: d * d fits in int32
    out = multiply_by_quantized_multiplier(d * d, *mo) + y.zp
    return saturate(out, y.qmin, y.qmax, y.np_dtype)


# ----------------------------------------------------------------------------- RSQRT


def check_rsqrt(ctx: OpContext) -> None:
    x, y = same_type_params(ctx, ("int8", "int16"))
    if x.dtype == "int16" and (x.zp or y.zp):
        raise ValueError("int16 RSQRT needs zero points 0")


def inv_sqrt_multiplier(v: int) -> tuple[int, int]:
    """LiteRT's GetInvSqrtQuantizedMultiplierExp(v, -1) for an int32 ``v > 0``: (m, shift)
    with ``1 / sqrt(v) ~= m * 2**(shift - 31)``, by 5 Newton steps in 3-integer-bit fixed
    point from 1, ``v`` first normalised by powers of 4 into [2**27, 2**29)."""
    if v <= 1:
        return INT32_MAX, 0
    shift = 11
    while v >= 1 << 29:
        v //= 4
        shift += 1
    pairs = (32 - v.bit_length() - 1) // 2 - 1   # leading zeros of v, in bit pairs, less 1
    shift -= pairs
    v <<= 2 * pairs
    half_v = rdbpot(v >> 1, 1)                   # v / 2 in F3 (v >> 1 is v in F3)
    x, three_halves = 1 << 28, (1 << 28) + (1 << 27)
    for _ in range(5):                            # x <- 3/2 x - v/2 x**3
        x3 = gemmlowp_shl(srdhm(srdhm(x, x), x), 6)
        x = gemmlowp_shl(wrap(srdhm(three_halves, x) - srdhm(half_v, x3)), 3)
    m = srdhm(x, 1518500250)                     # times sqrt(2) / 2 in F0
    if shift < 0:
        m, shift = wrap(m << -shift), 0
    return m, -shift


def rsqrt_table(xq: QParams, yq: QParams) -> np.ndarray:
    """Every int8 output: ``v = q - zp``; qmax for ``v <= 0``; else ``1 / sqrt(v)`` as
    :func:`inv_sqrt_multiplier` on 20 extra bits, times ``1 / (sqrt(s_in) s_out)`` (float32
    product) with its shift less 20, ``+ y_zp``, clamped."""
    multiplier, shift = quantize_multiplier(
        1.0 / float(np.sqrt(np.float32(xq.s)) * np.float32(yq.s)))
    out = []
    for q in range(xq.qmin, xq.qmax + 1):
        v = q - xq.zp
        if v <= 0:
            out.append(yq.qmax)
            continue
        m, s = inv_sqrt_multiplier(v)
        data = mbqm(1, m, s + 20)
        out.append(mbqm(data, multiplier, shift - 20) + yq.zp)
    return np.clip(out, yq.qmin, yq.qmax).astype(yq.dtype)


@register("RSQRT", check=check_rsqrt, integer=True)
def rsqrt(ctx: OpContext, x: Array) -> Array:
    """Integer RSQRT: int8 from :func:`rsqrt_table`; int16 from LiteRT's interpolated
    513-entry table of ``1 / sqrt`` (float32; ``32767 s_out`` for inputs <= 0)."""
    xq, yq = same_type_params(ctx)
    v = as_int32(x)
    if xq.dtype == "int8":
        return jnp.asarray(rsqrt_table(xq, yq))[v - xq.qmin]
    out_max = np.float32(32767) * np.float32(yq.s)

    def inv_sqrt(u: np.float32) -> np.float32:
        return out_max if u <= 0 else np.float32(1.0) / np.sqrt(u)

    table = lut16(inv_sqrt, xq.s, 0, yq.s, 0, np.float32)
    return lut16_lookup(v, table).astype(jnp.int16)


# ----------------------------------------------------------------------------- SOFTMAX


def check_softmax(ctx: OpContext) -> None:
    x, y = same_type_params(ctx)
    if x.dtype == "int8" and y.zp != -128:
        raise ValueError(f"int8 SOFTMAX needs output zero point -128, got {y.zp}")
    if x.dtype == "int16" and (x.zp or y.zp or abs(y.s * 32768 - 1) > 1e-3):
        raise ValueError("int16 SOFTMAX needs zero points 0 and output scale 1/32768")


@register("SOFTMAX", check=check_softmax, integer=True)
def softmax(ctx: OpContext, x: Array) -> Array:
    """Integer SOFTMAX over the last axis (LiteRT's float32 table kernel for 8-bit types,
    its fixed-point kernel for int16)."""
    xq, yq = same_type_params(ctx)
    beta = np.float32(ctx.options.beta if ctx.options.beta is not None else 1.0)
    if xq.dtype == "int16":
        return _softmax_int16(as_int32(x), xq, beta)
    scale = -np.float32(xq.s) * beta
    d = np.arange(256, dtype=np.float32)
    table = np.exp((scale * d).astype(np.float64)).astype(np.float32)  # exp(-s beta d)
    v = as_int32(x)
    diff = jnp.max(v, axis=-1, keepdims=True) - v
    e = jnp.asarray(table)[diff]
    total = _ordered_sum(e)
    inv = jnp.float32(1.0) / (total * jnp.float32(yq.s))
    p = rounded_product(e, inv)
    if yq.dtype == "uint8":
        r = jnp.trunc(p + jnp.float32(0.5))
    else:
        r = jnp.trunc(p + jnp.copysign(jnp.float32(0.5), p))
    return saturate(r.astype(jnp.int32) + yq.zp, yq.qmin, yq.qmax, yq.np_dtype)


def _ordered_sum(e: jax.Array) -> jax.Array:
    """Sum over the last axis left to right, in float32 (LiteRT's loop order), keeping the
    axis."""
    n = e.shape[-1]

    def body(j: int, acc: jax.Array) -> jax.Array:
        return acc + lax.dynamic_index_in_dim(e, j, axis=e.ndim - 1, keepdims=True)

    return lax.fori_loop(0, n, body, jnp.zeros((*e.shape[:-1], 1), jnp.float32))



_RANGE16 = 65535


def _softmax_int16(v: Array, xq: QParams, beta: np.float32) -> Array:
    exp_table = lut16(np.exp, 10.0 / _RANGE16, 32767, 2.0 / _RANGE16, 0)
    recip_table = lut16(lambda u: 1.0 / (1.0 + u), 1.0 / _RANGE16, -32768, 2.0 / _RANGE16, 0)
    m = quantize_multiplier(float(np.float32(xq.s) * beta) / (10.0 / _RANGE16))
    diff = v - jnp.max(v, axis=-1, keepdims=True)
    scaled = multiply_by_quantized_multiplier(diff, *m) + 32767
    e = lut16_lookup(jnp.clip(scaled, -32768, 32767), exp_table)
    total = jnp.sum(e, axis=-1, keepdims=True, dtype=jnp.int32)
    lead = lax.clz(total)  # headroom + 1
    shifted = ((total.astype(jnp.uint32) << (lead - 1).astype(jnp.uint32)) + (1 << 13)) >> 14
    sym = shifted.astype(jnp.int32) - ((1 << 15) + (1 << 16))
    recip = lut16_lookup(jnp.clip(sym, -32768, 32767), recip_table)
    right = 31 - lead
    out = (e * recip + (jnp.int32(1) << (right - 1))) >> right
    return saturate(out, 0, 32767, np.int16)
