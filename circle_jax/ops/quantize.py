"""DEQUANTIZE and QUANTIZE: conversions between float tensors and affine-quantized integers.

An affine-quantized tensor stores q with real value ``scale * (q - zero_point)``; per-axis
quantization has one (scale, zero_point) per index of ``quantized_dimension``.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir
from .common import output_dtype
from .elementwise import exact_divide, is_int
from .registry import OpContext, register

Array = Any  # a jax array, or a numpy array for static inputs


def _quantization(ctx: OpContext, tensor: ir.Tensor | None, what: str) -> ir.Quantization:
    q = tensor.quantization if tensor is not None else None
    if q is None or not q.scale:
        raise ctx.error(f"the {what} tensor has no quantization parameters (scale, zero point)")
    return q


def _params(q: ir.Quantization, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point as float32 arrays that broadcast against a rank-``ndim`` tensor
    (scalars per tensor, laid along ``quantized_dimension`` per axis)."""
    scale = np.asarray(q.scale, np.float32)
    zero = np.broadcast_to(np.asarray(q.zero_point or (0,), np.float32), scale.shape)
    if scale.size == 1:
        return scale.reshape(()), zero.reshape(())
    shape = [1] * ndim
    shape[q.quantized_dimension % max(ndim, 1)] = scale.size
    return scale.reshape(shape), zero.reshape(shape)


def _round_half_away(v: Array) -> Array:
    """Round to nearest, ties away from zero (C's ``round``), exact for every float."""
    t = jnp.trunc(v)
    return t + jnp.where(jnp.abs(v - t) >= 0.5, jnp.sign(v), 0.0)


@register("DEQUANTIZE")
def dequantize(ctx: OpContext, x: Array) -> Array:
    """float16 -> float32 (differentiable: a float16 constant is a trainable param), or
    int8/uint8/int16 -> ``(q - zero_point) * scale``, per tensor or per axis.

    (LiteRT's vectorized per-tensor kernel computes ``q*scale - zero_point*scale``, which can
    differ in the last float32 bit.)
    """
    dtype = jnp.result_type(x)
    if jnp.issubdtype(dtype, jnp.floating):
        # Never narrow: float64 params (finite-difference checks) stay float64.
        return jnp.asarray(x).astype(jnp.promote_types(dtype, output_dtype(ctx)))
    scale, zero = _params(_quantization(ctx, ctx.inputs[0], "input"), np.ndim(x))
    return (jnp.asarray(x).astype(jnp.float32) - zero) * scale


@register("QUANTIZE")
def quantize(ctx: OpContext, x: Array) -> Array:
    """float -> int8/uint8/int16 with the output tensor's parameters (per tensor or per axis):
    ``round(x / scale) + zero_point``, ties away from zero, clamped to the dtype's range. An
    int8/uint8/int16 input is requantized (per-tensor parameters) in fixed point.

    These are TFLite's reference semantics. LiteRT's vectorized x86 kernels round ties
    differently (float input: to even, through ``x * (1/scale)``; 8-bit to 8-bit requantize:
    up) in all but the last ``size % 8`` (float) or ``size % 16`` (8-bit) elements.
    """
    dtype = output_dtype(ctx)
    out_q = _quantization(ctx, ctx.outputs[0], "output")
    if out_q.storage and not is_int(x):
        return _fake_quantize(x, out_q)
    if not np.issubdtype(dtype, np.integer):
        raise ctx.error(f"QUANTIZE to {dtype} is not supported (int8, uint8, int16 are)")
    if is_int(x):
        return _requantize(ctx, x, out_q, dtype)
    scale, zero = _params(out_q, np.ndim(x))
    q = _round_half_away(exact_divide(x, scale)) + zero
    info = np.iinfo(dtype)
    return jnp.clip(q, info.min, info.max).astype(dtype)


def _fake_quantize(x: Array, q: ir.Quantization) -> Array:
    """A QDQ pair's QUANTIZE on its float middle tensor (`circle_jax.passes.qdq`): the real
    value ``(clip(round(x / scale) + zero_point) - zero_point) * scale`` of the integer
    QUANTIZE stores, exactly as QUANTIZE then DEQUANTIZE compute it, with the clipped
    straight-through gradient (1 where the integer is not clipped)."""
    scale, zero = _params(q, np.ndim(x))
    info = np.iinfo(q.storage)
    v = _round_half_away(exact_divide(x, scale)) + zero
    out = (jnp.clip(v, info.min, info.max) - zero) * scale
    inside = (v >= info.min) & (v <= info.max)
    return lax.stop_gradient(out) + jnp.where(inside, x - lax.stop_gradient(x), 0.0)


def _requantize(ctx: OpContext, x: Array, out_q: ir.Quantization, dtype: np.dtype) -> Array:
    """int -> int through a table over every input value, computed exactly at lowering time
    with numpy int64 (JAX runs without 64-bit integers)."""
    in_q = _quantization(ctx, ctx.inputs[0], "input")
    if len(in_q.scale) != 1 or len(out_q.scale) != 1:
        raise ctx.error("requantization needs per-tensor input and output parameters")
    src = np.iinfo(np.dtype(jnp.result_type(x)))
    if src.bits > 16:
        raise ctx.error(f"requantizing {src.dtype} is not supported (int8, uint8, int16 are)")
    values = np.arange(src.min, src.max + 1, dtype=np.int64)
    ratio = np.float64(np.float32(in_q.scale[0])) / np.float64(np.float32(out_q.scale[0]))
    scaled = _fixed_point_scale(values - in_q.zero_point[0], ratio) + out_q.zero_point[0]
    info = np.iinfo(dtype)
    table = np.clip(scaled, info.min, info.max).astype(dtype)
    if isinstance(x, np.ndarray):
        return table[x.astype(np.int64) - src.min]
    return jnp.asarray(table)[jnp.asarray(x).astype(jnp.int32) - src.min]


def _fixed_point_scale(v: np.ndarray, ratio: float) -> np.ndarray:
    """``v * ratio`` as TFLite's integer kernels compute it (int64 numpy ``v``).

    The ratio is m * 2**shift with m a 31-bit fraction (rounded half away from zero); v * m
    is rounded at bit 31 to nearest, ties up; the remaining right shift rounds to nearest,
    ties away from zero.
    """
    frac, shift = math.frexp(ratio)
    m = int(math.floor(frac * 2**31 + 0.5))
    if m == 2**31:
        m, shift = m // 2, shift + 1
    if ratio <= 0 or shift < -31:  # TFLite's multiplier is 0 then
        return np.zeros_like(v)
    high = ((v << max(shift, 0)) * m + 2**30) >> 31
    right = max(-shift, 0)
    if right == 0:
        return high
    return np.sign(high) * ((np.abs(high) + (1 << (right - 1))) >> right)
