"""Training: a ``TrainState`` pytree, a pure jitted step, and epochs as one ``lax.scan``.

Data flow per step: trainable params (masters: float32, or float64 under a float64 policy)
→ cast to the variable then compute dtype → ``model.apply`` → loss in float32 (float64
under a float64 output dtype) → scaled gradients (optionally accumulated over
micro-batches inside the step) → unscaled, finiteness-checked → optax update (optionally
accumulated across steps) → new state, or the old state on a skipped overflow step.
Frozen params are a separate argument that is never differentiated.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from .distributed import DataParallel, local
from .errors import DataError, TrainingError
from .formats.rawdata import check_training_data
from .hoisting import split_step
from .losses import get_loss, get_reduction, loss_name
from .model import Model
from .numerics_train import training_numerics
from .optim import (
    LossScale,
    NoLossScale,
    Policy,
    accumulate,
    all_finite,
    get_optimizer,
    get_policy,
    loss_scale_from_spec,
    optimizer_name,
    scaled_value_and_grad,
    select_tree,
)
from .train_config import TrainConfig, select_trainable

Batch = tuple[tuple[jax.Array, ...], jax.Array]


class TrainState(NamedTuple):
    """The whole training state, a pytree.

    Attributes:
      params: trainable params (float32 masters when the variable dtype is half).
      opt_state: the optax state (includes the accumulation state when accumulating).
      loss_scale: the loss-scale state (scale and growth counter are array leaves).
      step: int32 count of micro-steps taken (skipped ones included).
    """

    params: dict[str, jax.Array]
    opt_state: Any
    loss_scale: LossScale
    step: jax.Array


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
    ms_per_step: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    compile_ms: float = 0.0


class Trainer:
    """Compiled training and evaluation for one model and configuration; ``placement``: the
    device mesh that batches are sharded over (`circle_jax.distributed`; None: one device),
    whose backend chooses the operator lowerings unless the model's lowering names one."""

    def __init__(self, model: Model, config: TrainConfig | None = None, *,
                 placement: DataParallel | None = None, **overrides: Any):
        config = replace(config or TrainConfig(), **overrides).with_defaults(model)
        self.model, self.config = model, config
        #: ``progress(done, total)`` is called from inside the compiled epoch (set it before
        #: the first epoch compiles; the CLI's progress bar)
        self.progress: Callable[[Any, Any], None] | None = None
        #: compute the steps' data-only work for a whole epoch before its loop
        #: (`circle_jax.hoisting`; set before the first epoch compiles)
        self.hoist = True
        self.placement = placement
        lowering = {} if placement is None or model.lowering.backend is not None else \
            {"backend": placement.platform}
        reduction = get_reduction(config.reduction)
        #: the numerics profile's choices for this run (`circle_jax.numerics_train`)
        self.numerics = training_numerics(
            model, loss_name(config.loss), optimizer_name(config.optimizer), config.numerics,
            config.from_logits, config.clip, dict(config.optimizer_kwargs), lowering)
        loss_kwargs: dict[str, Any] = {"reduction": reduction}
        if loss_name(config.loss) != "mean_squared_error":
            loss_kwargs["from_logits"] = self.numerics.from_logits
            loss_kwargs["clip"] = self.numerics.clip
        self.loss_fn = get_loss(config.loss, **loss_kwargs)
        inner = get_optimizer(config.optimizer, config.learning_rate,
                              **self.numerics.optimizer_kwargs)
        if config.accumulate_mode not in ("stream", "in_step"):
            raise ValueError(f"accumulate_mode must be 'stream' or 'in_step', got "
                             f"{config.accumulate_mode!r}")
        if config.accumulate < 1:
            raise ValueError(f"accumulate must be >= 1, got {config.accumulate}")
        stream_k = config.accumulate if config.accumulate_mode == "stream" else 1
        self.micro_batches = config.accumulate if config.accumulate_mode == "in_step" else 1
        acc_reduction = "sum" if reduction.value == "sum" else "mean"
        self.tx = accumulate(inner, stream_k, acc_reduction) if stream_k > 1 else inner
        self.policy: Policy = get_policy(config.precision)
        # Masters and the loss are float32 at least; a float64 policy trains in float64.
        self.master_dtype = np.promote_types(self.policy.param_dtype, np.float32)
        self.loss_dtype = np.promote_types(self.policy.output_dtype, np.float32)
        wide = [str(d) for d in (self.policy.param_dtype, self.policy.compute_dtype,
                                 self.policy.output_dtype) if np.dtype(d).itemsize > 4]
        if wide and not jax.config.jax_enable_x64:
            raise ValueError(f"precision {str(self.policy)!r} uses {wide[0]}, which needs 64-bit "
                             "JAX: jax.config.update('jax_enable_x64', True) or "
                             "`with jax.enable_x64(True):`")
        if placement is not None:
            placement.check_batch(config.batch_size, self.micro_batches)
        self.trainable = select_trainable(model, config.trainable)
        self._grads = {in_loop: scaled_value_and_grad(
            functools.partial(self._loss, in_loop=in_loop), config.on_overflow, has_aux=True,
            micro_batches=self.micro_batches, reduction=acc_reduction,
            micro_batch_groups=1 if placement is None else placement.size,
        ) for in_loop in (False, True)}
        self._epoch = jax.jit(self._epoch_impl)
        self._shuffled_epoch = jax.jit(self._shuffled_epoch_impl)
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._step = jax.jit(self.train_step)
        self._eval = jax.jit(self._eval_impl)

    # -- state -------------------------------------------------------------------------
    def split_params(self, params: Mapping[str, Any]) -> tuple[dict, dict]:
        """(trainable masters in ``master_dtype``, frozen params as stored)."""
        trainable = {k: jnp.asarray(v, self.master_dtype) if self._master(v) else jnp.asarray(v)
                     for k, v in params.items() if k in self.trainable}
        frozen = {k: jnp.asarray(v) for k, v in params.items() if k not in self.trainable}
        return trainable, frozen

    def _master(self, v: Any) -> bool:
        return jnp.issubdtype(jnp.asarray(v).dtype, jnp.floating)

    def init(self, params: Mapping[str, Any] | None = None) -> tuple[TrainState, dict]:
        """A fresh state and the frozen params for ``params`` (default: the model's)."""
        trainable, frozen = self.split_params(params if params is not None else
                                              self.model.params)
        state = TrainState(trainable, self.tx.init(trainable),
                           loss_scale_from_spec(self.config.loss_scale),
                           jnp.zeros([], jnp.int32))
        return state, frozen

    def merge(self, state: TrainState, frozen: Mapping[str, Any]) -> dict[str, jax.Array]:
        """All params in the model's own dtypes (for ``model.apply`` and export)."""
        stored = {k: v.dtype for k, v in self.model.params.items()}
        out = {k: jnp.asarray(v, stored[k]) for k, v in state.params.items()}
        out.update(frozen)
        return out

    # -- the pure step -----------------------------------------------------------------
    def _forward(self, trainable: dict, frozen: dict, x: Sequence[jax.Array],
                 in_loop: bool = False) -> jax.Array:
        p = self.policy
        params = {**p.cast_to_param(_grad_cast(trainable, p.grad_dtype)), **frozen}
        apply = self.numerics.apply_in_loop if in_loop else self.numerics.apply
        out = apply(p.cast_to_compute(params), *p.cast_to_compute(tuple(x)))[0]
        return p.cast_to_output(out).astype(self.loss_dtype)

    def _loss(self, trainable: dict, frozen: dict, batch: Batch,
              in_loop: bool = False) -> tuple[jax.Array, jax.Array]:
        x, y = batch
        out = self._forward(trainable, frozen, x, in_loop)
        return self.loss_fn(out, y), _correct(out, y)

    def train_step(self, state: TrainState, frozen: dict, batch: Batch, in_loop: bool = False
                   ) -> tuple[TrainState, StepMetrics]:
        """One pure training step on one batch (one micro-batch when streaming).

        With loss scaling, a step whose gradients are not finite is skipped (or retried).
        Without it nothing is skipped: the update is applied as onert, Keras and optax do,
        and ``fit`` reports the divergence. (Skipping there would only hide it, and the
        finiteness test and the state selection cost a quarter of a small model's step.)
        """
        # in_loop: traced in a loop body (an epoch's scan, or the in-step micro-batch scan)
        r = self._grads[in_loop or self.micro_batches > 1](state.loss_scale, state.params,
                                                           frozen, batch)
        updates, opt_state = self.tx.update(r.grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = TrainState(params, opt_state, r.loss_scale, state.step + 1)
        correct = jnp.sum(r.aux) if r.aux is not None else jnp.zeros([], jnp.int32)
        if isinstance(state.loss_scale, NoLossScale):  # static: the pytree's type
            zero = jnp.zeros([], jnp.int32)
            return new, StepMetrics(r.loss, correct, zero, zero, state.loss_scale.loss_scale)
        kept = TrainState(state.params, state.opt_state, r.loss_scale, state.step + 1)
        new = select_tree(r.grads_finite, new, kept)
        metrics = StepMetrics(r.loss, correct, (~r.grads_finite).astype(jnp.int32),
                              r.n_overflows, state.loss_scale.loss_scale)
        return new, metrics

    def _epoch_impl(self, state: TrainState, frozen: dict, xs: tuple, ys: jax.Array):
        steps = ys.shape[0]
        report = self.progress
        every = max(1, steps // 40)

        # Without loss scaling the last three metrics are constants: they are stacked after
        # the loop instead of written by every step (three fewer operations per step).
        constant = isinstance(state.loss_scale, NoLossScale)

        def step(s: TrainState, fr: dict, batch: Batch) -> tuple[TrainState, tuple]:
            s, m = self.train_step(s, fr, batch, in_loop=True)
            return s, m[:2] if constant else m

        split = split_step(step, state, frozen, jax.tree.map(lambda a: a[0], (xs, ys)),
                           steps) if self.hoist else None
        if split is None:
            data, run = (xs, ys), step
        else:  # the batches' data-only work, for all of them at once (see hoisting)
            data, run = split.precompute(frozen, (xs, ys)), split.step

        def body(s: TrainState, b: tuple) -> tuple[TrainState, tuple]:
            i, batch = b
            s, m = run(s, frozen, batch)
            if report is not None:  # host callback ~40 times an epoch (terminals only)
                lax.cond((i + 1) % every == 0,
                         lambda: jax.debug.callback(report, i + 1, steps), lambda: None)
            return s, m

        state, m = lax.scan(body, state, (jnp.arange(steps), data))
        if constant:
            zeros = jnp.zeros([steps], jnp.int32)
            m = StepMetrics(*m, zeros, zeros, jnp.full([steps], state.loss_scale.loss_scale))
        return state, m

    def _shuffled_epoch_impl(self, state: TrainState, frozen: dict, x: tuple, y: jax.Array,
                             epoch: jax.Array):
        """The epoch on the samples in the order of epoch ``epoch``'s permutation, drawn and
        applied on the device: ``permutation(fold_in(key(seed), epoch), n)``."""
        b = self.config.batch_size
        steps = y.shape[0] // b
        perm = jax.random.permutation(
            jax.random.fold_in(jax.random.key(self.config.seed), epoch), y.shape[0])
        xs, ys = _batched(tuple(a[perm] for a in x), y[perm], b, steps)
        return self._epoch_impl(state, frozen, xs, ys)

    def _eval_impl(self, trainable: dict, frozen: dict, xs: tuple, ys: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
        def body(_: None, b: Batch) -> tuple[None, tuple[jax.Array, jax.Array]]:
            x, y = b
            out = self._forward(trainable, frozen, x, in_loop=True)  # as in training
            return None, (self.loss_fn(out, y), jnp.sum(_correct(out, y)))

        _, (losses, correct) = lax.scan(body, None, (xs, ys))
        return losses, correct

    # -- host-side driving ---------------------------------------------------------------
    def run_epoch(self, state: TrainState, frozen: dict, x: Sequence[jax.Array], y: jax.Array,
                  epoch: int = 0) -> tuple[TrainState, StepMetrics]:
        """One epoch: batches of ``batch_size`` (shuffled if configured), one compiled scan."""
        n = y.shape[0]
        b = self.config.batch_size
        steps = n // b
        if steps == 0 and self.config.drop_remainder:
            raise DataError(f"{n} training samples are fewer than one batch of {b}")
        args = self.epoch_arguments(state, frozen, x, y, epoch)
        state, metrics = self._compiled_epoch(*args, shuffled=self.config.shuffle)(*args)
        if not self.config.drop_remainder and n % b:
            if self.config.shuffle:  # the trailing samples of the permuted order
                perm = jax.random.permutation(
                    jax.random.fold_in(jax.random.key(self.config.seed), epoch), n)
                x, y = tuple(a[perm] for a in x), y[perm]
            tail = self.placed((tuple(a[steps * b:] for a in x), y[steps * b:]))
            state, m = self._step(state, frozen, tail)
            metrics = jax.tree.map(lambda a, c: jnp.concatenate([a, c[None]]), metrics, m)
        return state, metrics

    def placed(self, tree: Any, batch_axis: int | None = None) -> Any:
        """``tree`` on the placement's devices (sharded on ``batch_axis``), or as it is."""
        return tree if self.placement is None else self.placement.put(tree, batch_axis)

    def epoch_arguments(self, state: TrainState, frozen: dict, x: Sequence[jax.Array],
                        y: jax.Array, epoch: int = 0) -> tuple:
        """The compiled epoch's arguments: the data cut into batches, or with ``shuffle``
        all of it and the epoch number (the permutation is drawn inside)."""
        if self.config.shuffle:
            return (state, frozen, *self.placed((tuple(x), y), batch_axis=0),
                    jnp.asarray(epoch, jnp.int32))
        b = self.config.batch_size
        return (state, frozen, *self.placed(_batched(x, y, b, y.shape[0] // b), batch_axis=1))

    def _compiled_epoch(self, *args: Any, shuffled: bool = False
                        ) -> Callable[..., tuple[TrainState, StepMetrics]]:
        """The epoch (``shuffled``: the one drawing its permutation, see `epoch_arguments`)
        compiled ahead of time for these arguments' shapes (cached), so that compile time is
        measured apart from steady-state steps."""
        key = str((shuffled, jax.tree.structure(args),
                   [(a.shape, a.dtype, getattr(a, "sharding", None))
                    for a in jax.tree.leaves(args)]))
        if key not in self._compiled:
            epoch = self._shuffled_epoch if shuffled else self._epoch
            self._compiled[key] = _compile(epoch.lower(*args), self.placement)
        return self._compiled[key]

    def evaluate(self, params: Mapping[str, Any], x: Sequence[Any], y: Any,
                 batch_size: int | None = None) -> tuple[float, float]:
        """(mean batch loss, categorical accuracy) over the data, in batches.

        ``params`` are all params (model dtypes, or ``{**state.params, **frozen}`` for the
        full-precision masters); the forward runs as in training (precision policy).
        """
        x, y = _as_inputs(self.model, x), jnp.asarray(y)
        n = y.shape[0]
        if n == 0:
            raise DataError("no samples to evaluate")
        b = min(batch_size or self.config.batch_size, n)
        steps = n // b
        xs, ys = self.placed(_batched(x, y, b, steps))
        losses, correct = self._eval(*self.placed(self.split_params(params)), xs, ys)
        return float(jnp.mean(losses)), float(jnp.sum(correct)) / (steps * b)


#: XLA options for compiled epochs on CPU: classic fusion emitters (benchmarks/README.md).
CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


def _compile(lowered: jax.stages.Lowered, placement: DataParallel | None) -> Callable[..., Any]:
    """Compile with ``CPU_COMPILER_OPTIONS`` for CPU devices; without them where this XLA
    lacks one."""
    if (jax.default_backend() if placement is None else placement.platform) == "cpu":
        try:
            return lowered.compile(compiler_options=CPU_COMPILER_OPTIONS)
        except Exception as e:  # XLA's runtime error type moved between jaxlib versions
            if "compile option" not in str(e):
                raise
    return lowered.compile()


def _batched(x: Sequence[jax.Array], y: jax.Array, b: int, steps: int) -> tuple[tuple, jax.Array]:
    def cut(a: jax.Array) -> jax.Array:
        return a[: steps * b].reshape((steps, b) + a.shape[1:])

    return tuple(cut(a) for a in x), cut(y)


def _correct(out: jax.Array, y: jax.Array) -> jax.Array:
    """Per-sample categorical accuracy (argmax, first max wins); sparse labels accepted."""
    pred = jnp.argmax(out.reshape(out.shape[0], -1), axis=-1)
    if y.ndim == out.ndim and y.shape[-1] == out.shape[-1] and out.shape[-1] > 1:
        target = jnp.argmax(y.reshape(y.shape[0], -1), axis=-1)
    else:
        target = y.reshape(y.shape[0]).astype(pred.dtype)
    return (pred == target).astype(jnp.int32)


def _grad_cast(tree: dict, dtype: Any) -> dict:
    """Identity forward; the backward rounds cotangents to ``dtype`` (the gradient dtype).

    A no-op where the masters already have that dtype (float32, or float64 under x64).
    """
    if all(np.dtype(v.dtype) == np.dtype(dtype) for v in jax.tree.leaves(tree)
           if jnp.issubdtype(v.dtype, jnp.floating)):
        return tree
    return _round_cotangent(tree, np.dtype(dtype))


def _round_cotangent(tree: dict, dtype: np.dtype) -> dict:
    @jax.custom_vjp
    def ident(t: dict) -> dict:
        return t

    def fwd(t: dict) -> tuple[dict, None]:
        return t, None

    def bwd(_: None, g: dict) -> tuple[dict]:
        return (jax.tree.map(lambda a: a.astype(dtype).astype(a.dtype), g),)

    ident.defvjp(fwd, bwd)
    return ident(tree)


def _as_inputs(model: Model, x: Any) -> tuple[jax.Array, ...]:
    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if len(xs) != len(model.inputs):
        raise DataError(f"the model has {len(model.inputs)} inputs, got {len(xs)} arrays")
    out = []
    for a, spec in zip(xs, model.inputs):
        a = np.asarray(a)
        if a.shape[1:] != spec.shape[1:]:
            raise DataError(f"input {spec.name!r}: samples of shape {list(a.shape[1:])}, "
                            f"the model expects {list(spec.shape[1:])}")
        out.append(jnp.asarray(a, spec.dtype))
    return tuple(out)


@dataclass
class FitResult:
    """What ``fit`` returns: trained params (model dtypes), the final state and history."""

    params: dict[str, jax.Array]
    state: TrainState
    history: History
    trainer: Trainer


def split_validation(x: tuple, y: Any, fraction: float) -> tuple[tuple, Any, tuple, Any]:
    """(train x, train y, val x, val y): the LAST ``fraction`` of samples validate (onert)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation_split must be in [0, 1), got {fraction}")
    n = y.shape[0]
    n_val = int(n * fraction)
    cut = n - n_val
    return tuple(a[:cut] for a in x), y[:cut], tuple(a[cut:] for a in x), y[cut:]


def fit(
    model: Model,
    x: Any,
    y: Any,
    config: TrainConfig | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    state: TrainState | None = None,
    on_epoch: Callable[[int, History], None] | None = None,
    progress: Callable[[Any, Any], None] | None = None,
    devices: int | Sequence[jax.Device] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    **overrides: Any,
) -> FitResult:
    """Train ``model`` on (x, y): epochs of compiled scans, onert's conventions by default.

    ``x`` is an array or a sequence of arrays (one per model input) with samples on axis 0.
    Returns trained params, the final ``TrainState`` and a ``History`` of per-epoch loss
    (mean of the batches' pre-update losses), accuracy, validation loss, skipped steps,
    loss scale and ms/step. ``on_epoch(i, history)`` runs after each epoch (a logging point);
    ``progress(done, total)``, if given, is called from the compiled epoch about 40 times.
    ``devices`` (N, or the devices) or ``mesh`` train data-parallel (`circle_jax.distributed`);
    the returned params and state are then on this process's first device.
    """
    trainer = Trainer(model, config, placement=DataParallel.of(devices, mesh), **overrides)
    trainer.progress = progress
    cfg = trainer.config
    x_tr, y_tr, val = prepare_data(trainer, x, y)
    if state is None:
        state, frozen = trainer.init(params)
    else:
        _, frozen = trainer.init(params)
    state, frozen = trainer.placed((state, frozen))
    hist = History()
    t0 = time.perf_counter()
    trainer._compiled_epoch(*trainer.epoch_arguments(state, frozen, x_tr, y_tr),
                            shuffled=cfg.shuffle)
    hist.compile_ms = (time.perf_counter() - t0) * 1000
    for epoch in range(cfg.epochs):
        t = time.perf_counter()
        state, m = trainer.run_epoch(state, frozen, x_tr, y_tr, epoch)
        record_epoch(trainer, hist, epoch, state, frozen, m, t, int(y_tr.shape[0]), val)
        if on_epoch is not None:
            on_epoch(epoch, hist)
    state, frozen = local((state, frozen))
    return FitResult(trainer.merge(state, frozen), state, hist, trainer)


def prepare_data(trainer: Trainer, x: Any, y: Any) -> tuple[tuple, jax.Array, tuple]:
    """(train inputs, train targets, (validation inputs, validation targets)) on device."""
    cfg = trainer.config
    xs, ys = _as_inputs(trainer.model, x), jnp.asarray(y, trainer.loss_dtype)
    if any(a.shape[0] != ys.shape[0] for a in xs):
        raise DataError(f"inputs have {[a.shape[0] for a in xs]} samples, targets have "
                        f"{ys.shape[0]}")
    sparse = loss_name(cfg.loss) == "sparse_categorical_crossentropy"
    check_training_data(xs, np.asarray(y), trainer.model.outputs[0].shape[-1] if sparse else None)
    x_tr, y_tr, x_val, y_val = split_validation(xs, ys, cfg.validation_split)
    if y_tr.shape[0] < cfg.batch_size and cfg.drop_remainder:
        raise DataError(f"{y_tr.shape[0]} training samples are fewer than one batch of "
                        f"{cfg.batch_size}")
    return x_tr, y_tr, (x_val, y_val)


def record_epoch(trainer: Trainer, hist: History, epoch: int, state: TrainState, frozen: dict,
                 m: StepMetrics, started: float, n_train: int, val: tuple) -> None:
    """Append an epoch's results to ``hist`` (the logging point: one host sync), validate,
    and raise ``TrainingError`` on divergence."""
    cfg = trainer.config
    loss = float(jnp.mean(m.loss))
    steps, skipped = int(m.loss.shape[0]), int(jnp.sum(m.skipped))
    ms = (time.perf_counter() - started) * 1000 / max(steps, 1)
    # Without loss scaling a non-finite loss (or weights: a last step's update) is
    # divergence; with it, only when every step of the epoch was skipped.
    unscaled = isinstance(state.loss_scale, NoLossScale)
    if not np.isfinite(loss) and (unscaled or skipped == steps):
        raise TrainingError(f"epoch {epoch + 1}: the loss is {loss} (not finite); lower "
                            "the learning rate or check the data")
    if unscaled and not bool(all_finite(state.params)):
        raise TrainingError(f"epoch {epoch + 1}: the weights are no longer finite (loss "
                            f"{loss:.4g}); lower the learning rate or check the data")
    hist.loss.append(loss)
    seen = n_train if not cfg.drop_remainder else steps * cfg.batch_size
    hist.accuracy.append(float(jnp.sum(m.correct)) / max(seen, 1))
    hist.skipped.append(skipped)
    hist.loss_scale.append(float(state.loss_scale.loss_scale))
    hist.ms_per_step.append(ms)
    hist.steps.append(steps)
    x_val, y_val = val
    if y_val.shape[0]:
        vl, va = trainer.evaluate({**state.params, **frozen}, x_val, y_val)
        if not np.isfinite(vl):
            raise TrainingError(f"epoch {epoch + 1}: the validation loss is {vl} (not finite); "
                                "check the validation data and the learning rate")
        hist.val_loss.append(vl)
        hist.val_accuracy.append(va)
