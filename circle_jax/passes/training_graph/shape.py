"""Backward rules of the operators that move values without computing: RESHAPE, SQUEEZE,
EXPAND_DIMS (the cotangent reshaped to the input's shape) and TRANSPOSE (transposed by the
inverse permutation, read from the constant ``perm``)."""

from __future__ import annotations

import numpy as np

from .rule import Backward, Cotangents, Rule


def reshape(b: Backward) -> Cotangents:
    return {0: b.e.reshape(b.grad, b.shape(0))}


def transpose(b: Backward) -> Cotangents:
    perm = b.e.tensors[b.x(1)].data
    return {0: b.e.transpose(b.grad, list(np.argsort(np.asarray(perm).reshape(-1))))}


def _constant_perm(b: Backward) -> str | None:
    return None if b.e.tensors[b.x(1)].data is not None else "a computed permutation"


RULES = {"RESHAPE": Rule(reshape), "SQUEEZE": Rule(reshape), "EXPAND_DIMS": Rule(reshape),
         "TRANSPOSE": Rule(transpose, _constant_perm)}
