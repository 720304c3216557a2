"""Keras's Adam on sparse gradients, as an optax transformation with its own state.

Keras gives an embedding table's gradient as IndexedSlices (one row per index occurrence)
and its Adam then puts into the second moment ``v`` the SUM over occurrences of the
squared row gradients, where dense Adam squares their sum; ``m`` gets their sum (the dense
gradient), and every row's ``m`` and ``v`` decay and every row moves, seen in the batch or
not (measured on Keras 3.15.1 / TF 2.21: a row absent from a step's batch has ``m`` and
``v`` times ``b1`` and ``b2``). Rules:

- `keras_sparse_adam` is `circle_jax.optim.adam_tf`'s arithmetic (`adam_tf_moments`, which
  both run: the same operations in the same order) with ``v`` taking the per-occurrence
  squares where they are given: ``update(grads, state, params, row_squares=tree)`` (an optax extra
  argument), ``tree`` laid out like ``grads`` with None leaves for the weights that take
  ``g*g`` (no ``row_squares``: exactly `adam_tf`);
- the squares come from the backward pass: the training step differentiates a zero tensor
  per table read as `circle_jax.lowering.interpreter.RowSquares`
  (`circle_jax.train.compose.row_squares_gradients`);
- its state `SparseAdamState` is per weight (the squares are per weight): it is not run
  raveled (`circle_jax.optim.flat`), and it does not combine with gradient accumulation
  or loss scaling (a sum of squares is not a sum over micro-batches of scaled squares;
  the trainer refuses both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]


def _lr_at(learning_rate: ScalarOrSchedule, count: jax.Array) -> jax.Array:
    return jnp.asarray(learning_rate(count) if callable(learning_rate) else learning_rate)


def adam_tf_moments(learning_rate: ScalarOrSchedule, b1: float, b2: float, eps: float,
                    updates: Any, count: jax.Array, mu: Any, nu: Any, squares: Any = None
                    ) -> tuple[Any, jax.Array, Any, Any]:
    """`adam_tf`'s arithmetic: (updates, new count, new ``m``, new ``v``) from the gradients
    ``updates`` and the moments ``mu``, ``nu`` after ``count`` updates; ``squares`` (a tree
    like ``updates``, None leaves: ``g*g``) what ``v`` takes instead of ``g*g``
    (`keras_sparse_adam`); shared by `circle_jax.optim.adam_tf`."""
    lr = _lr_at(learning_rate, count)
    t = optax.safe_int32_increment(count)

    def consts(dt):
        return jnp.ones([], dt), jnp.asarray(b1, dt), jnp.asarray(b2, dt)

    def new_m(g, m):
        one, b1_, _ = consts(m.dtype)
        return m + (g.astype(m.dtype) - m) * (one - b1_)

    def new_v(g, v, sq=None):
        one, _, b2_ = consts(v.dtype)
        g = g.astype(v.dtype)
        sq = g * g if sq is None else sq.astype(v.dtype)
        return v + (sq - v) * (one - b2_)

    alphas: dict = {}

    def alpha(dt):  # once per dtype, not per leaf (the same operations: the same bits)
        if dt not in alphas:
            one, b1_, b2_ = consts(dt)
            tt = t.astype(dt)
            alphas[dt] = lr.astype(dt) * jnp.sqrt(one - b2_**tt) / (one - b1_**tt)
        return alphas[dt]

    def step(m, v):
        return -(alpha(m.dtype) * m / (jnp.sqrt(v) + jnp.asarray(eps, m.dtype)))

    m = jax.tree.map(new_m, updates, mu)
    v = (jax.tree.map(new_v, updates, nu) if squares is None
         else jax.tree.map(new_v, updates, nu, squares))
    return jax.tree.map(step, m, v), t, m, v



class SparseAdamState(NamedTuple):
    """State of `keras_sparse_adam` (as `circle_jax.optim.AdamTFState`).

    Attributes:
      count: int32 number of updates made so far.
      mu: first moment ``m`` per parameter, in the parameter dtype.
      nu: second moment ``v`` per parameter (per-occurrence squares for the tables).
    """

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def keras_sparse_adam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-7,
) -> optax.GradientTransformationExtraArgs:
    """Keras's Adam with sparse (embedding-table) gradients; see the module docstring."""

    def init_fn(params: optax.Params) -> SparseAdamState:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return SparseAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update_fn(updates: Any, state: SparseAdamState, params: Any = None, *,
                  row_squares: Any = None, **extra: Any) -> tuple[Any, SparseAdamState]:
        del params, extra
        u, t, m, v = adam_tf_moments(learning_rate, b1, b2, eps, updates, state.count,
                                     state.mu, state.nu, row_squares)
        return u, SparseAdamState(count=t, mu=m, nu=v)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
