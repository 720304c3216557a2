"""The training step of one model and configuration, pure, in optax's style.

`TrainingStep` resolves a `TrainConfig` once against the model (its circle+ values, the
numerics profile, the precision policy, the trainable set) and holds the step's pure
functions: ``fresh_state``, ``train_step`` (the composed step of `circle_jax.train.compose`:
loss scaling, packed params, Keras's sparse Adam and QAT statistics around one optimizer
update), ``merge``. `make_train_step` gives them as ``init(params) -> state`` and
``step(state, batch) -> (state, metrics)``, pure and jit-able, with the frozen params
carried in the state beside the `TrainState` so that nothing is closed over but the model
and the configuration. `circle_jax.train.Trainer` drives this step (its compiled epochs),
as ``fit`` and the checkpoint driver do through it: the same configuration gives the same
step, value for value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..distributed import DataParallel
from ..errors import ConfigError
from ..losses import loss_name
from ..lowering.interpreter import RANGES, RowSquares
from ..model import Model
from ..optim import NoLossScale, Policy, get_policy, loss_scale_from_spec, optimizer_name
from ..optim.flat import Packed, flattened
from ..optim.precision import float32_weight_grads, grad_cast
from .compose import training_step
from .config import (
    TrainConfig,
    check_loss_output,
    check_overrides,
    loss_function,
    optimizer,
    output_index,
    select_trainable,
    training_reduction,
)
from .data import Batch, correct
from .numerics import training_numerics
from .state import StepMetrics, TrainState


class TrainingStep:
    """The pure training step of ``model`` under ``config`` with ``overrides`` (TrainConfig
    fields, resolved once against the model's circle+ values and the defaults); ``placement``:
    the device mesh batches are sharded over (`circle_jax.distributed`; None: one device),
    whose backend chooses the operator lowerings unless the model's lowering names one."""

    def __init__(self, model: Model, config: TrainConfig | None = None, *,
                 placement: DataParallel | None = None, **overrides: Any):
        check_overrides(overrides)
        config = replace(config or TrainConfig(), **overrides).with_defaults(model)
        self.model, self.config = model, config
        self.placement = placement
        #: the platform the epochs run on ("cpu", "gpu", ...)
        self.platform: str = jax.default_backend() if placement is None else placement.platform
        self.policy: Policy = get_policy(config.precision)
        lowering: dict[str, Any] = {} if placement is None or \
            model.lowering.backend is not None else {"backend": placement.platform}
        if self.policy.float32_ops:  # the policy's float32 operators (half compute)
            lowering["float32_ops"] = self.policy.float32_ops
        if float32_weight_grads(self.policy):
            lowering["half_weights"] = np.dtype(self.policy.compute_dtype).name
        #: the changes to the model's lowering options the training forward is lowered with
        self.lowering_changes: dict[str, Any] = lowering
        self.reduction = reduction = training_reduction(config.reduction)
        self.loss_output = output_index(model, config.loss_output)  #: the output the loss reads
        check_loss_output(model, config, self.loss_output)
        #: the numerics profile's choices for this run (`circle_jax.train.numerics`)
        self.numerics = training_numerics(
            model, loss_name(config.loss), optimizer_name(config.optimizer), config.numerics,
            config.from_logits, config.clip, dict(config.optimizer_kwargs), lowering,
            self.loss_output)
        self.loss_fn = loss_function(config, reduction, self.numerics.from_logits,
                                     self.numerics.clip)
        self.micro_batches = config.accumulate if config.accumulate_mode == "in_step" else 1
        acc_reduction = "sum" if reduction.value == "sum" else "mean"
        # Masters and the loss are float32 at least; a float64 policy trains in float64.
        self.master_dtype = np.promote_types(self.policy.param_dtype, np.float32)
        self.loss_dtype = np.promote_types(self.policy.output_dtype, np.float32)
        wide = [str(d) for d in (self.policy.param_dtype, self.policy.compute_dtype,
                                 self.policy.output_dtype) if np.dtype(d).itemsize > 4]
        if wide and not jax.config.jax_enable_x64:
            raise ConfigError(f"precision {str(self.policy)!r} uses {wide[0]}, which needs 64-bit "
                              "JAX: jax.config.update('jax_enable_x64', True) or "
                              "`with jax.enable_x64(True):`")
        if placement is not None:
            placement.check_batch(config.batch_size, self.micro_batches)
        self.trainable = select_trainable(model, config.trainable)
        #: embedding tables whose Adam second moment takes per-occurrence squares
        self.row_squares = self.numerics.row_squares & self.trainable
        if self.row_squares and (config.accumulate > 1 or not isinstance(
                loss_scale_from_spec(config.loss_scale), NoLossScale)):
            raise ConfigError(f"numerics {self.numerics.numerics.name!r} trains embedding "
                              "tables with Keras's sparse-gradient Adam, which does not combine "
                              "with gradient accumulation or loss scaling; drop those, or use "
                              "a profile with embedding_adam='dense'")
        #: the configuration's optimizer, one state per weight (see `tx`)
        self.per_weight_tx = optimizer(config, self.numerics, reduction,
                                       sparse_rows=bool(self.row_squares))
        self._step_options = {"on_overflow": config.on_overflow, "micro_batches":
                              self.micro_batches, "reduction": acc_reduction,
                              "micro_batch_groups": 1 if placement is None else placement.size,
                              # unscaled updates are all applied (`compose.skip_overflows`)
                              "test_unscaled": False}

    @functools.cached_property
    def tx(self) -> optax.GradientTransformation:
        """The optimizer the steps run: `per_weight_tx`, on the weights raveled into one vector
        where it keeps per-weight state (`circle_jax.optim.flat`). Decided when first asked
        for (a trace of its init), never by a run whose programs come from the cache."""
        if self.row_squares:  # Keras's sparse-gradient Adam: its squares come per weight
            return self.per_weight_tx
        masters = jax.eval_shape(lambda p: self.split_params(p)[0], self.model.params)
        return flattened(self.per_weight_tx, masters) or self.per_weight_tx

    @staticmethod
    def unpacked(state: TrainState) -> TrainState:
        """``state`` with its params by name (the inverse of `Trainer.packed`; as it is
        where they are by name already)."""
        if not isinstance(state.params, Packed):
            return state
        return state._replace(params=state.params.unpack())

    def split_params(self, params: Mapping[str, Any]) -> tuple[dict, dict]:
        """(trainable masters in ``master_dtype``, frozen params as stored)."""
        trainable = {k: jnp.asarray(v, self.master_dtype) if jnp.issubdtype(
            jnp.asarray(v).dtype, jnp.floating) else jnp.asarray(v)
                     for k, v in params.items() if k in self.trainable}
        frozen = {k: v if k == RANGES else jnp.asarray(v) for k, v in params.items()
                  if k not in self.trainable}
        return trainable, frozen

    def fresh_state(self, trainable: dict) -> TrainState:
        """The state before the first step: the ``trainable`` params as masters, the
        optimizer's initial state, the configured loss scale, step 0 and the model's
        moving ranges."""
        trainable = self.split_params(trainable)[0]
        return TrainState(trainable, self.tx.init(trainable),
                          loss_scale_from_spec(self.config.loss_scale), jnp.zeros([], jnp.int32),
                          {k: jnp.asarray(v) for k, v in self.model.ranges.items()})

    def masters(self, state: TrainState, frozen: Mapping[str, Any]) -> dict[str, Any]:
        """All params, the trainable ones as their masters, and the moving ranges."""
        return {**self.unpacked(state).params, **frozen,
                **({RANGES: state.stats} if state.stats else {})}

    def merge(self, state: TrainState, frozen: Mapping[str, Any]) -> dict[str, jax.Array]:
        """All params in the model's own dtypes (for ``model.apply`` and export), with a QAT
        model's moving activation ranges (`circle_jax.lowering.interpreter.RANGES`)."""
        stored = {k: v.dtype for k, v in self.model.params.items()}
        out = {k: v if v.dtype == stored[k] else jnp.asarray(v, stored[k])
               for k, v in self.unpacked(state).params.items()}
        out.update(frozen)
        return {**out, RANGES: state.stats} if state.stats else out

    # -- the pure step -----------------------------------------------------------------
    def forward_params(self, trainable: dict, frozen: dict) -> dict:
        """The params the training forward reads: the trainable masters rounded to the param
        dtype, and the frozen params, in the compute dtype; with float32 weight gradients
        (`float32_weight_grads`) the trainable ones stay float32 and the lowering rounds
        them to half at each operator that reads them (`LoweringOptions.half_weights`).
        Moving activation ranges in ``frozen`` stay float32."""
        p, ranges = self.policy, {k: v for k, v in frozen.items() if k == RANGES}
        frozen = {k: v for k, v in frozen.items() if k != RANGES}
        weights = p.cast_to_param(grad_cast(trainable, p.grad_dtype))
        if "half_weights" in self.lowering_changes:
            return {**weights, **p.cast_to_compute(frozen), **ranges}
        return {**p.cast_to_compute({**weights, **frozen}), **ranges}

    def _forward(self, trainable: dict, frozen: dict, x: Sequence[jax.Array],
                 in_loop: bool = False, observed: dict | None = None,
                 squares: Mapping[str, jax.Array] | None = None) -> jax.Array:
        p = self.policy
        squares = squares or {}
        params = self.forward_params(trainable, frozen)
        # an embedding table with per-occurrence squares (Keras's sparse Adam) in the compute
        # dtype, as the other params before the lowering
        params.update({k: p.cast_to_compute(RowSquares(params[k], s))
                       for k, s in squares.items()})
        apply = self.numerics.apply_in_loop if in_loop else self.numerics.apply
        seen = {} if observed is None else {"observed": observed}  # moving ranges' batch
        out = apply(params, *p.cast_to_compute(tuple(x)), **seen)[self.loss_output]
        return p.cast_to_output(out).astype(self.loss_dtype)

    def _loss(self, trainable: dict, frozen: dict, batch: Batch, in_loop: bool = False,
              squares: Mapping[str, jax.Array] | None = None) -> tuple[jax.Array, tuple]:
        """(the loss, (the correct samples, the moving ranges' observed batch ranges: a
        QAT model's, else empty)); ``squares``: Keras's sparse Adam's per-table zeros
        (`compose.row_squares_gradients`)."""
        x, y = batch
        seen = {} if RANGES in frozen else None  # a QAT model's moving ranges: observed too
        out = self._forward(trainable, frozen, x, in_loop, seen, squares)
        loss = self.loss_fn(out, y)  # first: it checks the output against the targets
        return loss, (correct(out, y, self.config.ignore_index), seen or {})

    @functools.cached_property
    def _steps(self) -> dict[bool, Callable[..., tuple[TrainState, StepMetrics]]]:
        """The composed step (`circle_jax.train.compose.training_step`) traced outside and
        inside a loop body."""
        return {in_loop: training_step(
            functools.partial(self._loss, in_loop=in_loop), lambda: self.tx,
            row_squares=self.row_squares, range_decay=self.model.qat_range_decay,
            branch=self.platform == "cpu", **self._step_options) for in_loop in (False, True)}

    def train_step(self, state: TrainState, frozen: dict, batch: Batch, in_loop: bool = False
                   ) -> tuple[TrainState, StepMetrics]:
        """One pure training step on one batch (one micro-batch when streaming): the
        composed step of `circle_jax.train.compose` (loss scaling, packed params, Keras's
        sparse Adam and QAT statistics around one optimizer update).

        With loss scaling, a step whose gradients are not finite is skipped (or retried).
        Without it nothing is skipped: the update is applied as onert, Keras and optax do,
        and ``fit`` reports the divergence. (Skipping there would only hide it, and the
        finiteness test and the state selection cost a quarter of a small model's step.)
        """
        # in_loop: traced in a loop body (an epoch's scan, or the in-step micro-batch scan)
        return self._steps[in_loop or self.micro_batches > 1](state, frozen, batch)


class StepState(NamedTuple):
    """What `make_train_step`'s functions carry: the training state and the frozen params
    (never differentiated; a step passes them on as they are)."""

    train: TrainState
    frozen: dict[str, jax.Array]


class TrainStep(NamedTuple):
    """`make_train_step`'s result: ``init``, ``step`` and the `TrainingStep` they come from
    (its `TrainingStep.merge` gives the params in the model's dtypes, for ``model.apply``
    and export: ``definition.merge(state.train, state.frozen)``)."""

    init: Callable[[Mapping[str, Any] | None], StepState]
    step: Callable[[StepState, Batch], tuple[StepState, StepMetrics]]
    definition: TrainingStep


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
    definition = TrainingStep(model, config, **overrides)

    def init(params: Mapping[str, Any] | None = None) -> StepState:
        params = dict(model.params if params is None else params)
        ranges = params.pop(RANGES, None)
        trainable = {k: v for k, v in params.items() if k in definition.trainable}
        frozen = definition.split_params(params)[1]
        state = definition.fresh_state(trainable)
        return StepState(state if ranges is None else state._replace(stats=ranges), frozen)

    def step(state: StepState, batch: Batch) -> tuple[StepState, StepMetrics]:
        x, y = batch
        train, metrics = definition.train_step(state.train, state.frozen, (tuple(x), y))
        return StepState(train, state.frozen), metrics

    return TrainStep(init, step, definition)
