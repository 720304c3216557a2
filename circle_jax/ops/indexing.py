"""Indexing operators: gathers (EMBEDDING_LOOKUP among them) and scatters, one-hot,
cumulative sums, top-k, arg max/min.

Index tensors may be int32 or int64; axes, depths and k must be static. With only static
inputs the operators compute with numpy (constant folding keeps dtypes exact).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import OpContext, register
from .shape import axis_index, index_dtype, ints, scalar, take_slice, xp

Array = Any  # a jax array, or a numpy array for static values


def _nd_index(indices: Array, rank: int, what: str) -> tuple[Array, ...]:
    """The last axis of an N-d index tensor, split into one index array per indexed axis."""
    k = indices.shape[-1] if indices.ndim else 0
    if indices.ndim == 0 or not 1 <= k <= rank:
        raise ValueError(f"{what} indices of shape {list(indices.shape)} do not fit rank {rank}")
    return tuple(indices[..., j] for j in range(k))


@register("GATHER")
def gather(ctx: OpContext, params: Array, indices: Array) -> Array:
    """``params`` rows selected by ``indices`` along ``axis``; the first ``batch_dims`` axes
    of params and indices are matched pairwise. Output shape:
    params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis + 1:]."""
    o = ctx.options
    axis = axis_index(int(o.axis or 0), params.ndim, "gather axis")
    bd = int(o.batch_dims or 0)
    bd = bd + indices.ndim if bd < 0 else bd
    if not 0 <= bd <= min(axis, indices.ndim) or params.shape[:bd] != indices.shape[:bd]:
        raise ValueError(f"gather batch_dims {o.batch_dims} does not fit params "
                         f"{list(params.shape)}, indices {list(indices.shape)}, axis {axis}")
    m = xp(params, indices)
    if bd == 0:
        return m.take(params, indices, axis=axis)
    # Flatten to [batch, before, n, after] and [batch, k]; one advanced index does the rest.
    batch = int(np.prod(params.shape[:bd]))
    before = int(np.prod(params.shape[bd:axis]))
    p = params.reshape(batch, before, params.shape[axis], -1)
    i = indices.reshape(batch, 1, -1)
    y = p[np.arange(batch)[:, None, None], np.arange(before)[None, :, None], i]
    return y.reshape(params.shape[:axis] + indices.shape[bd:] + params.shape[axis + 1:])


@register("GATHER_ND")
def gather_nd(ctx: OpContext, params: Array, indices: Array) -> Array:
    """``out[i...] = params[indices[i..., :]]`` (the index vector picks leading axes)."""
    return params[_nd_index(indices, params.ndim, "gather_nd")]


def _check_embedding_lookup(ctx: OpContext) -> None:
    ids, table = ctx.inputs[0], ctx.inputs[1]
    if ids is not None and len(ids.shape) != 1:
        raise ValueError(f"embedding_lookup ids must be rank 1, got shape {list(ids.shape)}")
    if table is not None and len(table.shape) < 2:
        raise ValueError(f"embedding_lookup table must have rank >= 2, got shape "
                         f"{list(table.shape)}")
    if table is not None and ctx.outputs and table.dtype != ctx.outputs[0].dtype:
        raise NotImplementedError(f"embedding_lookup of a {table.dtype} table into "
                                  f"{ctx.outputs[0].dtype} (hybrid dequantizing lookup)")


@register("EMBEDDING_LOOKUP", check=_check_embedding_lookup)
def embedding_lookup(ctx: OpContext, ids: Array, table: Array) -> Array:
    """``table`` rows at the rank-1 ``ids``: output shape [len(ids)] + table.shape[1:]. An id
    outside the table gives a row as GATHER's does (LiteRT refuses the call)."""
    return xp(table, ids).take(table, ids, axis=0)


