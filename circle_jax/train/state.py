"""The values training passes around: the state pytree, per-step metrics, the per-epoch
history and what ``fit`` returns."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

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


def epoch_metrics(parts: list[StepMetrics], tail: bool) -> StepMetrics:
    """An epoch's metrics from its programs' (`Trainer.run_epoch`): its chunks' (a steps
    axis each) and, with ``tail``, the trailing partial batch's step's (the last part); a
    whole epoch's as they are, else `_joined`."""
    return parts[0] if len(parts) == 1 and not tail else _joined(parts, tail)


@functools.partial(jax.jit, static_argnums=1)
def _joined(parts: list[StepMetrics], tail: bool) -> StepMetrics:
    """`epoch_metrics` joined on the steps axis in one compiled call, compiled once per
    epoch layout (`Trainer.compile_epoch` runs it first)."""
    if tail:
        parts = [*parts[:-1], jax.tree.map(lambda a: a[None], parts[-1])]
    return jax.tree.map(lambda *a: jnp.concatenate(a), *parts)


def same_arrays(kept: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    """Whether ``given`` holds the same names and the very same (device array) objects as
    ``kept``."""
    return kept.keys() == given.keys() and all(kept[k] is v for k, v in given.items())
