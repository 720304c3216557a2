"""`make_train_step`: a model's training step as a pair of pure functions, in optax's style.

``init(params) -> state`` and ``step(state, batch) -> (state, metrics)`` are pure and
jit-able: no host work, no side effects, the same values for the same arguments. They are
`Trainer.train_step` (the step composed in `circle_jax.train.compose`), the one training
step ``fit``, `Trainer`'s compiled epochs and the checkpoint driver run (the same
configuration gives the same step, value for value), with
the frozen params carried in the state beside the `TrainState` so that nothing is closed
over but the model and the configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from ..lowering.interpreter import RANGES
from ..model import Model
from .config import TrainConfig
from .data import Batch
from .state import StepMetrics, TrainState
from .trainer import Trainer


class StepState(NamedTuple):
    """What `make_train_step`'s functions carry: the training state and the frozen params
    (never differentiated; a step passes them on as they are)."""

    train: TrainState
    frozen: dict[str, jax.Array]


class TrainStep(NamedTuple):
    """`make_train_step`'s result: ``init``, ``step`` and the `Trainer` they come from (its
    `Trainer.merge` gives the params in the model's dtypes, for ``model.apply`` and export:
    ``trainer.merge(state.train, state.frozen)``)."""

    init: Callable[[Mapping[str, Any] | None], StepState]
    step: Callable[[StepState, Batch], tuple[StepState, StepMetrics]]
    trainer: Trainer


def make_train_step(model: Model, config: TrainConfig | None = None,
                    **overrides: Any) -> TrainStep:
    """The training step of ``model`` under ``config`` with ``overrides`` (TrainConfig
    fields, resolved once against the model's circle+ values, as ``fit`` does).

    ``init(params=None)``: the fresh state for ``params`` (default: the model's; a QAT
    model's moving ranges under `circle_jax.lowering.interpreter.RANGES` continue).
    ``step(state, batch)``: one update on ``batch = (inputs, targets)``, ``inputs`` a tuple
    with one array per model input (a batch of ``batch_size`` samples on axis 0), returning
    the new state and the batch's `StepMetrics` (pre-update loss, correct samples, skipped
    and overflowed for loss scaling, the scale used). Both are pure: ``jax.jit`` them, scan
    ``step`` over batches, or shard them as any JAX function.
    """
    trainer = Trainer(model, config, **overrides)

    def init(params: Mapping[str, Any] | None = None) -> StepState:
        params = dict(model.params if params is None else params)
        ranges = params.pop(RANGES, None)
        trainable = {k: v for k, v in params.items() if k in trainer.trainable}
        frozen = trainer.split_params(params)[1]
        state = trainer._fresh_state(trainable)
        return StepState(state if ranges is None else state._replace(stats=ranges), frozen)

    def step(state: StepState, batch: Batch) -> tuple[StepState, StepMetrics]:
        x, y = batch
        train, metrics = trainer.train_step(state.train, state.frozen, (tuple(x), y))
        return StepState(train, state.frozen), metrics

    return TrainStep(init, step, trainer)
