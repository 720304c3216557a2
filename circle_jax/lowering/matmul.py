"""Matrix products with a weight gradient XLA CPU computes fast; FULLY_CONNECTED uses it, or
for a tiny product one broadcast multiply and sum."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ..ops.conv import bias_act, dense_rows
from ..ops.registry import OpContext
from . import fast
from ._taps import tangent_sum


def matmul_2d(x: jax.Array, w: jax.Array) -> jax.Array:
    """[..., K] @ [K, O] as one 2-d :func:`matmul` (forward and both gradients are GEMMs)."""
    lead = x.shape[:-1]
    y = matmul(x.reshape(-1, x.shape[-1]), w)
    return y.reshape(*lead, w.shape[-1])


@jax.custom_jvp
def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for 2-d operands; its weight tangent is written for XLA CPU's dot.

    A single row gets a zero row appended in the weight tangent (its transpose stays a
    2-row GEMM instead of an outer product that fuses with, and recomputes, its producers),
    and for O < K the weight tangent is computed transposed behind an optimization barrier
    (XLA CPU's dot is faster with the smaller of K and O as the result's rows). See
    benchmarks/README.md for the measurements.
    """
    return jnp.matmul(x, w)


@functools.partial(matmul.defjvp, symbolic_zeros=True)
def _matmul_jvp(primals: tuple, tangents: tuple) -> tuple:
    x, w = primals
    tx, tw = tangents
    y = jnp.matmul(x, w)
    terms = []
    if not isinstance(tx, SymbolicZero):
        terms.append(jnp.matmul(tx, w))
    if not isinstance(tw, SymbolicZero):
        one_row = x.shape[0] == 1
        rows = jnp.pad(x, ((0, 1), (0, 0))) if one_row else x
        if w.shape[1] < w.shape[0]:  # O < K: the tangent as [O, K]
            t = lax.dot_general(rows, lax.optimization_barrier(tw.T), (((1,), (1,)), ((), ())))
        else:
            t = jnp.matmul(rows, tw)
        terms.append(t[:1] if one_row else t)
    return y, tangent_sum(terms, y)


#: A FULLY_CONNECTED of at most this many multiply-adds (rows x inputs x outputs) runs as
#: :func:`small_matmul`: XLA CPU calls a GEMM routine per dot, a fixed cost larger than such
#: a product's arithmetic, while a multiply and sum fuse with their neighbours. From 4096 on,
#: XLA hands the sum to a YNNPACK reduction, which costs more than the GEMM.
SMALL_MATMUL_MACS = 3072


def small_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for 2-d operands as one broadcast multiply and a sum over K (both gradients
    are again a multiply and a sum)."""
    return jnp.sum(x[:, :, None] * w[None, :, :], axis=1)


@fast("FULLY_CONNECTED")
def fully_connected(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """FULLY_CONNECTED with :func:`matmul_2d` (XLA folds the transpose into the dot), or
    :func:`small_matmul` up to ``SMALL_MATMUL_MACS`` multiply-adds."""
    rows = dense_rows(ctx, x, w)
    if rows.ndim == 2 and rows.shape[0] * rows.shape[1] * w.shape[0] <= SMALL_MATMUL_MACS:
        y = small_matmul(rows, jnp.transpose(w))
    else:
        y = matmul_2d(rows, jnp.transpose(w))
    return bias_act(y, b, ctx.options.fused_activation_function)