@register("SCATTER_ND")
def scatter_nd(ctx: OpContext, indices: Array, updates: Array, shape: Array) -> Array:
    """Zeros of the static ``shape`` with ``updates`` added at ``indices`` (duplicates sum)."""
    dims = ints(shape, "scatter_nd shape")
    where = _nd_index(indices, len(dims), "scatter_nd")
    expected = tuple(indices.shape[:-1]) + tuple(dims[len(where):])
    if tuple(updates.shape) != expected:
        raise ValueError(f"scatter_nd updates shape {list(updates.shape)} should be "
                         f"{list(expected)}")
    if xp(indices, updates) is np:
        out = np.zeros(dims, updates.dtype)
        np.add.at(out, where, updates)
        return out
    return jnp.zeros(dims, updates.dtype).at[where].add(updates)


@register("ONE_HOT")
def one_hot(ctx: OpContext, indices: Array, depth: Array, on_value: Array,
            off_value: Array) -> Array:
    """A new axis (``axis``, default last) of size ``depth``: on_value where it equals the
    index, off_value elsewhere (out-of-range indices give an all-off row)."""
    d = scalar(depth, "one_hot depth")
    axis = int(ctx.options.axis if ctx.options.axis is not None else -1)
    axis = indices.ndim if axis == -1 else axis_index(axis, indices.ndim + 1, "one_hot axis")
    m = xp(indices, on_value, off_value)
    hot = m.moveaxis(indices[..., None] == np.arange(d), -1, axis)
    dtype = on_value.dtype
    return m.where(hot, on_value.reshape(()), off_value.reshape(())).astype(dtype)


@register("CUMSUM")
def cumsum(ctx: OpContext, x: Array, axis: Array) -> Array:
    """Cumulative sum along ``axis``; ``exclusive`` starts at 0, ``reverse`` runs backwards."""
    a = axis_index(scalar(axis, "cumsum axis"), x.ndim, "cumsum axis")
    m = xp(x)
    y = m.flip(x, a) if ctx.options.reverse else x
    y = m.cumsum(y, axis=a, dtype=x.dtype)
    if ctx.options.exclusive and x.shape[a]:
        first = m.zeros_like(take_slice(y, a, 0, 1))
        y = m.concatenate([first, take_slice(y, a, 0, x.shape[a] - 1)], axis=a)
    return m.flip(y, a) if ctx.options.reverse else y


@register("TOPK_V2")
def topk_v2(ctx: OpContext, x: Array, k: Array) -> tuple[Array, Array]:
    """The k largest values along the last axis, descending, and their int32 indices;
    among equal values the lower index comes first."""
    n = scalar(k, "top_k k")
    if not 0 <= n <= x.shape[-1]:
        raise ValueError(f"top_k k={n} is out of range for a last axis of {x.shape[-1]}")
    dtype = index_dtype(ctx, None, "int32", output=1)
    if xp(x) is np:
        # ascending stable sort of the reversed row, read backwards: descending, and among
        # ties the lower original index first
        last = x.shape[-1] - 1
        order = (last - np.argsort(x[..., ::-1], axis=-1, kind="stable"))[..., ::-1][..., :n]
        return np.take_along_axis(x, order, axis=-1), order.astype(dtype)
    values, idx = lax.top_k(x, n)
    return values, idx.astype(dtype)


def _arg(ctx: OpContext, x: Array, axis: Array, fn: str) -> Array:
    a = axis_index(scalar(axis, f"{fn} axis"), x.ndim, f"{fn} axis")
    dtype = index_dtype(ctx, ctx.options.output_type, "int64")
    return getattr(xp(x), fn)(x, axis=a).astype(dtype)


@register("ARG_MAX")
def arg_max(ctx: OpContext, x: Array, axis: Array) -> Array:
    """Index of the largest value along ``axis`` (the first one among ties)."""
    return _arg(ctx, x, axis, "argmax")


@register("ARG_MIN")
def arg_min(ctx: OpContext, x: Array, axis: Array) -> Array:
    """Index of the smallest value along ``axis`` (the first one among ties)."""
    return _arg(ctx, x, axis, "argmin")
