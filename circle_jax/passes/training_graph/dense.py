"""Backward rules of the matrix products: FULLY_CONNECTED and BATCH_MATMUL.

FULLY_CONNECTED ``y = act(x2 @ W.T + b)`` with ``x2`` the input as rows of ``in`` values
(``keep_num_dims`` keeps the leading dimensions): with ``gz`` the cotangent before the
activation, ``gx2 = gz @ W``, ``gW = gz.T @ x2``, ``gb = sum over rows of gz``, each a
BATCH_MATMUL (``adjoint_lhs`` for the transposed operand) or a SUM.

BATCH_MATMUL ``y = op(x) @ op(w)`` (``op`` transposes the last two dimensions when the
operand's adjoint flag is set; the leading dimensions broadcast): each operand's cotangent
is a BATCH_MATMUL of the cotangent with the other operand, summed over the batch
dimensions broadcasting expanded for that operand, of rank 2 or more.
"""

from __future__ import annotations

import math

from .rule import Backward, Cotangents, Rule, activation_backward


def fully_connected(b: Backward) -> Cotangents:
    e = b.e
    n_out, n_in = b.shape(1)
    gz = activation_backward(b)
    rows = math.prod(e.shape(gz)) // n_out
    gz2 = e.reshape(gz, (rows, n_out))
    out: Cotangents = {}
    if 0 in b.wanted:
        out[0] = e.reshape(e.matmul(gz2, b.x(1)), b.shape(0))
    if 1 in b.wanted:
        out[1] = e.matmul(gz2, e.reshape(b.x(0), (rows, n_in)), adj_x=True)
    if 2 in b.wanted and b.has(2):
        out[2] = e.reduce("SUM", gz2, [0], keep_dims=False)
    return out


def batch_matmul(b: Backward) -> Cotangents:
    e, o = b.e, b.op.options
    adj_x, adj_y = bool(o.adjoint_lhs), bool(o.adjoint_rhs)
    x, w, g = b.x(0), b.x(1), b.grad
    out: Cotangents = {}
    if 0 in b.wanted:  # d/dx of x @ w is g @ w.T; of x.T @ w it is w @ g.T
        gx = e.matmul(w, g, adj_x=adj_y, adj_y=True) if adj_x else \
            e.matmul(g, w, adj_y=not adj_y)
        out[0] = e.unbroadcast(gx, b.shape(0))
    if 1 in b.wanted:  # d/dw of x @ w is x.T @ g; of x @ w.T it is g.T @ x
        gw = e.matmul(g, x, adj_x=True, adj_y=adj_x) if adj_y else \
            e.matmul(x, g, adj_x=not adj_x)
        out[1] = e.unbroadcast(gw, b.shape(1))
    return out


RULES = {"FULLY_CONNECTED": Rule(fully_connected),
         "BATCH_MATMUL": Rule(batch_matmul)}
