"""Loss functions on ``(predictions, targets)`` with the batch on axis 0.

Every loss builds a per-sample loss vector of shape ``(batch,)`` (for a sequence, the mean
over its tokens, padding left out) and reduces it with
`circle_jax.losses.reduction.reduce_per_sample` (`reduce_positions`). Half-precision inputs
are promoted to float32 first (float64 stays float64): ``log(1e-20)`` and squared errors do
not fit float16.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from circle_jax.losses.reduction import (
    Reduction,
    per_sample_mean,
    reduce_per_sample,
    reduce_positions,
)


@dataclasses.dataclass(frozen=True)
class ProbabilityClip:
    """How cross-entropy guards ``log`` when the prediction holds probabilities.

    Attributes:
      eps_min: probabilities are raised to at least this value before ``log``.
      eps_max: probabilities are lowered to at most this value (None: no upper clip).
      normalize: divide the prediction by its sum over the class axis first (Keras does).
    """

    eps_min: float
    eps_max: float | None = None
    normalize: bool = False


KERAS_CLIP = ProbabilityClip(eps_min=1e-7, eps_max=1.0 - 1e-7, normalize=True)
"""Keras: ``p /= sum(p)``, then ``clip(p, 1e-7, 1 - 1e-7)``."""

ONERT_CLIP = ProbabilityClip(eps_min=1e-20, eps_max=None, normalize=False)
"""onert train backend: ``-sum(t * log(max(p, 1e-20)))``."""

_CLIPS = {"keras": KERAS_CLIP, "onert": ONERT_CLIP}

ClipSpec = str | ProbabilityClip | tuple


def get_clip(spec: ClipSpec) -> ProbabilityClip:
    """Resolve ``"keras"``, ``"onert"``, a `ProbabilityClip` or a tuple ``(eps_min, eps_max)``.

    A tuple clips without normalising; ``eps_max`` may be None. ``("floor", eps)`` is the
    same as ``(eps, None)``.
    """
    if isinstance(spec, ProbabilityClip):
        return spec
    if isinstance(spec, str) and spec.lower() in _CLIPS:
        return _CLIPS[spec.lower()]
    if isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = spec
        if lo == "floor":
            return ProbabilityClip(eps_min=float(hi), eps_max=None)
        if not isinstance(lo, str) and not isinstance(hi, str):
            return ProbabilityClip(eps_min=float(lo), eps_max=None if hi is None else float(hi))
    raise ValueError(
        f"unknown probability clip {spec!r}: use 'keras', 'onert', (eps_min, eps_max), "
        "('floor', eps) or a ProbabilityClip"
    )


def _loss_dtype(x: jax.Array) -> jnp.dtype:
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        return jnp.dtype(jnp.float32)
    return jnp.promote_types(dtype, jnp.float32)


def _check_batched(name: str, pred: jax.Array) -> None:
    if pred.ndim < 1:
        raise ValueError(f"{name}: predictions need a batch axis 0, got a scalar")


def mean_squared_error(
    pred: jax.Array,
    target: jax.Array,
    reduction: str | int | Reduction = Reduction.SUM_OVER_BATCH_SIZE,
) -> jax.Array:
    """Mean squared error: per sample, the mean over non-batch elements of ``(p - t)**2``.

    With ``"sum_over_batch_size"`` the result is the mean over the batch, with ``"sum"`` the
    sum over the batch (onert's definition; for rank > 2 Keras' ``sum`` differs).
    """
    pred, target = jnp.asarray(pred), jnp.asarray(target)
    _check_batched("mean_squared_error", pred)
    if pred.shape != target.shape:
        raise ValueError(
            f"mean_squared_error: prediction shape {pred.shape} != target shape {target.shape}"
        )
    dtype = _loss_dtype(pred)
    diff = pred.astype(dtype) - target.astype(dtype)
    return reduce_per_sample(per_sample_mean(jnp.square(diff)), reduction)


def _log_probabilities(pred: jax.Array, from_logits: bool, clip: ClipSpec) -> jax.Array:
    if from_logits:
        return jax.nn.log_softmax(pred, axis=-1)
    c = get_clip(clip)
    p = pred
    if c.normalize:
        p = p / jnp.sum(p, axis=-1, keepdims=True)
    p = jnp.maximum(p, jnp.asarray(c.eps_min, p.dtype))
    if c.eps_max is not None:
        p = jnp.minimum(p, jnp.asarray(c.eps_max, p.dtype))
    return jnp.log(p)


def categorical_crossentropy(pred: jax.Array, target: jax.Array, *, from_logits: bool = False,
                             clip: ClipSpec = "keras",
                             reduction: str | int | Reduction = Reduction.SUM_OVER_BATCH_SIZE,
                             ) -> jax.Array:
    """Cross-entropy ``-sum(t * log p)`` over the last (class) axis, from one-hot/soft targets.

    Args:
      pred: probabilities (``from_logits=False``) or logits, shape ``(batch, ..., classes)``.
      target: same shape as ``pred``.
      from_logits: use a stable ``log_softmax`` of ``pred`` (no clipping).
      clip: guard for probabilities: ``"keras"`` (renormalise, clip to [1e-7, 1 - 1e-7]),
        ``"onert"`` (``max(p, 1e-20)``), a tuple ``(eps_min, eps_max)`` or a `ProbabilityClip`.
      reduction: over the batch; positions between batch and class axes are averaged first.
    """
    pred, target = jnp.asarray(pred), jnp.asarray(target)
    _check_batched("categorical_crossentropy", pred)
    if pred.shape != target.shape:
        raise ValueError(
            f"categorical_crossentropy: prediction shape {pred.shape} != target shape "
            f"{target.shape} (use sparse_categorical_crossentropy for integer labels)"
        )
    dtype = _loss_dtype(pred)
    return reduce_positions(_per_position(pred.astype(dtype), target.astype(dtype),
                                          from_logits, clip), None, reduction)


def _per_position(pred: jax.Array, target: jax.Array, from_logits: bool, clip: ClipSpec
                  ) -> jax.Array:
    """``-sum(t * log p)`` over the class axis: one loss per position ``(batch, ...)``."""
    return -jnp.sum(target * _log_probabilities(pred, from_logits, clip), axis=-1)


def sparse_categorical_crossentropy(
        pred: jax.Array, labels: jax.Array, *, from_logits: bool = False,
        clip: ClipSpec = "keras", reduction: str | int | Reduction = Reduction.SUM_OVER_BATCH_SIZE,
        ignore_index: int | None = None,
) -> jax.Array:
    """`categorical_crossentropy` with integer class labels instead of one-hot targets.

    ``labels`` has shape ``pred.shape[:-1]`` (or that plus a trailing 1): one label per
    sample for ``(batch, classes)`` predictions, one per token for a sequence's
    ``(batch, tokens, classes)``. Positions labelled ``ignore_index`` (padding) do not count:
    the loss is the mean over the others (`reduce_positions`). A label outside
    ``[0, classes)`` gives an all-zero target row, hence a zero loss (not checked under jit).
    """
    pred, labels = jnp.asarray(pred), jnp.asarray(labels)
    _check_batched("sparse_categorical_crossentropy", pred)
    if labels.ndim == pred.ndim and labels.shape[-1] == 1:
        labels = labels[..., 0]
    if labels.shape != pred.shape[:-1]:
        raise ValueError(
            f"sparse_categorical_crossentropy: labels shape {labels.shape} does not match "
            f"prediction shape {pred.shape} without its class axis"
        )
    dtype = _loss_dtype(pred)
    labels = labels.astype(jnp.int32)
    counted = None if ignore_index is None else labels != ignore_index
    if counted is not None:
        labels = jnp.where(counted, labels, -1)  # an all-zero target row: no loss there
    one_hot = jax.nn.one_hot(labels, pred.shape[-1], dtype=dtype)
    return reduce_positions(_per_position(pred.astype(dtype), one_hot, from_logits, clip),
                            counted, reduction)
