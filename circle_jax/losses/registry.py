"""Resolve a loss given by name or onert_train code to a ``loss(pred, target)`` callable."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import jax

from circle_jax.losses.functions import (
    categorical_crossentropy,
    mean_squared_error,
    sparse_categorical_crossentropy,
)
from circle_jax.losses.reduction import _normalize_name, get_reduction

LossFn = Callable[[jax.Array, jax.Array], jax.Array]

LOSSES: dict[str, Callable[..., jax.Array]] = {
    "mean_squared_error": mean_squared_error,
    "categorical_crossentropy": categorical_crossentropy,
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy,
}

_ALIASES = {
    "mse": "mean_squared_error",
    "mean_squared_error": "mean_squared_error",
    "cce": "categorical_crossentropy",
    "categorical_crossentropy": "categorical_crossentropy",
    "sparse_cce": "sparse_categorical_crossentropy",
    "scce": "sparse_categorical_crossentropy",
    "sparse_categorical_crossentropy": "sparse_categorical_crossentropy",
}

# onert_train's --loss codes. (circle+'s LossFn enum differs: SPARSE_CCE=0, CCE=1, MSE=2;
# map it to a name before calling `get_loss`.)
ONERT_LOSS_CODES: dict[int, str] = {1: "mean_squared_error", 2: "categorical_crossentropy"}


def loss_name(spec: str | int) -> str:
    """Canonical name (a key of `LOSSES`) of a loss name, alias or onert_train code."""
    if isinstance(spec, bool):
        raise ValueError(f"loss must be a name or an onert code, got {spec!r}")
    if isinstance(spec, int):
        if spec in ONERT_LOSS_CODES:
            return ONERT_LOSS_CODES[spec]
        raise ValueError(
            f"unknown onert loss code {spec}: use 1 (mean squared error) or "
            "2 (categorical crossentropy)"
        )
    if isinstance(spec, str):
        key = _normalize_name(spec)
        if key in _ALIASES:
            return _ALIASES[key]
    raise ValueError(
        f"unknown loss {spec!r}: use one of {', '.join(sorted(_ALIASES))} or onert codes 1, 2"
    )


def get_loss(spec: str | int, **kwargs) -> LossFn:
    """A ``loss(pred, target) -> scalar`` for a name/alias or onert_train code (1=mse, 2=cce).

    ``kwargs`` are bound to the loss function (``reduction``, ``from_logits``, ``clip``); the
    ``reduction`` may be a name or an onert code. An onert code selects onert's numerics, so
    code 2 defaults to ``clip="onert"`` (names default to Keras' clip).
    """
    name = loss_name(spec)
    fn = LOSSES[name]
    if isinstance(spec, int) and name != "mean_squared_error":
        kwargs.setdefault("clip", "onert")
    if "reduction" in kwargs:
        kwargs["reduction"] = get_reduction(kwargs["reduction"])
    try:
        inspect.signature(fn).bind(None, None, **kwargs)
    except TypeError as e:
        raise ValueError(f"bad options for loss {name!r}: {e}") from None
    return functools.partial(fn, **kwargs)
