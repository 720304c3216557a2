"""Matrix products whose weight gradients XLA CPU computes fast: `matmul` on [K, O] weights
(kn2row and transposed convolutions), `matmul_nt` on [O, K] ones (FULLY_CONNECTED's, and
an im2col convolution's filter) and `matmul_pretransposed` (a small kn2row convolution); a
tiny FULLY_CONNECTED product is one broadcast multiply and sum (`small_matmul`)."""

from __future__ import annotations

from collections.abc import Callable
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


def _contract_last(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b.T``: both operands' last axis contracted."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())))


def _product_jvp(product: Callable[[jax.Array, jax.Array], jax.Array],
                 weight_tangent: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable:
    """A jvp rule (symbolic zeros) for the bilinear ``product(x, w)``: its input tangent as
    the product itself, its weight tangent as ``weight_tangent(x, tw)`` (written for the
    weight gradient its transpose becomes)."""

    def rule(primals: tuple, tangents: tuple) -> tuple:
        (x, w), (tx, tw) = primals, tangents
        y = product(x, w)
        terms = []
        if not isinstance(tx, SymbolicZero):
            terms.append(product(tx, w))
        if not isinstance(tw, SymbolicZero):
            terms.append(weight_tangent(x, tw))
        return y, tangent_sum(terms, y)

    return rule


def _matmul_weight_tangent(x: jax.Array, tw: jax.Array) -> jax.Array:
    one_row = x.shape[0] == 1
    rows = jnp.pad(x, ((0, 1), (0, 0))) if one_row else x
    if tw.shape[1] < tw.shape[0]:  # O < K: the tangent as [O, K]
        t = _contract_last(rows, lax.optimization_barrier(tw.T))
    else:
        t = jnp.matmul(rows, tw)
    return t[:1] if one_row else t


matmul.defjvp(_product_jvp(jnp.matmul, _matmul_weight_tangent), symbolic_zeros=True)


@jax.custom_jvp
def matmul_nt(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w.T`` for 2-d ``x`` [M, K] and ``w`` [O, K] (FULLY_CONNECTED's layout, and a
    convolution filter's [O, *K, I] read as [O, K]): both GEMMs read ``w`` as stored, so no
    transposed copy of it is made in a training step.

    For a small output gradient (M x O up to `TRANSPOSED_OPERAND_ELEMENTS`) the weight
    gradient is the GEMM of its transpose, materialized as [O, M] behind an optimization
    barrier, and ``x`` as it is: the operand order XLA CPU hands to its library GEMM
    (YNNPACK). Written as XLA would fold it, the product contracts both operands' first
    axis, which XLA runs as its own slower dot (Eigen's): a dense step 13% faster at batch
    16 and up to 2.8x at batch 1 (benchmarks/README.md). A larger one is :func:`matmul`'s
    weight gradient of ``w.T``, transposed."""
    return _contract_last(x, w)


def _nt_weight_tangent(x: jax.Array, tw: jax.Array) -> jax.Array:
    if x.shape[0] * tw.shape[0] <= TRANSPOSED_OPERAND_ELEMENTS:
        # transposed, the output gradient is materialized as [O, M] and multiplied by x as
        # it is (no transpose folded into the GEMM)
        return lax.optimization_barrier(_contract_last(tw, x)).T
    return _matmul_weight_tangent(x, tw.T)


matmul_nt.defjvp(_product_jvp(_contract_last, _nt_weight_tangent), symbolic_zeros=True)


@jax.custom_jvp
def matmul_pretransposed(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for 2-d operands (``w`` [K, O]) whose weight gradient is the GEMM of ``x``'s
    transpose, materialized behind an optimization barrier, and the output gradient: the
    operand order XLA CPU hands to its library GEMM, at the cost of copying ``x``. Worth it
    for a small ``x`` (`TRANSPOSED_OPERAND_ELEMENTS`)."""
    return jnp.matmul(x, w)


matmul_pretransposed.defjvp(_product_jvp(
    jnp.matmul, lambda x, tw: jnp.matmul(lax.optimization_barrier(x.T).T, tw)),
    symbolic_zeros=True)


#: A product's weight gradient multiplies a materialized transpose (`matmul_nt`'s of the
#: output gradient, `matmul_pretransposed`'s of a kn2row convolution's input) when that
#: transpose has at most this many elements: the library GEMM then replaces XLA's own
#: dot. Small CNNs' batch-1 steps ran 7-17% faster; at 4096 elements (batch 16) the
#: change was within this VM's noise either way (benchmarks/README.md).
TRANSPOSED_OPERAND_ELEMENTS = 1024

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
    """FULLY_CONNECTED with :func:`matmul_nt` on its [O, K] weights, or :func:`small_matmul`
    up to ``SMALL_MATMUL_MACS`` multiply-adds."""
    rows = dense_rows(ctx, x, w)
    if rows.ndim == 2 and rows.shape[0] * rows.shape[1] * w.shape[0] <= SMALL_MATMUL_MACS:
        y = small_matmul(rows, jnp.transpose(w))
    else:
        flat = matmul_nt(rows.reshape(-1, rows.shape[-1]), w)
        y = flat.reshape(*rows.shape[:-1], w.shape[0])
    return bias_act(y, b, ctx.options.fused_activation_function)
