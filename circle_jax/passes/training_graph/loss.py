"""The loss of the training step and its cotangent, as builtin operators.

Each loss is the per-position loss (a squared error per value; a cross-entropy per position
of the class axis) averaged over each sample's positions, then
reduced over the batch: ``sum_over_batch_size`` (the mean, onert_train's code 1) or
``sum`` (code 2), as `circle_jax.losses` computes it. With ``D`` the total divisor:

- MSE: ``loss = sum((p - t)**2) / D``, ``dp = 2 (p - t) / D``;
- CCE from logits ``z`` (``beta`` times the tensor read: a SOFTMAX's input):
  ``loss = -sum(t * log_softmax(z)) / D``, ``dz = (softmax(z) * sum(t) - t) / D``;
- CCE from probabilities: ``loss = -sum(t * log(max(p, eps))) / D``,
  ``dp = -t / max(p, eps) / D`` where ``p > eps``, else 0;
- sparse CCE: CCE of the integer labels' ONE_HOT rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .emit import Emitter

LOSSES = ("mean_squared_error", "categorical_crossentropy", "sparse_categorical_crossentropy")
REDUCTIONS = ("sum_over_batch_size", "sum")


@dataclass(frozen=True)
class LossSpec:
    """``name`` (a `LOSSES` name), the reduction over the batch, and for cross-entropy how
    the tensor read is taken: logits (times ``beta``) or probabilities clipped below at
    ``eps``."""

    name: str
    reduction: str = "sum_over_batch_size"
    from_logits: bool = False
    beta: float = 1.0
    eps: float = 1e-20

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"unknown loss {self.name!r}: expected one of {', '.join(LOSSES)}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}: expected one of "
                             f"{', '.join(REDUCTIONS)}")

    def target(self, pred_shape: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
        """The shape and dtype of the targets for predictions of ``pred_shape``."""
        if self.name == "sparse_categorical_crossentropy":
            return pred_shape[:-1], "int32"
        return pred_shape, "float32"


def emit_loss(e: Emitter, spec: LossSpec, pred: int, target: int) -> tuple[int, int]:
    """(the scalar loss, the cotangent of ``pred``) emitted for predictions ``pred``."""
    shape = e.shape(pred)
    axes = list(range(len(shape)))
    if spec.name == "mean_squared_error":
        per_position = math.prod(shape)
        divisor = per_position / (shape[0] if spec.reduction == "sum" else 1)
        diff = e.sub(pred, target)
        loss = e.scale(e.reduce("SUM", e.mul(diff, diff), axes, keep_dims=False), 1 / divisor)
        return loss, e.scale(diff, 2 / divisor)
    positions = math.prod(shape[:-1])
    divisor = positions / (shape[0] if spec.reduction == "sum" else 1)
    if spec.name == "sparse_categorical_crossentropy":
        target = e.op("ONE_HOT", [target, e.const(shape[-1], "int32"), e.scalar(1.0),
                                  e.scalar(0.0)], shape, {"axis": -1})
    if spec.from_logits:
        z = e.scale(pred, spec.beta)
        log_p = e.op("LOG_SOFTMAX", [z], shape)
        total = e.reduce("SUM", target, [-1], keep_dims=True)
        dz = e.sub(e.mul(e.op("SOFTMAX", [z], shape, {"beta": 1.0}), total), target)
        dpred = e.scale(dz, spec.beta / divisor)
    else:
        eps = e.scalar(spec.eps)
        clipped = e.binary("MAXIMUM", pred, eps)
        log_p = e.unary("LOG", clipped)
        inside = e.mask("GREATER", pred, eps)
        dpred = e.mul(e.scale(e.div(target, clipped), -1 / divisor), inside)
    loss = e.scale(e.reduce("SUM", e.mul(target, log_p), axes, keep_dims=False), -1 / divisor)
    return loss, dpred
