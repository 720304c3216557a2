"""Backward rules of the reductions over constant axes: SUM spreads the cotangent over the
reduced axes (BROADCAST_TO of it reshaped with those axes kept), MEAN also divides it by
the number of values each output averages; REDUCE_MAX and REDUCE_MIN give each output's
cotangent to the inputs equal to it, split equally among ties (TF's rule, and circle-jax's
`circle_jax.ops.reduce`)."""

from __future__ import annotations

import math

import numpy as np

from .rule import Backward, Cotangents, Rule


def _axes(b: Backward) -> list[int]:
    rank = len(b.shape(0))
    return sorted({int(a) % rank for a in np.asarray(b.e.tensors[b.x(1)].data).reshape(-1)})


def _spread(b: Backward) -> int:
    e, shape = b.e, b.shape(0)
    axes = _axes(b)
    kept = [1 if k in axes else d for k, d in enumerate(shape)]
    return e.broadcast_to(e.reshape(b.grad, kept), shape)


def sum_(b: Backward) -> Cotangents:
    return {0: _spread(b)}


def mean(b: Backward) -> Cotangents:
    count = math.prod(b.shape(0)[k] for k in _axes(b))
    return {0: b.e.scale(_spread(b), 1.0 / count)}


def extremum(b: Backward) -> Cotangents:
    e, shape = b.e, b.shape(0)
    kept = [1 if k in _axes(b) else d for k, d in enumerate(shape)]
    chosen = e.mask("EQUAL", b.x(0), e.reshape(b.y, kept))
    share = e.div(chosen, e.reduce("SUM", chosen, _axes(b), keep_dims=True))
    return {0: e.mul(share, e.reshape(b.grad, kept))}


def _constant_axes(b: Backward) -> str | None:
    return None if b.e.tensors[b.x(1)].data is not None else "computed axes"


RULES = {"SUM": Rule(sum_, _constant_axes), "MEAN": Rule(mean, _constant_axes),
         "REDUCE_MAX": Rule(extremum, _constant_axes),
         "REDUCE_MIN": Rule(extremum, _constant_axes)}
