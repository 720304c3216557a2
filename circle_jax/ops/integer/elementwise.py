"""Integer kernels of element-wise operators: ADD, SUB, MUL, RELU, RELU6, RELU_N1_TO_1,
LEAKY_RELU, LOGISTIC, TANH, SOFTMAX.

LiteRT's rules (scales are the tensors' float32 values; ``x'`` is ``x - x_zp``):

- ADD / SUB: both inputs are brought to a common scale with ``L`` guard bits (L = 20 for
  8-bit types, 15 for int16): ``a = MBQM(x1' * 2**L, M1)``, ``b = MBQM(x2' * 2**L, M2)``,
  ``out = MBQM(a +/- b, Mo) + y_zp`` with ``M1 = s1 / (2 max(s1, s2))``,
  ``M2 = s2 / (2 max(s1, s2))``, ``Mo = 2 max(s1, s2) / (2**L s_out)``; then the fused
  activation's clamp. int16 needs zero points 0 (LiteRT's power-of-two int16 path, taken when
  ``pot_scale_int16`` is set and every scale is a power of two, is refused).
- MUL: ``out = MBQM(x1' * x2', s1 s2 / s_out) + y_zp`` (the ratio in float32, as LiteRT's
  Prepare computes it), then the clamp.
- RELU family: ``MBQM(x', s_in / s_out) + y_zp`` clamped to the activation's quantized range
  (bounds ``y_zp + round(bound / s_out)``).
- LEAKY_RELU: identity multiplier ``s_in / s_out`` for ``x' >= 0``, ``alpha s_in / s_out``
  below.
- LOGISTIC, TANH (int8, uint8): a 256-entry table over every input value, built as LiteRT
  builds it in float32: ``clamp(round(f(s_in (q - zp_in)) * (1 / s_out)) + zp_out)``.
- SOFTMAX (int8, uint8 input): LiteRT's optimized kernel, in float32: a table
  ``T[d] = exp(-s_in * beta * d)`` for d = max - q in [0, 255], the row sum accumulated in
  order, ``p = T[d] * (1 / (sum * s_out))``, int8 output ``round(p) + zp`` (ties away from
  zero), uint8 output ``trunc(p + 0.5)``, clamped.
- SOFTMAX (int16, zero points 0, output scale 1/32768): fixed point with two interpolated
  513-entry tables (:func:`lut16`, :func:`lut16_lookup`): ``e = exp_table(clamp(MBQM(q - max,
  s_in beta / (10 / 65535)) + 32767))`` (inputs spanning [-10, 0]), the int32 row sum
  normalised to its leading bit, ``r = one_over_one_plus_x_table(...)`` and
  ``out = clamp((e * r + 2**(k-1)) >> k, 0, 32767)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..registry import OpContext, register
from .fixed_point import (
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    rounded_product,
    saturate,
)
from .params import (
    QParams,
    activation_range,
    as_int32,
    qparams,
    quantize_value,
    same_type_params,
)

Array = Any


def _f32(v: float) -> np.float32:
    return np.float32(v)


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
    twice_max = 2.0 * np.float64(max(_f32(a.s), _f32(b.s)))
    m1 = quantize_multiplier(np.float64(a.s) / twice_max)
    m2 = quantize_multiplier(np.float64(b.s) / twice_max)
    mo = quantize_multiplier(twice_max / np.float64(_f32(1 << left) * _f32(y.s)))
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
    m = quantize_multiplier(float(_f32(a.s) * _f32(b.s) / _f32(y.s)))
    prod = (as_int32(x1) - a.zp) * (as_int32(x2) - b.zp)
    out = multiply_by_quantized_multiplier(prod, *m) + y.zp
    lo, hi = activation_range(ctx.options.fused_activation_function, y)
    return saturate(out, lo, hi, y.np_dtype)


# ----------------------------------------------------------------------------- RELU family


def check_relu(ctx: OpContext) -> None:
    x, y = same_type_params(ctx, ("int8", "uint8") if ctx.op.key == "RELU_N1_TO_1"
                      else ("int8", "uint8", "int16"))
    if x.dtype == "int16" and (x.zp or y.zp):
        raise ValueError("int16 RELU needs zero points 0")


def _relu_range(lo: float, hi: float | None) -> Callable[[OpContext, Array], Array]:
    def relu(ctx: OpContext, x: Array) -> Array:
        xq, yq = same_type_params(ctx)
        m = quantize_multiplier(float(_f32(xq.s) / _f32(yq.s)))
        out = multiply_by_quantized_multiplier(as_int32(x) - xq.zp, *m) + yq.zp
        qlo = max(yq.qmin, quantize_value(lo, yq))
        qhi = yq.qmax if hi is None else min(yq.qmax, quantize_value(hi, yq))
        return saturate(out, qlo, qhi, yq.np_dtype)

    return relu


register("RELU", check=check_relu, integer=True)(_relu_range(0.0, None))
register("RELU6", check=check_relu, integer=True)(_relu_range(0.0, 6.0))
register("RELU_N1_TO_1", check=check_relu, integer=True)(_relu_range(-1.0, 1.0))


def check_leaky_relu(ctx: OpContext) -> None:
    check_relu(ctx)
    if (ctx.options.alpha or 0.0) < 0:
        raise NotImplementedError("integer LEAKY_RELU with a negative alpha is not supported")


@register("LEAKY_RELU", check=check_leaky_relu, integer=True)
def leaky_relu(ctx: OpContext, x: Array) -> Array:
    """Integer LEAKY_RELU: one multiplier for x' >= 0, another (times alpha) below."""
    xq, yq = same_type_params(ctx)
    alpha = _f32(ctx.options.alpha or 0.0)
    identity = quantize_multiplier(float(_f32(xq.s) / _f32(yq.s)))
    scaled = quantize_multiplier(float(_f32(xq.s) * alpha / _f32(yq.s)))
    v = as_int32(x) - xq.zp
    out = jnp.where(v >= 0, multiply_by_quantized_multiplier(v, *identity),
                    multiply_by_quantized_multiplier(v, *scaled)) + yq.zp
    return saturate(out, yq.qmin, yq.qmax, yq.np_dtype)


