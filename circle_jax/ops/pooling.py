"""2-D pooling (NHWC): AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D, as ``lax.reduce_window``.

TFLite semantics: the window at output (i, j) covers input rows ``i*stride_h - pad_top ...``
(SAME pads put the extra pixel at the end); padded positions never take part, so AVERAGE and
L2 divide by the number of VALID (non-padded) elements of each window and MAX ignores padding.
The fused activation is applied to the pooled value as TFLite's pooling kernels do: as a clamp
range (RELU, RELU6, RELU_N1_TO_1, with TF's gradients at the bounds); TANH and SIGN_BIT give
no clamp there, so LiteRT leaves the value unchanged and so does circle-jax.

Gradients: MAX_POOL_2D sends each window's whole gradient to the FIRST maximum of the window
in row-major (h, then w) order, like TF's MaxPoolGrad (no split among ties; XLA's
select-and-scatter does this). L2_POOL_2D has no TF gradient; here an all-zero window gets
gradient 0 (instead of NaN). Faster lowerings: ``circle_jax/lowering/pooling.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir
from .common import check_padding, fused_activation, padding_pairs, positive
from .registry import OpContext, register

Pads = tuple[int, int]
Window = tuple[tuple[int, int], tuple[int, int], tuple[Pads, Pads]]  # kernel, strides, pads


def lowest(dtype: np.dtype) -> float | int:
    """The identity of max for ``dtype`` (the value padding takes in MAX_POOL_2D)."""
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf
    return int(jnp.iinfo(dtype).min)


def out_size(size: int, k: int, s: int, pads: Pads) -> int:
    """Windows along one axis."""
    return (size + pads[0] + pads[1] - k) // s + 1


def geometry(ctx: OpContext, x: jax.Array) -> Window:
    """(kernel, strides, pads) of a pooling operator for input ``x``."""
    o = ctx.options
    if np.ndim(x) != 4:
        raise ValueError(f"pooling needs a 4-D NHWC input, got rank {np.ndim(x)}")
    kernel = (int(o.filter_height), int(o.filter_width))
    strides = (int(o.stride_h), int(o.stride_w))
    sizes = tuple(x.shape[1:3])
    pads = tuple(tuple(p) for p in padding_pairs(o.padding, sizes, kernel, strides))
    if any(out_size(n, k, s, p) < 1 for n, k, s, p in zip(sizes, kernel, strides, pads)):
        raise ValueError(f"filter {kernel} does not fit the {sizes} input with VALID padding")
    return kernel, strides, pads


def valid_counts(sizes: Sequence[int], window: Window) -> np.ndarray:
    """Number of non-padded elements of every window, shape [OH, OW, 1] (static)."""
    per_axis = []
    for n, k, s, (lo, hi) in zip(sizes, *window):
        start = np.arange(out_size(n, k, s, (lo, hi))) * s - lo
        per_axis.append(np.minimum(start + k, n) - np.maximum(start, 0))
    return (per_axis[0][:, None] * per_axis[1][None, :])[..., None]


def reduce_window(x: jax.Array, init: float | int, op: Callable, window: Window) -> jax.Array:
    """``op`` over each window of the NHWC ``x``, padded positions holding ``init``."""
    kernel, strides, pads = window
    return lax.reduce_window(x, np.asarray(init, x.dtype), op, (1, *kernel, 1),
                             (1, *strides, 1), [(0, 0), *pads, (0, 0)])


def window_max(x: jax.Array, window: Window) -> jax.Array:
    """Max over each window (padding never wins)."""
    return reduce_window(x, lowest(x.dtype), lax.max, window)


def window_mean(x: jax.Array, window: Window) -> jax.Array:
    """Mean over the non-padded elements of every window."""
    return reduce_window(x, 0, lax.add, window) / valid_counts(x.shape[1:3], window).astype(x.dtype)


@jax.custom_jvp
def safe_sqrt(v: jax.Array) -> jax.Array:
    """sqrt whose derivative at 0 is 0 (an all-zero L2 window)."""
    return jnp.sqrt(v)


@safe_sqrt.defjvp
def _safe_sqrt_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    y = jnp.sqrt(v)
    return y, jnp.where(y > 0, dv / jnp.where(y > 0, 2 * y, 1), jnp.zeros_like(y))


def check_pool(ctx: OpContext) -> None:
    """Load-time checks: positive filter and strides, known padding, supported dtypes."""
    o, key = ctx.options, ctx.op.key
    check_padding(o.padding)
    sizes = {k: o.get(k) for k in ("filter_height", "filter_width", "stride_h", "stride_w")}
    positive(sizes)
    if any(not v for v in sizes.values()):
        raise ValueError("filter and stride must be positive: "
                         + ", ".join(f"{k}={v}" for k, v in sizes.items()))
    x = ctx.inputs[0]
    if x is None or np.issubdtype(ir.as_numpy_dtype(x.dtype), np.floating):
        return
    if key != "MAX_POOL_2D":
        raise NotImplementedError(f"{key} of {x.dtype} (quantized) is not supported")
    if x.quantization != ctx.outputs[0].quantization or o.fused_activation_function:
        raise NotImplementedError(f"MAX_POOL_2D of {x.dtype} needs equal input/output "
                                  "quantization and no fused activation")


@register("MAX_POOL_2D", check=check_pool)
def max_pool_2d(ctx: OpContext, x: jax.Array) -> jax.Array:
    """Max over each window (padding ignored); gradient to the first max, like TF."""
    x = jnp.asarray(x)
    y = window_max(x, geometry(ctx, x))
    return fused_activation(y, ctx.options.fused_activation_function)


@register("AVERAGE_POOL_2D", check=check_pool)
def average_pool_2d(ctx: OpContext, x: jax.Array) -> jax.Array:
    """Mean over the non-padded elements of each window."""
    x = jnp.asarray(x)
    y = window_mean(x, geometry(ctx, x))
    return fused_activation(y, ctx.options.fused_activation_function)


@register("L2_POOL_2D", check=check_pool)
def l2_pool_2d(ctx: OpContext, x: jax.Array) -> jax.Array:
    """sqrt(mean of squares) over the non-padded elements of each window."""
    x = jnp.asarray(x)
    y = safe_sqrt(window_mean(x * x, geometry(ctx, x)))
    return fused_activation(y, ctx.options.fused_activation_function)
