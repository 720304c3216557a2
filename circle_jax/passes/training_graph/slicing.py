"""Backward rules of the operators that cut a block out of a tensor or put one inside
another, their begins, sizes, strides and paddings constant:

- SLICE: the cotangent PADded with zeros back to the input's shape (``begin`` before each
  dimension, the rest after).
- STRIDED_SLICE (begin, end and shrink masks; every stride sign): the elements it selects
  are known when the graph is built (numpy's slicing of ``arange`` names their flat
  positions in the input: TFLite's bounds wrap negative values once and clamp, as Python's
  slices do), each once, so the cotangent is a GATHER from the flat cotangent with a zero
  appended: each input position takes its element's value, or the zero where none was
  selected, reshaped to the input (a GATHER of constant indices rather than SCATTER_ND,
  which onert's and TFLite Micro's kernels lack).
- PAD / PADV2: the SLICE of the cotangent where the input sits; PADV2's padding value gets
  the sum of the cotangent over the padding (all of it, less the input's part).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .rule import Backward, Cotangents, Rule


def _ints(b: Backward, pos: int) -> list[int]:
    return [int(v) for v in np.asarray(b.e.tensors[b.x(pos)].data).reshape(-1)]


def slice_(b: Backward) -> Cotangents:
    shape, out = b.shape(0), b.e.shape(b.y)
    begin = _ints(b, 1)
    return {0: b.e.pad(b.grad, [(lo, d - lo - n) for lo, d, n in zip(begin, shape, out)])}


def _bit(mask: int | None, i: int) -> bool:
    return bool((mask or 0) >> i & 1)


def selected(b: Backward) -> np.ndarray:
    """The flat input position of each element STRIDED_SLICE outputs (its output's shape)."""
    o, shape = b.op.options, b.shape(0)
    begin, end = _ints(b, 1), _ints(b, 2)
    strides = _ints(b, 3) if b.has(3) else [1] * len(begin)
    index: list[slice | int] = []
    for i, (lo, hi, step) in enumerate(zip(begin, end, strides)):
        if _bit(o.shrink_axis_mask, i):
            index.append(lo + shape[i] if lo < 0 else lo)
        else:
            index.append(slice(None if _bit(o.begin_mask, i) else lo,
                               None if _bit(o.end_mask, i) else hi, step))
    return np.arange(math.prod(shape)).reshape(shape)[tuple(index)]


def strided_slice(b: Backward) -> Cotangents:
    e, shape = b.e, b.shape(0)
    positions = selected(b).reshape(-1)
    source = np.full(math.prod(shape), positions.size, np.int32)  # the appended zero
    source[positions] = np.arange(positions.size)
    values = e.concat([e.reshape(b.grad, (positions.size,)), e.const(np.zeros(1, np.float32))],
                      0)
    flat = e.op("GATHER", [values, e.const(source, "int32")], (source.size,), {"axis": 0})
    return {0: e.reshape(flat, shape)}


def _strided_refusal(b: Backward) -> str | None:
    o = b.op.options
    if o.ellipsis_mask or o.new_axis_mask or o.offset:
        return "ellipsis, new-axis or offset masks"
    if any(b.e.tensors[b.x(p)].data is None for p in range(1, len(b.op.inputs)) if b.has(p)):
        return "computed begin, end or strides"
    if selected(b).shape != b.e.shape(b.y):
        return "bounds whose slice differs from the output's shape"
    return None


def pad(b: Backward) -> Cotangents:
    e, shape = b.e, b.shape(0)
    pairs = np.asarray(_ints(b, 1)).reshape(-1, 2)
    gx = e.slice(b.grad, [int(lo) for lo, _ in pairs], shape)
    out: Cotangents = {0: gx}
    if 2 in b.wanted:
        axes = list(range(len(shape)))
        rest = e.sub(e.reduce("SUM", b.grad, axes, False), e.reduce("SUM", gx, axes, False))
        out[2] = e.reshape(rest, b.shape(2))
    return out


def _constant(*positions: int) -> Callable[[Backward], str | None]:
    def refuse(b: Backward) -> str | None:
        if any(b.e.tensors[b.x(p)].data is None for p in positions):
            return "computed begin, size or paddings"
        return None
    return refuse


RULES = {"SLICE": Rule(slice_, _constant(1)),
         "STRIDED_SLICE": Rule(strided_slice, _strided_refusal),
         "PAD": Rule(pad, _constant(1)), "PADV2": Rule(pad, _constant(1))}
