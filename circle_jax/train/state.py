"""The values training passes around: the state pytree, per-step metrics, the per-epoch
history and what ``fit`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax

from ..optim import LossScale


class TrainState(NamedTuple):
    """The whole training state, a pytree.

    Attributes:
      params: trainable params (float32 masters when the variable dtype is half).
      opt_state: the optax state of `Trainer.tx` (includes the accumulation state when
        accumulating); an optimizer's per-weight state (Adam's moments) is one vector over
        the raveled weights, laid out per weight by `Trainer.per_weight_state`.
      loss_scale: the loss-scale state (scale and growth counter are array leaves).
      step: int32 count of micro-steps taken (skipped ones included).
      stats: statistics the steps keep besides the params: a QAT model's moving activation
        ranges (``load(qat_ranges="ema")``: group name -> float32 ``[min, max]``, updated
        every micro-step, `circle_jax.ops.fake_quant.moving_average`); empty otherwise.
    """

    params: dict[str, jax.Array]
    opt_state: Any
    loss_scale: LossScale
    step: jax.Array
    stats: dict[str, jax.Array] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)


class StepMetrics(NamedTuple):
    """Per-step results, stacked over an epoch by the scan."""

    loss: jax.Array  # pre-update loss of the batch
    correct: jax.Array  # samples whose argmax matches the target's (categorical accuracy)
    skipped: jax.Array  # 1 when the update was skipped for non-finite gradients
    overflows: jax.Array  # gradient overflows seen (retries included)
    scale: jax.Array  # loss scale used


@dataclass
class History:
    """Per-epoch results of ``fit``."""

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    loss_scale: list[float] = field(default_factory=list)
    #: wall time per step of each epoch; when ``fit`` ran all epochs in one call, the
    #: run's average for every epoch
    ms_per_step: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    #: ``fit``'s time before its first epoch: data checked and moved to the device, state
    #: initialized, epochs compiled (``compile_ms`` of it)
    prepare_ms: float = 0.0
    compile_ms: float = 0.0
    #: set (once) when an epoch skipped steps with the loss scale at its floor: which
    #: tensor of the step turned non-finite first (`circle_jax.train.diagnose`); ``fit``
    #: also warns it (`circle_jax.LossScaleWarning`)
    overflow: str | None = None
