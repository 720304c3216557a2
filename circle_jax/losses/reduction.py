"""How per-sample losses become the scalar a training step differentiates."""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp


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
ONERT_REDUCTION_CODES: dict[int, Reduction] = {
    1: Reduction.SUM_OVER_BATCH_SIZE,
    2: Reduction.SUM,
}

_ALIASES: dict[str, Reduction] = {
    "sum_over_batch_size": Reduction.SUM_OVER_BATCH_SIZE,
    "mean": Reduction.SUM_OVER_BATCH_SIZE,
    "auto": Reduction.SUM_OVER_BATCH_SIZE,
    "sum": Reduction.SUM,
    "none": Reduction.NONE,
}


def _normalize_name(name: str) -> str:
    return "_".join(name.strip().lower().replace("-", " ").replace("_", " ").split())


def get_reduction(spec: str | int | Reduction) -> Reduction:
    """Resolve a reduction given as a `Reduction`, a name or an onert_train code (1, 2).

    Names are case-insensitive; spaces, hyphens and underscores are interchangeable, so
    circle_plus_gen's ``"sum over batch size"`` works.
    """
    if isinstance(spec, Reduction):
        return spec
    if isinstance(spec, bool):
        raise ValueError(f"loss reduction must be a name or an onert code, got {spec!r}")
    if isinstance(spec, int):
        if spec in ONERT_REDUCTION_CODES:
            return ONERT_REDUCTION_CODES[spec]
        raise ValueError(
            f"unknown onert loss reduction code {spec}: use 1 (sum over batch size) or 2 (sum)"
        )
    if isinstance(spec, str):
        key = _normalize_name(spec)
        if key in _ALIASES:
            return _ALIASES[key]
    raise ValueError(
        f"unknown loss reduction {spec!r}: use 'sum_over_batch_size', 'sum', 'none' "
        "or onert codes 1, 2"
    )


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
