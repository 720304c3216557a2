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

The weights that are vectors (biases, per-channel scales) can be carried as one vector too,
between a program's calls (`Packed`): each weight's update is otherwise a kernel of its
own, which XLA compiles apart (about 10 ms of CPU each on a 2-core machine; MobileNet
0.25/128 has 56 weights, 28 of them biases). Rules:

- only weights of at most one axis go into the vector, and only where there are at least
  `PACKED_MIN_WEIGHTS` of them: a fused elementwise kernel reads a vector weight, so
  slicing it out of the packed vector is free, and gathering their gradients into it is a
  short pass every step. A matrix or filter that a library matrix product reads would be
  copied out of the vector every step instead, and gathering all weights' gradients costs
  about 2.5 ns per element here (measured in benchmarks/README.md); those stay by name;
- `packable`: the packed weights share one floating dtype (one vector holds them exactly)
  and the optimizer keeps no per-weight state (SGD: every optimizer here updates element
  by element, so the update of the vector is the weights' updates, value for value; a
  per-weight state is laid out for the weights by name or in `flattened`'s order);
- `Packed` lays the vector weights out in `jax.tree` order; packing and unpacking concrete
  weights happens on the host (one transfer each way; in a program, a slice per weight).
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


#: The fewest vector weights worth a `Packed` vector.
PACKED_MIN_WEIGHTS = 8


def _vector_weights(params: Mapping[str, Any]) -> list[str]:
    """The names of ``params``' weights of at most one axis (what a `Packed` vector holds),
    in `jax.tree` order."""
    names = [k.key for (k,), _ in jax.tree_util.tree_flatten_with_path(dict(params))[0]]
    return [k for k in names if np.ndim(params[k]) <= 1]


def packable(params: Mapping[str, Any], opt_state: Any) -> bool:
    """Whether ``params`` may be carried `Packed` through updates by the optimizer whose
    state is ``opt_state`` (the rules above; read from the state, so nothing is traced)."""
    small = _vector_weights(params)
    like = _per_weight(params)
    total = sum(int(np.prod(np.shape(v))) for v in params.values())
    return len(small) >= PACKED_MIN_WEIGHTS and _one_float_dtype([params[k] for k in small]) \
        and not any(like(n) or np.shape(n) == (total,)
                    for n in jax.tree.leaves(opt_state, is_leaf=like))


@jax.tree_util.register_pytree_node_class
class Packed:
    """Weights by name, the vector ones (`packable`) raveled into one vector: a pytree of
    that vector and the mapping of the others; the packed ones' names and shapes are its
    static layout."""

    def __init__(self, vector: Any, others: dict[str, Any],
                 layout: tuple[tuple[str, tuple[int, ...]], ...]):
        self.vector, self.others, self.layout = vector, others, layout

    def tree_flatten(self) -> tuple[tuple[Any, dict], tuple]:
        return (self.vector, self.others), self.layout

    @classmethod
    def tree_unflatten(cls, layout: tuple, children: Any) -> Packed:
        return cls(*children, layout)

    @classmethod
    def pack(cls, params: Mapping[str, Any]) -> Packed:
        """``params`` (device arrays, or ``jax.ShapeDtypeStruct``: the vector's shape), the
        vector ones assembled into one vector on the host."""
        small = _vector_weights(params)
        layout = tuple((k, tuple(np.shape(params[k]))) for k in small)
        others = {k: v for k, v in params.items() if k not in small}
        if any(isinstance(v, jax.ShapeDtypeStruct) for v in params.values()):
            size = sum(int(np.prod(s)) for _, s in layout)
            return cls(jax.ShapeDtypeStruct((size,), params[small[0]].dtype), others, layout)
        host = jax.device_get([params[k] for k in small])  # one transfer
        return cls(jax.device_put(np.concatenate([np.ravel(a) for a in host])), others,
                   layout)

    def like(self, tree: Mapping[str, jax.Array]) -> Packed:
        """``tree`` (laid out as the weights by name: their gradients) in this layout, in a
        program."""
        return Packed(lax.concatenate([lax.reshape(tree[k], (int(np.prod(s)),))
                                       for k, s in self.layout], 0),
                      {k: tree[k] for k in self.others}, self.layout)

    def unpack(self) -> dict[str, jax.Array]:
        """The weights by name: the packed ones slices of the vector in a program, else
        arrays on the vector's device made from one transfer to the host."""
        ends = np.cumsum([0] + [int(np.prod(s)) for _, s in self.layout])
        spans = list(zip(self.layout, ends[:-1], ends[1:]))
        if isinstance(self.vector, jax.core.Tracer):
            small = {k: lax.reshape(lax.slice(self.vector, (int(a),), (int(b),)), s)
                     for (k, s), a, b in spans}
        else:
            flat = np.asarray(self.vector)
            small = jax.device_put({k: flat[a:b].reshape(s) for (k, s), a, b in spans},
                                   next(iter(self.vector.devices())))
        return {**small, **self.others}


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
