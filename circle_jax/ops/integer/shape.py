"""Integer kernels of CONCATENATION and PAD / PADV2.

CONCATENATION: int8 and int16 inputs must share the output's scale and zero point (LiteRT
refuses others) and are copied; uint8 inputs with other parameters are requantized as
LiteRT's ConcatenationWithScaling does, in float32:
``clamp(round(q * (s_in / s_out) - zp_in * (s_in / s_out)) + zp_out)`` (round half away from
zero), with ``s_in / s_out`` formed as ``s_in * (1 / s_out)``.

PAD fills with the output's zero point (the stored value of real 0); PADV2 with its constant.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..registry import OpContext, register
from ..shape import axis_index, pad_pairs
from .fixed_point import rounded_product, saturate
from .params import QParams, as_int32, qparams

Array = Any


def _concat_params(ctx: OpContext) -> tuple[list[QParams], QParams]:
    y = qparams(ctx, "output", 0)
    xs = [qparams(ctx, "input", j, dtypes=(y.dtype,)) for j in range(len(ctx.inputs))]
    return xs, y


def check_concatenation(ctx: OpContext) -> None:
    """No fused activation; int8/int16 inputs with the output's parameters."""
    xs, y = _concat_params(ctx)
    if ctx.options.fused_activation_function:
        raise NotImplementedError("integer CONCATENATION with a fused activation is not "
                                  "supported (LiteRT refuses it too)")
    if y.dtype != "uint8":
        for x in xs:
            if x.s != y.s or x.zp != y.zp:
                raise ValueError(f"{y.dtype} CONCATENATION needs every input's scale and zero "
                                 f"point equal to the output's; input {x.name[:60]!r} has "
                                 f"({x.s}, {x.zp}), the output ({y.s}, {y.zp})")


def _requantize_uint8(x: Array, xq: QParams, yq: QParams) -> Array:
    if xq.s == yq.s and xq.zp == yq.zp:
        return jnp.asarray(x)
    scale = np.float32(xq.s) * (np.float32(1.0) / np.float32(yq.s))
    bias = -np.float32(xq.zp) * scale
    v = rounded_product(jnp.asarray(x).astype(jnp.float32), scale) + bias
    r = jnp.trunc(v + jnp.copysign(jnp.float32(0.5), v)).astype(jnp.int32)
    return saturate(r + yq.zp, yq.qmin, yq.qmax, yq.np_dtype)


@register("CONCATENATION", check=check_concatenation, integer=True)
def concatenation(ctx: OpContext, *xs: Array) -> Array:
    """Integer concatenation along ``axis``."""
    qs, y = _concat_params(ctx)
    axis = axis_index(int(ctx.options.axis or 0), np.ndim(xs[0]))
    parts = [_requantize_uint8(x, q, y) for x, q in zip(xs, qs)]
    return jnp.concatenate(parts, axis=axis)


def check_pad(ctx: OpContext) -> None:
    x = qparams(ctx, "input", 0)
    y = qparams(ctx, "output", 0, dtypes=(x.dtype,))
    if x.s != y.s or x.zp != y.zp:
        raise ValueError("integer PAD needs equal input and output scale and zero point")


@register("PAD", "PADV2", check=check_pad, integer=True)
def pad(ctx: OpContext, x: Array, paddings: Array, value: Array = None) -> Array:
    """Constant padding with the output's zero point (PAD) or the constant (PADV2)."""
    y = qparams(ctx, "output", 0)
    pairs = pad_pairs(paddings, np.ndim(x), "paddings")
    fill = y.zp if value is None else jnp.asarray(value).reshape(())
    xi = as_int32(x)
    out = lax.pad(jnp.asarray(xi), jnp.asarray(fill, jnp.int32),
                  [(lo, hi, 0) for lo, hi in pairs])
    return out.astype(y.np_dtype)
