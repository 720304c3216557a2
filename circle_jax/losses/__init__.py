"""Losses on ``(predictions, targets)`` with the batch on axis 0, returning a scalar.

``get_loss("mse")`` / ``get_loss(2)`` (onert_train codes) give a ``loss(pred, target)``.
"""

from __future__ import annotations

from circle_jax.losses.functions import (
    KERAS_CLIP,
    ONERT_CLIP,
    ProbabilityClip,
    categorical_crossentropy,
    get_clip,
    mean_squared_error,
    sparse_categorical_crossentropy,
)
from circle_jax.losses.reduction import (
    ONERT_REDUCTION_CODES,
    REDUCTION_TABLE,
    Reduction,
    get_reduction,
    reduce_per_sample,
    reduce_positions,
)
from circle_jax.losses.registry import (
    LOSS_TABLE,
    LOSSES,
    ONERT_LOSS_CODES,
    LossFn,
    get_loss,
    loss_name,
)

__all__ = [
    "KERAS_CLIP",
    "LOSSES",
    "LOSS_TABLE",
    "ONERT_CLIP",
    "ONERT_LOSS_CODES",
    "ONERT_REDUCTION_CODES",
    "REDUCTION_TABLE",
    "LossFn",
    "ProbabilityClip",
    "Reduction",
    "categorical_crossentropy",
    "get_clip",
    "get_loss",
    "get_reduction",
    "loss_name",
    "mean_squared_error",
    "reduce_per_sample",
    "reduce_positions",
    "sparse_categorical_crossentropy",
]