# ----------------------------------------------------------------------------- tables


def _round_away(v: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's ``round``) of float values, as float64."""
    v = np.asarray(v, np.float64)
    return np.trunc(v + np.copysign(0.5, v))


def lut(xq: QParams, yq: QParams, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The output of every input value of an 8-bit type, as LiteRT's LUTPopulate computes
    it in float32 (``fn`` maps float32 to float32)."""
    q = np.arange(xq.qmin, xq.qmax + 1)
    dequantized = _f32(xq.s) * (q - xq.zp).astype(np.float32)
    with np.errstate(all="ignore"):
        transformed = fn(dequantized).astype(np.float32)
        rescaled = _round_away(transformed * (_f32(1.0) / _f32(yq.s)))
    finite = np.isfinite(transformed)
    out = np.where(finite, rescaled + yq.zp, yq.qmin)
    return np.clip(out, yq.qmin, yq.qmax).astype(yq.dtype)


def _sigmoid32(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)) in float32 (exp correctly rounded from float64)."""
    e = np.exp(-v.astype(np.float64)).astype(np.float32)
    return (_f32(1.0) / (_f32(1.0) + e)).astype(np.float32)


def _tanh32(v: np.ndarray) -> np.ndarray:
    return np.tanh(v.astype(np.float64)).astype(np.float32)


def check_lut(ctx: OpContext) -> None:
    x, y = same_type_params(ctx, ("int8", "uint8"))
    if ctx.op.key == "LOGISTIC" and y.s != 1.0 / 256:
        raise ValueError(f"integer LOGISTIC needs output scale 1/256, got {y.s}")


def _table_op(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[OpContext, Array], Array]:
    def op(ctx: OpContext, x: Array) -> Array:
        xq, yq = same_type_params(ctx)
        table = lut(xq, yq, fn)
        return jnp.asarray(table)[as_int32(x) - xq.qmin]

    return op


register("LOGISTIC", check=check_lut, integer=True)(_table_op(_sigmoid32))
register("TANH", check=check_lut, integer=True)(_table_op(_tanh32))


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
    beta = _f32(ctx.options.beta if ctx.options.beta is not None else 1.0)
    if xq.dtype == "int16":
        return _softmax_int16(as_int32(x), xq, beta)
    scale = -_f32(xq.s) * beta
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



# ----------------------------------------------------------------------------- int16 tables

_RANGE16 = 65535


def lut16(fn: Callable[[float], float], in_scale: float, in_zp: int, out_scale: float,
          out_zp: int) -> np.ndarray:
    """LiteRT's 513-entry int16 table of ``fn`` (in double): 512 samples over the input
    range, each biased by half the interpolation error at its midpoint, then the end."""
    lo16, hi16 = -32768, 32767
    in_min, in_max = in_scale * (lo16 - in_zp), in_scale * (hi16 - in_zp)
    out_min, out_max = out_scale * (lo16 - out_zp), out_scale * (hi16 - out_zp)
    step = (in_max - in_min) / 512
    inv = 65536.0 / (out_max - out_min)

    def rnd(v: float) -> float:
        return float(_round_away(np.float64(v)))

    table = []
    for i in range(512):
        val = fn(in_min + i * step)
        mid = fn(in_min + i * step + step / 2)
        nxt = fn(in_min + (i + 1) * step)
        sample = rnd(val * inv)
        interp = rnd((nxt * inv + rnd(val * inv)) / 2)
        bias = rnd((interp - rnd(mid * inv)) / 2)
        table.append(min(max(sample - bias, lo16), hi16))
    table.append(min(max(rnd(fn(in_max) * inv), lo16), hi16))
    return np.asarray(table, np.int32)


def lut16_lookup(v: Array, table: np.ndarray) -> Array:
    """Linear interpolation in a 513-entry table at int16 ``v`` (int32 array): entry
    ``256 + (v >> 7)`` plus ``(slope * (v & 127) + 64) >> 7``."""
    t = jnp.asarray(table)
    index = 256 + (v >> 7)
    base = t[index]
    slope = t[index + 1] - base
    return base + ((slope * (v & 0x7F) + 64) >> 7)


def _softmax_int16(v: Array, xq: QParams, beta: np.float32) -> Array:
    exp_table = lut16(np.exp, 10.0 / _RANGE16, 32767, 2.0 / _RANGE16, 0)
    recip_table = lut16(lambda u: 1.0 / (1.0 + u), 1.0 / _RANGE16, -32768, 2.0 / _RANGE16, 0)
    m = quantize_multiplier(float(_f32(xq.s) * beta) / (10.0 / _RANGE16))
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
