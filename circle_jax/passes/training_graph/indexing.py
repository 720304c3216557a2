"""Backward rules of GATHER (``batch_dims`` 0) and GATHER_ND: the cotangent of the params,
an embedding table among them, from the output's cotangent ``g``.

GATHER: ``g`` has the shape ``params[:axis] + indices + params[axis+1:]``.
``g`` is transposed to put the index dimensions first and flattened to one row per index,
``[m, r]``; the table's cotangent with the gathered axis first is ``onehot^T @ rows``, the
one-hot ``[m, n]`` of the indices an EQUAL of them against ``0..n-1`` (an index gathered
twice gets the sum of its rows), transposed back to the params' layout. A product rather
than SCATTER_ND, which onert's and TFLite Micro's kernels lack; it costs the ``m x n``
one-hot (a 10,000-word vocabulary read by 512 tokens: 20 MB). The indices are int32 or
int64 (CAST to int32) and lie in ``[0, params.shape[axis])`` (LiteRT's GATHER refuses
others). The indices get no cotangent.

GATHER_ND: ``g`` has the shape ``indices[:-1] + params[k:]`` (``k = indices[-1]``), a row of
``params[k:]`` per index row, as SCATTER_ND takes its updates: SCATTER_ND of ``g`` at the
indices (CAST to int32) into zeros of the params' shape is the cotangent, rows of repeated
indices added up.
"""

from __future__ import annotations

import math

import numpy as np

from .rule import Backward, Cotangents, Rule


def gather(b: Backward) -> Cotangents:
    e = b.e
    params, indices = b.shape(0), b.shape(1)
    axis = int(b.op.options.axis or 0) % len(params)
    before, after = params[:axis], params[axis + 1:]
    ni = len(indices)
    # g: before + indices + after -> indices + before + after
    perm = [*range(axis, axis + ni), *range(axis), *range(axis + ni, axis + ni + len(after))]
    n, m, r = params[axis], math.prod(indices), math.prod(before) * math.prod(after)
    rows = e.reshape(e.transpose(b.grad, perm) if perm != sorted(perm) else b.grad, (m, r))
    ind = b.x(1)
    if e.dtype(ind) != "int32":
        ind = e.op("CAST", [ind], indices, dtype="int32")
    onehot = e.mask("EQUAL", e.reshape(ind, (m, 1)), e.const(np.arange(n)[None], "int32"))
    table = e.reshape(e.matmul(onehot, rows, adj_x=True), (n, *before, *after))
    # table: [n] + before + after -> before + [n] + after
    back = [*range(1, axis + 1), 0, *range(axis + 1, len(params))]
    return {0: e.transpose(table, back) if axis else table}


def gather_nd(b: Backward) -> Cotangents:
    e = b.e
    ind = b.x(1)
    if e.dtype(ind) != "int32":
        ind = e.op("CAST", [ind], b.shape(1), dtype="int32")
    return {0: e.scatter_nd(ind, b.grad, b.shape(0))}


def _refusal(b: Backward) -> str | None:
    if b.op.options.batch_dims:
        return f"batch_dims {b.op.options.batch_dims} (the rule: 0)"
    return None


RULES = {"GATHER": Rule(gather, _refusal), "GATHER_ND": Rule(gather_nd)}
