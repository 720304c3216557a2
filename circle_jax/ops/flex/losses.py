"""TF's fused softmax cross-entropy ops, which return the loss and its gradient together:

- ``SoftmaxCrossEntropyWithLogits(features, labels) -> (loss, backprop)``: features [B, C]
  logits, labels [B, C] (broadcast to it) probabilities; with ``z = features - max(features)``
  per row, ``loss = sum(labels * (log(sum(exp(z))) - z))`` per row and
  ``backprop = exp(z) / sum(exp(z)) - labels``;
- ``SparseSoftmaxCrossEntropyWithLogits(features, labels) -> (loss, backprop)``: labels [B]
  class indices, as the one-hot rows of those. A label outside [0, C) gives a NaN row (TF's
  GPU kernel; its CPU kernel raises, which a traced function cannot).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import flex_kernel


def _softmax_xent(features: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    z = features - jnp.max(features, axis=-1, keepdims=True)
    e = jnp.exp(z)
    s = jnp.sum(e, axis=-1, keepdims=True)
    loss = jnp.sum(labels * (jnp.log(s) - z), axis=-1)
    return loss, e / s - labels


@flex_kernel("SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy_with_logits(attrs: dict, features: jax.Array,
                                      labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _softmax_xent(features, jnp.broadcast_to(labels, features.shape))


@flex_kernel("SparseSoftmaxCrossEntropyWithLogits")
def sparse_softmax_cross_entropy_with_logits(attrs: dict, features: jax.Array,
                                             labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    classes = features.shape[-1]
    onehot = jax.nn.one_hot(labels, classes, dtype=features.dtype)
    loss, backprop = _softmax_xent(features, onehot)
    bad = ((labels < 0) | (labels >= classes))[:, None]
    nan = jnp.asarray(jnp.nan, features.dtype)
    return jnp.where(bad[:, 0], nan, loss), jnp.where(bad, nan, backprop)
