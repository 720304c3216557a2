"""The training step, composed: a core pure step (loss, gradients, optimizer update) and the
transforms around it, each one concern.

A step is ``step(state, frozen, batch) -> (state, metrics, observed)`` over a `TrainState`,
the frozen params (never differentiated) and one batch ``(inputs, targets)``; ``observed``
is what the forward saw that a transform around the step consumes (a QAT model's batch
ranges). A gradient function is ``grads(loss_scale, params, frozen, batch) ->
(ScaledGrads, extras)``, ``extras`` the optimizer's extra arguments (optax's
``GradientTransformationExtraArgs``). Rules, innermost first, as `training_step`
composes them:

- `gradients`: `circle_jax.optim.scaled_value_and_grad` of the loss: loss scaling's
  scale, unscale and scale adjustment, and the in-step micro-batch accumulation
  (``accumulate_mode="in_step"``) live there. The loss is ``loss(params, frozen, batch,
  squares=None) -> (loss, (correct, observed))``;
- `row_squares_gradients` instead, for Keras's sparse-gradient Adam: it differentiates a
  zero tensor per embedding table beside the params (the loss reads the tables as
  `circle_jax.lowering.interpreter.RowSquares`) and hands their cotangents, the
  per-occurrence squares, to the optimizer as ``row_squares``
  (`circle_jax.optim.keras_sparse_adam`);
- `packed_gradients`: params carried `circle_jax.optim.flat.Packed` (the vector weights in
  one vector) are unpacked for the loss and their gradients packed like them, so the
  optimizer updates the packed layout;
- `core_step`: gradients, ``tx.update(grads, opt_state, params, **extras)``,
  ``optax.apply_updates``; the loss scale as the gradients adjusted it, the step count
  advanced, the statistics passed on as they are;
- `moving_ranges`: a QAT model's moving activation ranges (``TrainState.stats``) go to the
  forward as params and are updated from what it observed
  (`circle_jax.ops.fake_quant.moving_average`; over micro-batches, their min and max);
- `skip_overflows`: with loss scaling, a step whose gradients were not finite keeps the
  params, optimizer state and statistics (the loss scale and step count move on); without
  it every update is applied, as onert, Keras and optax do;
- gradient accumulation across steps (``accumulate_mode="stream"``) is an optax wrapper of
  the optimizer (`circle_jax.optim.accumulate`), not a transform of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import optax

from ..lowering.interpreter import RANGES
from ..ops.fake_quant import moving_average
from ..optim import NoLossScale, ScaledGrads, scaled_value_and_grad, select_tree
from ..optim.flat import Packed
from .data import Batch
from .state import StepMetrics, TrainState

#: ``step(state, frozen, batch) -> (state, metrics, observed)``
Step = Callable[[TrainState, dict, Batch], tuple[TrainState, StepMetrics, dict]]
#: ``grads(loss_scale, params, frozen, batch) -> (ScaledGrads, optimizer extras)``
GradFn = Callable[..., tuple[ScaledGrads, dict]]


def gradients(loss: Callable[..., Any], **options: Any) -> GradFn:
    """The loss's scaled gradients (`scaled_value_and_grad` with ``options``, ``has_aux``);
    no optimizer extras."""
    fn = scaled_value_and_grad(loss, has_aux=True, **options)

    def grads(loss_scale: Any, params: Any, frozen: dict, batch: Batch
              ) -> tuple[ScaledGrads, dict]:
        return fn(loss_scale, params, frozen, batch), {}

    return grads


def row_squares_gradients(loss: Callable[..., Any], tables: frozenset[str],
                          **options: Any) -> GradFn:
    """`gradients` with the per-occurrence squared row gradients of the embedding
    ``tables`` as the optimizer's ``row_squares`` (None for the other weights)."""
    def with_squares(differentiated: tuple, frozen: dict, batch: Batch) -> Any:
        params, squares = differentiated
        return loss(params, frozen, batch, squares=squares)

    fn = scaled_value_and_grad(with_squares, has_aux=True, **options)

    def grads(loss_scale: Any, params: Mapping[str, Any], frozen: dict, batch: Batch
              ) -> tuple[ScaledGrads, dict]:
        zeros = {k: jnp.zeros_like(params[k]) for k in tables}
        r = fn(loss_scale, (params, zeros), frozen, batch)
        weights, squares = r.grads
        return r._replace(grads=weights), {"row_squares": {k: squares.get(k) for k in weights}}

    return grads


