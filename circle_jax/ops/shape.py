"""Shape and data-movement operators: reshape, slicing, padding, concatenation, tiling ...

Every shape, axis, permutation, padding and slice bound must be static (known when the model
is lowered). When all inputs of an operator are static numpy arrays the operator computes with
numpy, so constant folding keeps the model's dtypes exactly (jnp would turn int64 into int32
when x64 is off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .common import fused_activation, is_static, static
from .registry import OpContext, register

Array = Any  # a jax array, or a numpy array for static values

# TensorType codes of the index dtypes (the ops layer does not import the schema bindings).
_INDEX_TYPES = {2: "int32", 4: "int64"}


# ---------------------------------------------------------------- helpers shared by the family


def xp(*arrays: Any) -> Any:
    """numpy when every given (non-None) input is static, else jax.numpy."""
    return np if all(a is None or is_static(a) for a in arrays) else jnp


def ints(x: Any, what: str) -> list[int]:
    """A static integer tensor as a flat list of Python ints; a ValueError for values that
    are no integers (a float tensor holding infinity, NaN or fractions)."""
    values = static(x, what).reshape(-1)
    if not np.issubdtype(values.dtype, np.integer) and not (
            np.all(np.isfinite(values)) and np.all(values == np.round(values))):
        raise ValueError(f"{what} must hold integers, got {values.dtype} values "
                         f"{values[:4].tolist()}")
    return [int(v) for v in values]


def scalar(x: Any, what: str) -> int:
    """A static scalar (or one-element) integer tensor."""
    values = ints(x, what)
    if len(values) != 1:
        raise ValueError(f"{what} must hold one value, got {len(values)}")
    return values[0]


def axis_index(axis: int, rank: int, what: str = "axis") -> int:
    """A non-negative axis in [0, rank); negative axes count from the end."""
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def index_dtype(ctx: OpContext, code: int | None, default: str = "int64",
                output: int = 0) -> np.dtype:
    """An int32/int64 output dtype from a TensorType option, else the declared output dtype.

    A TensorType option left at its schema default (0, FLOAT32) counts as unset.
    """
    candidates = [_INDEX_TYPES.get(code)]
    if len(ctx.outputs) > output:
        candidates.append(ctx.outputs[output].dtype)
    for name in candidates:
        if name in ("int32", "int64"):
            return np.dtype(name)
    return np.dtype(default)


def take_slice(x: Array, axis: int, start: int, stop: int) -> Array:
    """``x[..., start:stop, ...]`` along ``axis``."""
    return x[(slice(None),) * axis + (slice(start, stop),)]


def split_sizes(x: Array, axis: int, sizes: Sequence[int]) -> tuple[Array, ...]:
    """Consecutive slices of ``x`` along ``axis`` with the given sizes."""
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return tuple(take_slice(x, axis, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))


def _numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ---------------------------------------------------------------- reshapes


def _infer_shape(shape: list[int], size: int, x_shape: tuple[int, ...]) -> list[int]:
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1:
        raise ValueError(f"new shape {shape} has more than one -1")
    if unknown:
        rest = _numel([d for d in shape if d != -1])
        if rest == 0 or size % rest:
            raise ValueError(f"cannot reshape {list(x_shape)} into {shape}")
        shape[unknown[0]] = size // rest
    return shape


@register("RESHAPE")
def reshape(ctx: OpContext, x: Array, new_shape: Array = None) -> Array:
    """Reshape to the static shape input (1-D) or ``options.new_shape`` (one -1 allowed).

    Batch following (onert's convention): a model declared with batch 1 must run at any batch
    size. When the input's leading dimension differs from the declared one and the requested
    leading dimension equals the declared batch, that leading dimension becomes -1 if the
    requested shape has no -1 and does not fit the input's element count; if it has a -1
    elsewhere and the input is the declared one with another leading dimension, the result
    is the declared input's result with that leading dimension (each sample keeps its size:
    `circle_jax.graph.batching` runs a graph batched only where this holds).
    """
    if new_shape is not None and np.ndim(static(new_shape, "reshape shape")) == 1:
        shape = ints(new_shape, "reshape shape")
    elif ctx.options.new_shape is not None:
        shape = [int(d) for d in ctx.options.new_shape]
        if shape == [0]:  # legacy TFLite spelling of a scalar
            shape = []
    else:
        shape = list(ctx.outputs[0].shape)
    size = _numel(x.shape)
    declared = ctx.inputs[0].shape if ctx.inputs and ctx.inputs[0] is not None else None
    if (
        -1 not in shape and _numel(shape) != size and shape and declared
        and x.ndim == len(declared) and x.shape[0] != declared[0] and shape[0] == declared[0]
        and _numel(shape[1:]) and size % _numel(shape[1:]) == 0
    ):
        shape[0] = -1
    elif (
        shape and declared and -1 in shape[1:] and x.ndim == len(declared)
        and x.shape[0] != declared[0] and tuple(x.shape[1:]) == tuple(declared[1:])
        and shape[0] == declared[0]
    ):
        shape = [-1, *_infer_shape(list(shape), _numel(declared), tuple(declared))[1:]]
    shape = _infer_shape(shape, size, x.shape)
    if _numel(shape) != size:
        raise ValueError(f"cannot reshape {list(x.shape)} ({size} elements) into {shape}")
    return x.reshape(shape)


@register("SQUEEZE")
def squeeze(ctx: OpContext, x: Array) -> Array:
    """Drop the listed size-1 axes (``squeeze_dims``), or every size-1 axis when empty."""
    dims = ctx.options.squeeze_dims or ()
    drop = {axis_index(int(d), x.ndim, "squeeze dim") for d in dims} if dims else {
        i for i, d in enumerate(x.shape) if d == 1
    }
    for i in drop:
        if x.shape[i] != 1:
            raise ValueError(f"cannot squeeze axis {i} of size {x.shape[i]}")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in drop])


@register("EXPAND_DIMS")
def expand_dims(ctx: OpContext, x: Array, axis: Array) -> Array:
    a = axis_index(scalar(axis, "expand_dims axis"), x.ndim + 1)
    return x.reshape(x.shape[:a] + (1,) + x.shape[a:])


@register("TRANSPOSE")
def transpose(ctx: OpContext, x: Array, perm: Array) -> Array:
    return xp(x).transpose(x, ints(perm, "transpose permutation"))


# ---------------------------------------------------------------- joining and splitting


@register("CONCATENATION")
def concatenation(ctx: OpContext, *xs: Array) -> Array:
    axis = axis_index(int(ctx.options.axis or 0), xs[0].ndim)
    y = xp(*xs).concatenate(xs, axis=axis)
    return fused_activation(y, ctx.options.fused_activation_function)


@register("PACK")
def pack(ctx: OpContext, *xs: Array) -> Array:
    axis = axis_index(int(ctx.options.axis or 0), xs[0].ndim + 1)
    return xp(*xs).stack(xs, axis=axis)


@register("UNPACK")
def unpack(ctx: OpContext, x: Array) -> tuple[Array, ...]:
    axis = axis_index(int(ctx.options.axis or 0), x.ndim)
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(x.shape[axis]))


@register("SPLIT")
def split(ctx: OpContext, axis: Array, x: Array) -> tuple[Array, ...]:
    """Split evenly into ``num_splits`` parts (the axis is the FIRST input)."""
    a = axis_index(scalar(axis, "split axis"), x.ndim)
    n = int(ctx.options.num_splits or len(ctx.outputs))
    if n <= 0 or x.shape[a] % n:
        raise ValueError(f"axis {a} of size {x.shape[a]} cannot be split into {n} equal parts")
    return split_sizes(x, a, [x.shape[a] // n] * n)


@register("SPLIT_V")
def split_v(ctx: OpContext, x: Array, size_splits: Array, axis: Array) -> tuple[Array, ...]:
    """Split into parts of the given sizes; one size may be -1 (the remainder)."""
    a = axis_index(scalar(axis, "split_v axis"), x.ndim)
    sizes = ints(size_splits, "split_v size_splits")
    if sizes.count(-1) > 1:
        raise ValueError(f"size_splits {sizes} has more than one -1")
    if -1 in sizes:
        sizes[sizes.index(-1)] = x.shape[a] - sum(s for s in sizes if s != -1)
    if sum(sizes) != x.shape[a] or min(sizes) < 0:
        raise ValueError(f"size_splits {sizes} do not add up to axis size {x.shape[a]}")
    return split_sizes(x, a, sizes)


# ---------------------------------------------------------------- slicing


@register("SLICE")
def slice_(ctx: OpContext, x: Array, begin: Array, size: Array) -> Array:
    """``x[begin : begin + size]`` per axis; a size of -1 means "to the end"."""
    starts, sizes = ints(begin, "slice begin"), ints(size, "slice size")
    index = []
    for d, (b, s) in enumerate(zip(starts, sizes)):
        stop = x.shape[d] if s == -1 else b + s
        if not 0 <= b <= stop <= x.shape[d]:
            raise ValueError(f"slice [{b}, {stop}) is out of range for axis {d} of size "
                             f"{x.shape[d]}")
        index.append(slice(b, stop))
    return x[tuple(index)]


def _bit(mask: int | None, i: int) -> bool:
    return bool((mask or 0) >> i & 1)


def _slice_bounds(size: int, begin: int, end: int, stride: int, begin_masked: bool,
                  end_masked: bool, shrink: bool) -> tuple[int, int]:
    """TFLite's start/stop of one axis: wrap negatives, clamp, then apply the masks."""
    if size == 0:
        return 0, 0
    lo, hi = (0, size) if stride > 0 else (-1, size - 1)
    start = min(max(begin + size if begin < 0 else begin, lo), hi)
    if begin_masked:
        start = 0 if stride > 0 else size - 1
    if shrink:
        if not 0 <= start < size:
            raise ValueError(f"strided_slice index {begin} is out of range for an axis of {size}")
        return start, start + (1 if stride > 0 else -1)
    stop = min(max(end + size if end < 0 else end, lo), hi)
    if end_masked:
        stop = size if stride > 0 else -1
    return start, stop


