"""Pooling as strided slices and window axes instead of ``lax.reduce_window``.

Non-overlapping MAX windows (filter == stride, the common 2x2/2) are reshaped into window
axes and reduced in one pass; the first-max gradient is one select. Otherwise both window
reductions are separable: MAX runs as two 1-D passes (W, then H), each the max of ``k``
strided slices of the padded input, with a custom VJP implementing the first-max rule
(non-overlapping windows longer than ``MAX_SLICES`` along one axis are reshaped into blocks
and use an argmax instead). Sums over overlapping windows use the same slice passes;
non-overlapping ones keep ``lax.reduce_window``. Measurements: benchmarks/README.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from ..ops.common import fused_activation
from ..ops.pooling import Pads, Window, geometry, lowest, out_size, safe_sqrt, valid_counts
from ..ops.pooling import window_mean as reference_window_mean
from ..ops.registry import OpContext
from . import fast

#: Windows longer than this that do not overlap (k == stride) are reduced as reshaped blocks.
MAX_SLICES = 4


def _pad_axis(x: jax.Array, axis: int, pads: Pads, value: float | int) -> jax.Array:
    if pads == (0, 0):
        return x
    cfg = [(0, 0, 0)] * x.ndim
    cfg[axis] = (pads[0], pads[1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


def _blocked(k: int, s: int) -> bool:
    """Non-overlapping big windows are reshaped into blocks; the rest use k strided slices."""
    return k == s and k > MAX_SLICES


def _windows(x: jax.Array, axis: int, k: int, s: int, pads: Pads, value: float | int):
    """The windows along ``axis``: for blocks an array with a new window axis ``axis + 1``,
    otherwise a list of ``k`` strided slices whose j-th holds window element j."""
    out = out_size(x.shape[axis], k, s, pads)
    xp = _pad_axis(x, axis, pads, value)
    if _blocked(k, s):
        xp = lax.slice_in_dim(xp, 0, out * k, axis=axis)
        return xp.reshape(xp.shape[:axis] + (out, k) + xp.shape[axis + 1:])
    return [lax.slice_in_dim(xp, j, j + (out - 1) * s + 1, s, axis) for j in range(k)]


def sum1d(x: jax.Array, axis: int, k: int, s: int, pads: Pads) -> jax.Array:
    """Sum over 1-D windows along ``axis`` (zero padding)."""
    w = _windows(x, axis, k, s, pads, 0)
    return jnp.sum(w, axis=axis + 1) if _blocked(k, s) else functools.reduce(jnp.add, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def max1d(x: jax.Array, axis: int, k: int, s: int, pads: Pads) -> jax.Array:
    """Max over 1-D windows along ``axis``; the gradient goes to the first maximum."""
    w = _windows(x, axis, k, s, pads, lowest(x.dtype))
    return jnp.max(w, axis=axis + 1) if _blocked(k, s) else functools.reduce(jnp.maximum, w)


def _max1d_fwd(x, axis, k, s, pads):
    y = max1d(x, axis, k, s, pads)
    return y, (x, y)


def _max1d_bwd(axis, k, s, pads, res, g):
    x, y = res
    w, vjp = jax.vjp(lambda v: _windows(v, axis, k, s, pads, lowest(v.dtype)), x)
    if _blocked(k, s):
        first = jnp.argmax(w, axis=axis + 1, keepdims=True)
        hot = lax.broadcasted_iota(jnp.int32, w.shape, axis + 1) == first
        return vjp(jnp.where(hot, jnp.expand_dims(g, axis + 1), jnp.zeros((), g.dtype)))
    taken = jnp.zeros(y.shape, bool)
    cotangents = []
    for sl in w:
        first = (sl == y) & ~taken
        taken = taken | first
        cotangents.append(jnp.where(first, g, jnp.zeros_like(g)))
    return vjp(cotangents)


max1d.defvjp(_max1d_fwd, _max1d_bwd)


def _blocks(x: jax.Array, kernel: tuple[int, int], pads: tuple[Pads, Pads]) -> jax.Array:
    """Non-overlapping windows as axes: [N, H', kh, W', kw, C] of the padded input (padding
    with the dtype's lowest value; a VALID tail that fills no window is cropped)."""
    xp = _pad_axis(_pad_axis(x, 1, pads[0], lowest(x.dtype)), 2, pads[1], lowest(x.dtype))
    (kh, kw), (h, w) = kernel, (xp.shape[1] // kernel[0], xp.shape[2] // kernel[1])
    return xp[:, :h * kh, :w * kw].reshape(x.shape[0], h, kh, w, kw, x.shape[3])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def max_blocks(x: jax.Array, kernel: tuple[int, int], pads: tuple[Pads, Pads]) -> jax.Array:
    """Max over non-overlapping 2-D windows (filter == stride) in one pass over the window
    axes; the gradient goes to each window's first maximum in row-major order."""
    return jnp.max(_blocks(x, kernel, pads), axis=(2, 4))


def _max_blocks_fwd(x, kernel, pads):
    return max_blocks(x, kernel, pads), x


def _max_blocks_bwd(kernel, pads, x, g):
    kh, kw = kernel
    xb = _blocks(x, kernel, pads)
    top = jnp.max(xb, axis=(2, 4), keepdims=True)
    position = (lax.broadcasted_iota(jnp.int32, xb.shape, 2) * kw
                + lax.broadcasted_iota(jnp.int32, xb.shape, 4))
    first = jnp.min(jnp.where(xb == top, position, kh * kw), axis=(2, 4), keepdims=True)
    gb = jnp.where(position == first, g[:, :, None, :, None], jnp.zeros((), g.dtype))
    n, h, _, w, _, c = gb.shape
    (top_pad, bottom_pad), (left_pad, right_pad) = pads
    full = (x.shape[1] + top_pad + bottom_pad, x.shape[2] + left_pad + right_pad)
    dx = jnp.pad(gb.reshape(n, h * kh, w * kw, c),
                 ((0, 0), (0, full[0] - h * kh), (0, full[1] - w * kw), (0, 0)))
    return (dx[:, top_pad:top_pad + x.shape[1], left_pad:left_pad + x.shape[2]],)


max_blocks.defvjp(_max_blocks_fwd, _max_blocks_bwd)


def _separable(pool1d: Callable[..., jax.Array], x: jax.Array, window: Window) -> jax.Array:
    kernel, strides, pads = window
    y = pool1d(x, 2, kernel[1], strides[1], tuple(pads[1]))
    return pool1d(y, 1, kernel[0], strides[0], tuple(pads[0]))


def window_max(x: jax.Array, window: Window) -> jax.Array:
    """:func:`circle_jax.ops.pooling.window_max` as one-pass blocks or two slice passes."""
    kernel, strides, pads = window
    if kernel == strides:
        return max_blocks(x, kernel, pads)
    return _separable(max1d, x, window)


def window_mean(x: jax.Array, window: Window) -> jax.Array:
    """:func:`circle_jax.ops.pooling.window_mean`; overlapping windows as slice passes."""
    kernel, strides, _ = window
    if kernel == strides:
        return reference_window_mean(x, window)
    total = _separable(sum1d, x, window)
    return total / valid_counts(x.shape[1:3], window).astype(x.dtype)


@fast("MAX_POOL_2D")
def max_pool_2d(ctx: OpContext, x: jax.Array) -> jax.Array:
    """MAX_POOL_2D with :func:`window_max`."""
    x = jnp.asarray(x)
    return fused_activation(window_max(x, geometry(ctx, x)),
                            ctx.options.fused_activation_function)


@fast("AVERAGE_POOL_2D")
def average_pool_2d(ctx: OpContext, x: jax.Array) -> jax.Array:
    """AVERAGE_POOL_2D with :func:`window_mean`."""
    x = jnp.asarray(x)
    return fused_activation(window_mean(x, geometry(ctx, x)),
                            ctx.options.fused_activation_function)


@fast("L2_POOL_2D")
def l2_pool_2d(ctx: OpContext, x: jax.Array) -> jax.Array:
    """L2_POOL_2D with :func:`window_mean`."""
    x = jnp.asarray(x)
    return fused_activation(safe_sqrt(window_mean(x * x, geometry(ctx, x))),
                            ctx.options.fused_activation_function)
