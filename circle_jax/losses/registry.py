"""Resolve a loss given by name or onert_train code to a ``loss(pred, target)`` callable."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import jax

from circle_jax.codes import CodeTable
from circle_jax.losses.functions import (
    categorical_crossentropy,
    mean_squared_error,
    sparse_categorical_crossentropy,
)
from circle_jax.losses.reduction import get_reduction

LossFn = Callable[[jax.Array, jax.Array], jax.Array]

LOSSES: dict[str, Callable[..., jax.Array]] = {
    "mean_squared_error": mean_squared_error,
    "categorical_crossentropy": categorical_crossentropy,
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy,
}

# onert_train's --loss codes. (circle+'s LossFn enum differs: SPARSE_CCE=0, CCE=1, MSE=2;
# map it to a name before calling `get_loss`.)
LOSS_TABLE = CodeTable(
    "loss",
    names=tuple(LOSSES),
    codes={1: "mean_squared_error", 2: "categorical_crossentropy"},
    aliases={"mse": "mean_squared_error", "cce": "categorical_crossentropy",
             "sparse_cce": "sparse_categorical_crossentropy",
             "scce": "sparse_categorical_crossentropy"},
)
ONERT_LOSS_CODES: dict[int, str] = dict(LOSS_TABLE.codes)


def loss_name(spec: str | int) -> str:
    """Canonical name (a key of `LOSSES`) of a loss name, alias or onert_train code."""
    return LOSS_TABLE.resolve(spec)


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
