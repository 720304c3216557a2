"""Optimizers that keep per-weight state, run on the weights raveled into one vector.

Adam keeps two moments per weight; updated weight by weight, each is its own set of fused
kernels (MobileNet 0.25/128: 56 weights, about 2000 HLO instructions and 90 kernels, a
fifth of its compile time and a third of the executable a repeated run loads). `optax.flatten`
runs the same optimizer on the weights raveled into one vector: the same operations on the
same values, element by element, in a few kernels. Rules:

- `flattened` wraps an optimizer in `optax.flatten` only where its state has per-weight
  parts (subtrees laid out like the params: moments, accumulated gradients; stateless SGD
  gains nothing) and the params and those parts share one floating dtype (no promotion, so
  the numerics do not change);
- its state holds each per-weight part as one vector in `jax.flatten_util.ravel_pytree`'s
  order (the params' leaves in `jax.tree` order); `per_weight` gives the layout with one
  entry per weight (what checkpoints store and what one reads to compare a moment with
  another runtime's) and `raveled` gives the vector layout back, both on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax


def _per_weight(params: Any) -> Callable[[Any], bool]:
    """``is_leaf`` for the subtrees of a state that are laid out like ``params``."""
    structure = jax.tree.structure(params)
    return lambda node: jax.tree.structure(node) == structure


def _dtypes(tree: Any) -> set[np.dtype]:
    return {np.dtype(a.dtype) for a in jax.tree.leaves(tree)}


def flattened(tx: optax.GradientTransformation, params: Any
              ) -> optax.GradientTransformation | None:
    """``optax.flatten(tx)`` for params like ``params`` (arrays or ``jax.ShapeDtypeStruct``),
    or None where the rules above keep ``tx`` per weight."""
    dtypes = _dtypes(params)
    if len(dtypes) != 1 or not np.issubdtype(next(iter(dtypes)), np.floating):
        return None
    like = _per_weight(params)
    state = jax.eval_shape(tx.init, params)
    parts = [n for n in jax.tree.leaves(state, is_leaf=like) if like(n)]
    if not parts or any(_dtypes(n) != dtypes for n in parts):
        return None
    return optax.flatten(tx)


def per_weight(opt_state: Any, tx: optax.GradientTransformation, params: Any) -> Any:
    """``opt_state`` (of ``tx``, or of its `flattened` form) laid out as ``tx`` keeps it, one
    entry per weight: numpy views of the vectors, or the state as it is."""
    like_state = jax.eval_shape(tx.init, params)
    if jax.tree.structure(like_state) == jax.tree.structure(opt_state):
        return opt_state
    like = _per_weight(params)
    leaves, structure = jax.tree.flatten(params)
    sizes = np.cumsum([0] + [int(np.prod(np.shape(a))) for a in leaves])

    def split(node: Any, value: Any) -> Any:
        if not like(node):
            return value
        flat = np.asarray(value)
        return structure.unflatten([flat[a:b].reshape(np.shape(p))
                                    for a, b, p in zip(sizes[:-1], sizes[1:], leaves)])

    return jax.tree.map(split, like_state, opt_state, is_leaf=like)


def raveled(opt_state: Any, params: Any) -> Any:
    """The state of a `flattened` optimizer from its per-weight layout ``opt_state`` (the
    inverse of `per_weight`), as numpy arrays."""
    like = _per_weight(params)
    return jax.tree.map(
        lambda n: np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(n)])
        if like(n) else n, opt_state, is_leaf=like)
