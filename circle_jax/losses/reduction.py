"""How per-sample losses become the scalar a training step differentiates."""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

from circle_jax.codes import CodeTable


class Reduction(str, enum.Enum):
    """Reduction of per-sample losses over the batch (axis 0).

    ``SUM_OVER_BATCH_SIZE`` is the mean over the batch (Keras' default, onert_train code 1);
    ``SUM`` is the sum over the batch (onert_train code 2); ``NONE`` keeps the per-sample
    vector (for evaluation code that weights or masks samples itself).
    """

    SUM_OVER_BATCH_SIZE = "sum_over_batch_size"
    SUM = "sum"
    NONE = "none"


# onert_train's --loss_reduction_type codes. (circle+ stores SumOverBatchSize=0, Sum=1:
# map that enum to a name before calling `get_reduction`.)
REDUCTION_TABLE = CodeTable(
    "loss reduction",
    names=tuple(r.value for r in Reduction),
    codes={1: Reduction.SUM_OVER_BATCH_SIZE.value, 2: Reduction.SUM.value},
    aliases={"mean": "sum_over_batch_size", "auto": "sum_over_batch_size"},
)
ONERT_REDUCTION_CODES: dict[int, Reduction] = {
    code: Reduction(name) for code, name in REDUCTION_TABLE.codes.items()
}


def get_reduction(spec: str | int | Reduction) -> Reduction:
    """Resolve a reduction given as a `Reduction`, a name or an onert_train code (1, 2).

    Names are case-insensitive; spaces, hyphens and underscores are interchangeable, so
    circle_plus_gen's ``"sum over batch size"`` works.
    """
    if isinstance(spec, Reduction):
        return spec
    return Reduction(REDUCTION_TABLE.resolve(spec))


def per_sample_mean(x: jax.Array) -> jax.Array:
    """Mean over every axis but the batch axis 0; a 1-D input is returned as is."""
    if x.ndim <= 1:
        return x
    return jnp.mean(x, axis=tuple(range(1, x.ndim)))


def reduce_per_sample(per_sample: jax.Array, reduction: str | int | Reduction) -> jax.Array:
    """Reduce a ``(batch,)`` vector of per-sample losses over the batch."""
    red = get_reduction(reduction)
    if red is Reduction.SUM_OVER_BATCH_SIZE:
        return jnp.mean(per_sample)
    if red is Reduction.SUM:
        return jnp.sum(per_sample)
    return per_sample


def reduce_positions(per_position: jax.Array, counted: jax.Array | None,
                     reduction: str | int | Reduction) -> jax.Array:
    """Reduce per-position losses ``(batch, ...)`` (a sequence's tokens) over the batch.

    Without ``counted`` every position counts: per sample the mean over its positions, then
    `reduce_per_sample`. With ``counted`` (a mask of ``per_position``'s shape: False for
    padding) the ignored positions drop out: ``"sum_over_batch_size"`` is the mean over the
    batch's counted positions, ``"sum"`` that mean times the batch size (as without a
    mask, where the sum of per-sample means is the batch size times the mean), ``"none"``
    each sample's mean over its counted positions (0 for a sample with none).
    """
    if counted is None:
        return reduce_per_sample(per_sample_mean(per_position), reduction)
    red = get_reduction(reduction)
    w = counted.astype(per_position.dtype)
    kept = per_position * w
    if red is Reduction.NONE:
        axes = tuple(range(1, per_position.ndim))
        return jnp.sum(kept, axis=axes) / jnp.maximum(jnp.sum(w, axis=axes), 1)
    mean = jnp.sum(kept) / jnp.maximum(jnp.sum(w), 1)
    return mean * per_position.shape[0] if red is Reduction.SUM else mean