def packed_gradients(grads: GradFn) -> GradFn:
    """``grads`` for params that may come `Packed`: unpacked for the loss, the gradients
    packed like the params."""
    def packed(loss_scale: Any, params: Any, frozen: dict, batch: Batch
               ) -> tuple[ScaledGrads, dict]:
        if not isinstance(params, Packed):
            return grads(loss_scale, params, frozen, batch)
        r, extras = grads(loss_scale, params.unpack(), frozen, batch)
        return r._replace(grads=params.like(r.grads)), extras

    return packed


def core_step(grads: GradFn, tx: Callable[[], optax.GradientTransformation]) -> Step:
    """One update by the optimizer ``tx()`` (asked for when traced) on ``grads``'
    gradients; metrics: the pre-update loss, the correct samples, and without loss scaling
    (a `NoLossScale` state) zero skipped steps and overflows."""
    def step(state: TrainState, frozen: dict, batch: Batch
             ) -> tuple[TrainState, StepMetrics, dict]:
        r, extras = grads(state.loss_scale, state.params, frozen, batch)
        updates, opt_state = tx().update(r.grads, state.opt_state, state.params, **extras)
        params = optax.apply_updates(state.params, updates)
        right, observed = r.aux
        new = TrainState(params, opt_state, r.loss_scale, state.step + 1, state.stats)
        correct = jnp.sum(right) if right is not None else jnp.zeros([], jnp.int32)
        if isinstance(state.loss_scale, NoLossScale):  # static: the pytree's type
            zero = jnp.zeros([], jnp.int32)
            return new, StepMetrics(r.loss, correct, zero, zero,
                                    state.loss_scale.loss_scale), observed
        return new, StepMetrics(r.loss, correct, (~r.grads_finite).astype(jnp.int32),
                                r.n_overflows, state.loss_scale.loss_scale), observed

    return step


def moving_ranges(step: Step, decay: float) -> Step:
    """``step`` with a QAT model's moving ranges (non-empty ``state.stats``) read by the
    forward and moved toward the batch's observed ones by ``decay``."""
    def wrapped(state: TrainState, frozen: dict, batch: Batch
                ) -> tuple[TrainState, StepMetrics, dict]:
        if not state.stats:
            return step(state, frozen, batch)
        new, metrics, seen = step(state, {**frozen, RANGES: state.stats}, batch)
        stats = {k: moving_average(v, *seen[k], decay) for k, v in state.stats.items()}
        return new._replace(stats=stats), metrics, {}

    return wrapped


def skip_overflows(step: Step, branch: bool) -> Step:
    """``step`` whose update is dropped (the loss scale and step count kept from it) where
    its metrics say it was skipped; nothing without loss scaling. ``branch``: choose with
    one conditional (`select_tree`; CPU)."""
    def wrapped(state: TrainState, frozen: dict, batch: Batch
                ) -> tuple[TrainState, StepMetrics, dict]:
        new, metrics, observed = step(state, frozen, batch)
        if isinstance(state.loss_scale, NoLossScale):
            return new, metrics, observed
        kept = state._replace(loss_scale=new.loss_scale, step=new.step)
        return select_tree(metrics.skipped == 0, new, kept, branch=branch), metrics, observed

    return wrapped


def training_step(loss: Callable[..., Any], tx: Callable[[], optax.GradientTransformation],
                  *, row_squares: frozenset[str], range_decay: float, branch: bool,
                  **options: Any) -> Callable[[TrainState, dict, Batch],
                                              tuple[TrainState, StepMetrics]]:
    """The composed step (the module docstring's order): ``step(state, frozen, batch) ->
    (state, metrics)``; ``options`` go to `scaled_value_and_grad`."""
    grads = row_squares_gradients(loss, row_squares, **options) if row_squares \
        else gradients(loss, **options)
    composed = skip_overflows(moving_ranges(core_step(packed_gradients(grads), tx),
                                            range_decay), branch)

    def step(state: TrainState, frozen: dict, batch: Batch
             ) -> tuple[TrainState, StepMetrics]:
        new, metrics, _ = composed(state, frozen, batch)
        return new, metrics

    return step

