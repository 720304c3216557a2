"""Integer kernels of AVERAGE_POOL_2D and MAX_POOL_2D (NHWC; windows and padding as the
float kernels, ``ops/pooling.py``).

LiteRT needs the input's and output's parameters equal and computes on the stored values:
AVERAGE sums the window's valid (non-padded) values in int32 and divides by their count ``n``
rounding half away from zero (``(acc + n//2) / n`` for a positive sum, ``(acc - n//2) / n``
otherwise, C division truncating toward zero); MAX takes the largest valid value. Both then
clamp to the fused activation's integer range.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..pooling import geometry, reduce_window, valid_counts, window_max
from ..registry import OpContext, register
from .fixed_point import saturate
from .params import activation_range, as_int32, same_type_params

Array = Any


def check_pool(ctx: OpContext) -> None:
    """Input and output of one type with equal scale and zero point (as LiteRT requires)."""
    x, y = same_type_params(ctx)
    if x.s != y.s or x.zp != y.zp:
        raise ValueError(f"integer {ctx.op.key} needs equal input and output scale and zero "
                         f"point, got ({x.s}, {x.zp}) and ({y.s}, {y.zp})")


def _truncating_divide(a: Array, n: Array) -> Array:
    """C's int division (toward zero) of int32 ``a`` by positive ``n``."""
    q = jnp.abs(a) // n
    return jnp.where(a < 0, -q, q)


@register("AVERAGE_POOL_2D", check=check_pool, integer=True)
def average_pool_2d(ctx: OpContext, x: Array) -> Array:
    """Integer mean of each window's valid values, rounded half away from zero."""
    xq, yq = same_type_params(ctx)
    v = as_int32(x)
    window = geometry(ctx, v)
    acc = reduce_window(v, 0, jnp.add, window)
    n = jnp.asarray(valid_counts(v.shape[1:3], window).astype("int32"))
    half = n // 2
    out = _truncating_divide(jnp.where(acc > 0, acc + half, acc - half), n)
    lo, hi = activation_range(ctx.options.fused_activation_function, yq)
    return saturate(out, lo, hi, yq.np_dtype)


@register("MAX_POOL_2D", check=check_pool, integer=True)
def max_pool_2d(ctx: OpContext, x: Array) -> Array:
    """Integer max of each window's valid values, clamped to the activation's range."""
    xq, yq = same_type_params(ctx)
    v = as_int32(x)
    out = window_max(v, geometry(ctx, v))
    lo, hi = activation_range(ctx.options.fused_activation_function, yq)
    return saturate(out, lo, hi, yq.np_dtype)
