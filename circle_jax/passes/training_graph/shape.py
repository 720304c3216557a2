"""Backward rules of the operators that move values without computing: RESHAPE, SQUEEZE,
EXPAND_DIMS (the cotangent reshaped to the input's shape), TRANSPOSE (transposed by the
inverse permutation, read from the constant ``perm``), and the joins and splits along a
constant axis:

- CONCATENATION: each input's cotangent is its SLICE of the cotangent before the fused
  activation, at the input's offset along the axis.
- SPLIT (inputs: axis, x) and SPLIT_V (inputs: x, sizes, axis): the input's cotangent is the
  CONCATENATION of the outputs' cotangents along the axis, zeros for an output the loss
  does not read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .rule import Backward, Cotangents, Rule, activation_backward


def reshape(b: Backward) -> Cotangents:
    return {0: b.e.reshape(b.grad, b.shape(0))}


def transpose(b: Backward) -> Cotangents:
    perm = b.e.tensors[b.x(1)].data
    return {0: b.e.transpose(b.grad, list(np.argsort(np.asarray(perm).reshape(-1))))}


def _constant(pos: int, what: str) -> Callable[[Backward], str | None]:
    def refuse(b: Backward) -> str | None:
        return None if b.e.tensors[b.x(pos)].data is not None else f"a computed {what}"
    return refuse


def concatenation(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    shape = e.shape(gz)
    axis = int(b.op.options.axis or 0) % len(shape)
    out: Cotangents = {}
    offset = 0
    for p in range(len(b.op.inputs)):
        size = b.shape(p)
        if p in b.wanted:
            begin = [offset if k == axis else 0 for k in range(len(shape))]
            out[p] = e.slice(gz, begin, size)
        offset += size[axis]
    return out


def split(b: Backward) -> Cotangents:
    axis = int(np.asarray(b.e.tensors[b.x(0)].data).reshape(())) % len(b.shape(1))
    parts = [b.cotangent(k) for k in range(len(b.op.outputs))]
    return {1: b.e.concat(parts, axis)}


def split_v(b: Backward) -> Cotangents:
    axis = int(np.asarray(b.e.tensors[b.x(2)].data).reshape(())) % len(b.shape(0))
    parts = [b.cotangent(k) for k in range(len(b.op.outputs))]
    return {0: b.e.concat(parts, axis)}


RULES = {"RESHAPE": Rule(reshape), "SQUEEZE": Rule(reshape), "EXPAND_DIMS": Rule(reshape),
         "TRANSPOSE": Rule(transpose, _constant(1, "permutation")),
         "CONCATENATION": Rule(concatenation),
         "SPLIT": Rule(split, _constant(0, "axis"), many_outputs=True),
         "SPLIT_V": Rule(split_v, _constant(2, "axis"), many_outputs=True)}