def _python_slice(start: int, stop: int, stride: int) -> slice:
    """A Python slice selecting exactly TFLite's elements start, start+stride, ... < stop."""
    count = max(0, -(-(stop - start) // stride))
    if count == 0:
        return slice(0, 0)
    last = start + (count - 1) * stride
    end = last + 1 if stride > 0 else last - 1
    return slice(start, None if end < 0 else end, stride)


@register("STRIDED_SLICE")
def strided_slice(ctx: OpContext, x: Array, begin: Array, end: Array,
                  strides: Array = None) -> Array:
    """TFLite's strided slice with every mask and the ``offset`` option.

    The i-th entry of begin/end/strides is, in order of precedence: an ellipsis (bit i of
    ellipsis_mask; it stands for as many full axes as the other entries leave), a new axis of
    size 1 (new_axis_mask), or a range of one input axis. Axes after the last entry are kept
    whole. For a range, negative bounds count from the end and are clamped to the axis;
    begin_mask / end_mask bits select the whole extent in the stride's direction;
    shrink_axis_mask keeps the single element at begin and drops the axis (LiteRT 2.3 leaves
    that element unwritten when the stride is negative; here it is the element at begin).
    With ``offset`` see ``_offset_slice``.
    """
    o = ctx.options
    e = ints(end, "strided_slice end")
    s = ints(strides, "strided_slice strides") if strides is not None else [1] * len(e)
    if o.offset:
        return _offset_slice(x, begin, e, s, o)
    b = ints(begin, "strided_slice begin")
    if not len(b) == len(e) == len(s):
        raise ValueError("strided_slice begin, end and strides must have the same length")
    if 0 in s:
        raise ValueError("strided_slice stride 0 is not allowed")
    n = len(b)
    ellipses = [i for i in range(n) if _bit(o.ellipsis_mask, i)]
    if len(ellipses) > 1:
        raise ValueError("strided_slice allows one ellipsis only")
    new_axes = {i for i in range(n) if _bit(o.new_axis_mask, i) and i not in ellipses}
    ranges = n - len(new_axes) - len(ellipses)
    spread = x.ndim - ranges  # input axes the ellipsis (explicit or trailing) stands for
    if spread < 0:
        raise ValueError(f"strided_slice has {ranges} ranges for an input of rank {x.ndim}")
    if spread == 0 and ellipses:  # LiteRT widens it to one axis and drops the last range
        raise NotImplementedError("strided_slice with an ellipsis that stands for no axis")
    entries = list(range(n)) + ([] if ellipses else [-1])  # -1: the implicit trailing ellipsis
    shape, index, keep, axis = [], [], [], 0
    for i in entries:
        if i == -1 or i in ellipses:
            for _ in range(spread):
                shape.append(x.shape[axis])
                index.append(slice(None))
                keep.append(x.shape[axis])
                axis += 1
        elif i in new_axes:
            shape.append(1)
            index.append(slice(None))
            keep.append(1)
        else:
            size = x.shape[axis]
            shrink = _bit(o.shrink_axis_mask, i)
            start, stop = _slice_bounds(size, b[i], e[i], s[i], _bit(o.begin_mask, i),
                                        _bit(o.end_mask, i), shrink)
            sl = _python_slice(start, stop, s[i])
            shape.append(size)
            index.append(sl)
            if not shrink:
                keep.append(len(range(*sl.indices(size))))
            axis += 1
    y = x.reshape(shape)[tuple(index)]
    return y.reshape(keep)


def _offset_slice(x: Array, begin: Array, extents: list[int], strides: list[int],
                  o: Any) -> Array:
    """STRIDED_SLICE with ``offset``: end[i] is the extent of the slice from begin[i].

    TFLite's converter emits it for run-time begins: the output shape, ceil(end / stride) per
    axis, does not depend on begin, so begin may be a run-time tensor here (then it is
    clamped so that the slice stays inside the input, as lax.dynamic_slice does; LiteRT
    would read out of bounds). LiteRT sizes the output from end alone, ignoring the masks, so
    only the consistent subset is supported: one positive-stride range per input axis,
    begin_mask and shrink_axis_mask, no ellipsis, new-axis or end masks.
    """
    if (o.ellipsis_mask or o.new_axis_mask or o.end_mask or len(extents) != x.ndim
            or len(strides) != x.ndim or min(strides, default=1) <= 0
            or min(extents, default=0) < 0):
        raise NotImplementedError(
            "strided_slice with offset supports one positive-stride range per input axis "
            "with begin/shrink masks only (no ellipsis, new-axis or end masks)")
    shrink = [_bit(o.shrink_axis_mask, i) for i in range(x.ndim)]
    sizes = [1 if sh else ext for ext, sh in zip(extents, shrink)]
    masked = [_bit(o.begin_mask, i) for i in range(x.ndim)]
    if is_static(begin):
        starts = ints(begin, "strided_slice begin")
        index = []
        for d, (v, size, m) in enumerate(zip(starts, sizes, masked)):
            start = 0 if m else min(max(v + x.shape[d] if v < 0 else v, 0), x.shape[d])
            if start + size > x.shape[d]:
                raise ValueError(f"strided_slice offset range [{start}, {start + size}) is out "
                                 f"of range for axis {d} of size {x.shape[d]}")
            index.append(slice(start, start + size))
        y = x[tuple(index)]
    else:
        b = jnp.asarray(begin).reshape(-1)
        starts = [0 if m else jnp.where(b[d] < 0, b[d] + x.shape[d], b[d])
                  for d, m in enumerate(masked)]
        y = lax.dynamic_slice(jnp.asarray(x), starts, sizes)
    y = y[tuple(slice(None, None, st) for st in strides)]
    return y.reshape([-(-size // st) for size, st, sh in zip(sizes, strides, shrink) if not sh])


# ---------------------------------------------------------------- padding, tiling, broadcasting


def pad_pairs(paddings: Array, rank: int, what: str) -> list[tuple[int, int]]:
    """(before, after) per axis from a static [rank, 2] paddings tensor (non-negative)."""
    p = ints(paddings, what)
    if len(p) != 2 * rank:
        raise ValueError(f"{what} must have shape [{rank}, 2], got {len(p)} values")
    pairs = list(zip(p[0::2], p[1::2]))
    if min(p, default=0) < 0:
        raise ValueError(f"{what} {pairs} must not be negative")
    return pairs


@register("PAD", "PADV2")
def pad(ctx: OpContext, x: Array, paddings: Array, value: Array = None) -> Array:
    """Constant padding: zeros (PAD) or the scalar third input (PADV2)."""
    pairs = pad_pairs(paddings, x.ndim, "paddings")
    if value is None:
        return xp(x).pad(x, pairs)
    if xp(x, value) is np:
        return np.pad(x, pairs, constant_values=np.asarray(value).reshape(()))
    value = jnp.asarray(value, dtype=x.dtype).reshape(())
    return lax.pad(jnp.asarray(x), value, [(lo, hi, 0) for lo, hi in pairs])


@register("MIRROR_PAD")
def mirror_pad(ctx: OpContext, x: Array, paddings: Array) -> Array:
    """Mirror padding: mode REFLECT (0, edge not repeated) or SYMMETRIC (1, edge repeated)."""
    mode = {0: "reflect", 1: "symmetric"}[int(ctx.options.mode or 0)]
    pairs = pad_pairs(paddings, x.ndim, "paddings")
    limit = 1 if mode == "reflect" else 0
    for d, (lo, hi) in enumerate(pairs):
        if max(lo, hi) > x.shape[d] - limit:
            raise ValueError(f"{mode} padding {(lo, hi)} is too large for axis {d} of size "
                             f"{x.shape[d]}")
    return xp(x).pad(x, pairs, mode=mode)


@register("TILE")
def tile(ctx: OpContext, x: Array, multiples: Array) -> Array:
    return xp(x).tile(x, ints(multiples, "tile multiples"))


@register("BROADCAST_TO")
def broadcast_to(ctx: OpContext, x: Array, shape: Array) -> Array:
    return xp(x).broadcast_to(x, ints(shape, "broadcast_to shape"))


@register("REVERSE_V2")
def reverse_v2(ctx: OpContext, x: Array, axis: Array) -> Array:
    axes = tuple(axis_index(a, x.ndim) for a in ints(axis, "reverse axis"))
    return xp(x).flip(x, axis=axes) if axes else x


# ---------------------------------------------------------------- shapes and constants


@register("SHAPE")
def shape(ctx: OpContext, x: Array) -> np.ndarray:
    """The input's run-time shape, a static array of ``out_type`` (int32 or int64)."""
    return np.asarray(x.shape, index_dtype(ctx, ctx.options.out_type, "int32"))


@register("RANK")
def rank(ctx: OpContext, x: Array) -> np.ndarray:
    return np.asarray(x.ndim, np.int32)


@register("FILL")
def fill(ctx: OpContext, dims: Array, value: Array) -> Array:
    """An array of shape ``dims`` filled with the scalar ``value`` (of ``value``'s dtype)."""
    return xp(value).broadcast_to(value.reshape(()), ints(dims, "fill dims"))


@register("ZEROS_LIKE")
def zeros_like(ctx: OpContext, x: Array) -> np.ndarray:
    """Zeros of the input's run-time shape and dtype, as a static array."""
    return np.zeros(x.shape, x.dtype)


@register("BROADCAST_ARGS")
def broadcast_args(ctx: OpContext, s0: Array, s1: Array) -> np.ndarray:
    """The broadcast of two static shapes (numpy rules), in their integer dtype."""
    a, b = static(s0, "broadcast_args shape"), static(s1, "broadcast_args shape")
    return np.asarray(np.broadcast_shapes(tuple(a.tolist()), tuple(b.tolist())), a.dtype)


@register("RANGE")
def range_(ctx: OpContext, start: Array, limit: Array, delta: Array) -> np.ndarray:
    """start, start+delta, ... up to (excluding) limit, accumulated in the input dtype (its
    three inputs are static: `circle_jax.graph.params_policy.STATIC_INPUTS`)."""
    s, lim, d = (static(v, f"range {w}") for v, w in
                 ((start, "start"), (limit, "limit"), (delta, "delta")))
    dtype = s.dtype
    s, lim, d = (np.asarray(v, dtype).reshape(()) for v in (s, lim, d))
    if d == 0:
        raise ValueError("range delta must not be 0")
    if (lim - s) * d < 0:
        raise ValueError(f"range start {s}, limit {lim} and delta {d} are inconsistent")
    count = int(np.ceil(abs(float(lim) - float(s)) / abs(float(d))))
    if count == 0:
        return np.zeros((0,), dtype)
    steps = np.full((count,), d, dtype)
    steps[0] = s
    return np.add.accumulate(steps, dtype=dtype)  # TFLite adds delta step by step


@register("WHERE")
def where(ctx: OpContext, condition: Array, *rest: Array) -> np.ndarray:
    """Coordinates (int64, row-major order) of the true elements of a static condition."""
    if any(r is not None for r in rest):
        raise NotImplementedError("WHERE with x/y inputs is not supported (use SELECT_V2)")
    if not is_static(condition):
        raise ValueError(
            "WHERE's output shape depends on the values of its condition, which must be a "
            "constant known when the model is lowered (dynamic shapes are not supported)"
        )
    return np.argwhere(np.asarray(condition).astype(bool)).astype(np.int64)


# ---------------------------------------------------------------- space <-> depth and batch


def _blocks_to_channels(x: Array, b: int) -> Array:
    n, h, w, c = x.shape
    if h % b or w % b:
        raise ValueError(f"spatial size {h}x{w} is not a multiple of block size {b}")
    y = x.reshape(n, h // b, b, w // b, b, c)
    return xp(x).transpose(y, (0, 1, 3, 2, 4, 5)).reshape(n, h // b, w // b, b * b * c)


@register("SPACE_TO_DEPTH")
def space_to_depth(ctx: OpContext, x: Array) -> Array:
    """NHWC: each b x b block becomes b*b*C channels, ordered (block row, block col, c)."""
    return _blocks_to_channels(x, int(ctx.options.block_size))


@register("DEPTH_TO_SPACE")
def depth_to_space(ctx: OpContext, x: Array) -> Array:
    """NHWC, DCR order: channel (i*b + j)*C' + c goes to pixel (h*b + i, w*b + j)."""
    b = int(ctx.options.block_size)
    n, h, w, c = x.shape
    if c % (b * b):
        raise ValueError(f"{c} channels are not a multiple of block size {b} squared")
    y = x.reshape(n, h, w, b, b, c // (b * b))
    return xp(x).transpose(y, (0, 1, 3, 2, 4, 5)).reshape(n, h * b, w * b, c // (b * b))


def _block_shape(block_shape: Array, x: Array) -> list[int]:
    blocks = ints(block_shape, "block_shape")
    if not blocks or len(blocks) > x.ndim - 1 or min(blocks) < 1:
        raise ValueError(f"block_shape {blocks} does not fit an input of rank {x.ndim}")
    return blocks


@register("SPACE_TO_BATCH_ND")
def space_to_batch_nd(ctx: OpContext, x: Array, block_shape: Array, paddings: Array) -> Array:
    """Pad the M spatial axes, then move each block offset into the batch (offset-major)."""
    blocks = _block_shape(block_shape, x)
    m = len(blocks)
    pairs = pad_pairs(paddings, m, "space_to_batch paddings")
    x = xp(x).pad(x, [(0, 0)] + pairs + [(0, 0)] * (x.ndim - 1 - m))
    batch, spatial, rest = x.shape[0], x.shape[1:1 + m], x.shape[1 + m:]
    if any(s % k for s, k in zip(spatial, blocks)):
        raise ValueError(f"padded spatial shape {spatial} is not a multiple of {blocks}")
    split = [batch] + [v for s, k in zip(spatial, blocks) for v in (s // k, k)] + list(rest)
    perm = ([2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)]
            + list(range(1 + 2 * m, 1 + 2 * m + len(rest))))
    y = xp(x).transpose(x.reshape(split), perm)
    return y.reshape([batch * _numel(blocks)] + [s // k for s, k in zip(spatial, blocks)]
                     + list(rest))


@register("BATCH_TO_SPACE_ND")
def batch_to_space_nd(ctx: OpContext, x: Array, block_shape: Array, crops: Array) -> Array:
    """The inverse of SPACE_TO_BATCH_ND: batch blocks back into space, then crop."""
    blocks = _block_shape(block_shape, x)
    m = len(blocks)
    pairs = pad_pairs(crops, m, "batch_to_space crops")
    batch, spatial, rest = x.shape[0], x.shape[1:1 + m], x.shape[1 + m:]
    if batch % _numel(blocks):
        raise ValueError(f"batch {batch} is not a multiple of the block volume {blocks}")
    n = batch // _numel(blocks)
    y = x.reshape(list(blocks) + [n] + list(spatial) + list(rest))
    perm = [m] + [v for i in range(m) for v in (m + 1 + i, i)] + list(
        range(2 * m + 1, 2 * m + 1 + len(rest)))
    y = xp(x).transpose(y, perm).reshape([n] + [s * k for s, k in zip(spatial, blocks)]
                                         + list(rest))
    index = [slice(None)] + [slice(lo, y.shape[1 + i] - hi) for i, (lo, hi) in enumerate(pairs)]
    return y[tuple(index)]
