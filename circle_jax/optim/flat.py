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

The weights themselves can be carried the same way between a program's calls (`Packed`):
each weight's update is otherwise a kernel of its own, which XLA compiles apart (about
10 ms of CPU each on a 2-core machine; MobileNet 0.25/128 has 56). On one vector the update
is one kernel; the weights are sliced out of it where the forward pass reads them. Rules:

- `packable`: the weights share one floating dtype (so one vector holds them exactly) and
  the optimizer's state holds no per-weight part laid out per weight (it is stateless, or
  `flattened`): every optimizer here updates element by element, so the vector's update is
  the weights' updates, value for value;
- `Packed` lays the weights out in `jax.tree` order, as ``ravel_pytree`` and `flattened`'s
  state do; packing and unpacking concrete weights happens on the host (one transfer each
  way; in a program, a slice per weight).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
from jax import lax


def _per_weight(params: Any) -> Callable[[Any], bool]:
    """``is_leaf`` for the subtrees of a state that are laid out like ``params``."""
    structure = jax.tree.structure(params)
    return lambda node: jax.tree.structure(node) == structure


def _dtypes(tree: Any) -> set[np.dtype]:
    return {np.dtype(a.dtype) for a in jax.tree.leaves(tree)}


def _one_float_dtype(params: Any) -> bool:
    dtypes = _dtypes(params)
    return len(dtypes) == 1 and np.issubdtype(next(iter(dtypes)), np.floating)


def flattened(tx: optax.GradientTransformation, params: Any
              ) -> optax.GradientTransformation | None:
    """``optax.flatten(tx)`` for params like ``params`` (arrays or ``jax.ShapeDtypeStruct``),
    or None where the rules above keep ``tx`` per weight."""
    if not _one_float_dtype(params):
        return None
    like = _per_weight(params)
    state = jax.eval_shape(tx.init, params)
    parts = [n for n in jax.tree.leaves(state, is_leaf=like) if like(n)]
    if not parts or any(_dtypes(n) != _dtypes(params) for n in parts):
        return None
    return optax.flatten(tx)


def packable(params: Any, opt_state: Any) -> bool:
    """Whether ``params`` may be updated as one `Packed` vector by the optimizer whose state
    is ``opt_state`` (the rules above; read from the state, so nothing is traced)."""
    like = _per_weight(params)
    return len(jax.tree.leaves(params)) > 1 and _one_float_dtype(params) and not any(
        like(n) for n in jax.tree.leaves(opt_state, is_leaf=like))


@jax.tree_util.register_pytree_node_class
class Packed:
    """Weights raveled into one vector (a pytree of that one leaf; the names and shapes are
    its static layout), in `jax.tree` order of their mapping."""

    def __init__(self, vector: Any, layout: tuple[tuple[str, tuple[int, ...]], ...]):
        self.vector, self.layout = vector, layout

    def tree_flatten(self) -> tuple[tuple[Any], tuple]:
        return (self.vector,), self.layout

    @classmethod
    def tree_unflatten(cls, layout: tuple, children: Any) -> Packed:
        return cls(children[0], layout)

    @classmethod
    def pack(cls, params: Mapping[str, Any]) -> Packed:
        """``params`` (device arrays, or ``jax.ShapeDtypeStruct``: the vector's shape) in one
        vector, assembled on the host."""
        names = [k.key for (k,), _ in jax.tree_util.tree_flatten_with_path(dict(params))[0]]
        layout = tuple((k, tuple(np.shape(params[k]))) for k in names)
        size = sum(int(np.prod(s)) for _, s in layout)
        if any(isinstance(v, jax.ShapeDtypeStruct) for v in params.values()):
            return cls(jax.ShapeDtypeStruct((size,), params[names[0]].dtype), layout)
        host = jax.device_get([params[k] for k in names])  # one transfer
        return cls(jax.device_put(np.concatenate([np.ravel(a) for a in host])), layout)

    def like(self, tree: Mapping[str, jax.Array]) -> Packed:
        """``tree`` (laid out as the unpacked weights: their gradients) raveled in this
        layout, in a program."""
        return Packed(lax.concatenate([lax.reshape(tree[k], (int(np.prod(s)),))
                                       for k, s in self.layout], 0), self.layout)

    def unpack(self) -> dict[str, jax.Array]:
        """The weights by name: slices of the vector in a program, else arrays on the
        vector's device made from one transfer to the host."""
        ends = np.cumsum([0] + [int(np.prod(s)) for _, s in self.layout])
        if isinstance(self.vector, jax.core.Tracer):
            return {k: lax.reshape(lax.slice(self.vector, (int(a),), (int(b),)), s)
                    for (k, s), a, b in zip(self.layout, ends[:-1], ends[1:])}
        flat = np.asarray(self.vector)
        return jax.device_put({k: flat[a:b].reshape(s) for (k, s), a, b in
                               zip(self.layout, ends[:-1], ends[1:])},
                              next(iter(self.vector.devices())))


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
