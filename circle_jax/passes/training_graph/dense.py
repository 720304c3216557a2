"""Backward rules of the matrix products: FULLY_CONNECTED and BATCH_MATMUL (rank 2).

FULLY_CONNECTED ``y = act(x2 @ W.T + b)`` with ``x2`` the input as rows of ``in`` values
(``keep_num_dims`` keeps the leading dimensions): with ``gz`` the cotangent before the
activation, ``gx2 = gz @ W``, ``gW = gz.T @ x2``, ``gb = sum over rows of gz``, each a
BATCH_MATMUL (``adjoint_lhs`` for the transposed operand) or a SUM.
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
    """``y = op(x) @ op(w)`` of rank-2 operands (``op`` transposes when adjoint)."""
    e, o = b.e, b.op.options
    adj_x, adj_y = bool(o.adjoint_lhs), bool(o.adjoint_rhs)
    x, w, g = b.x(0), b.x(1), b.grad
    out: Cotangents = {}
    if 0 in b.wanted:  # d/dx of x @ w is g @ w.T; of x.T @ w it is w @ g.T
        out[0] = e.matmul(w, g, adj_x=adj_y, adj_y=True) if adj_x else \
            e.matmul(g, w, adj_y=not adj_y)
    if 1 in b.wanted:  # d/dw of x @ w is x.T @ g; of x @ w.T it is g.T @ x
        out[1] = e.matmul(g, x, adj_x=True, adj_y=adj_x) if adj_y else \
            e.matmul(x, g, adj_x=not adj_x)
    return out


def _rank2(b: Backward) -> str | None:
    if len(b.shape(0)) != 2 or len(b.shape(1)) != 2:
        return f"operands of rank {len(b.shape(0))} and {len(b.shape(1))} (the rule: rank 2)"
    return None


RULES = {"FULLY_CONNECTED": Rule(fully_connected),
         "BATCH_MATMUL": Rule(batch_matmul, _rank2)}
