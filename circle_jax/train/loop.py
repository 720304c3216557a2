"""``fit``: the one training loop. Epochs (whole, or in compiled chunks of steps), the
logging point after each, callbacks, and resumption at any step; checkpointing
(`circle_jax.checkpoints.fit_checkpointed`) is this loop with a callback."""

from __future__ import annotations

import contextlib
import inspect
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import numpy as np

from ..distributed import DataParallel, local
from ..errors import ConfigError, DataError, LossScaleWarning, TrainingError
from ..model import Model
from ..optim import NoLossScale
from ..passes import check_lora_options
from ..passes.fake_quant import quantized_activations
from .config import TrainConfig, asks_none, check_integer, check_overrides
from .data import split_validation
from .diagnose import first_non_finite
from .dispatch import dispatches_async
from .memory import host_memory_kept
from .state import History, StepMetrics, TrainState
from .summary import host_rows
from .trainer import Trainer


@dataclass
class FitResult:
    """What ``fit`` returns: trained params (model dtypes), the final state and history."""

    params: dict[str, jax.Array]
    state: TrainState
    history: History
    trainer: Trainer

    @property
    def model(self) -> Model:
        """The model trained: ``fit``'s, personalized when ``new_head`` / ``lora`` were
        given (export the trained params with ``result.model.export(result.params)``)."""
        return self.trainer.model


class Callback(Protocol):
    """What ``fit`` calls, on the host, at its logging points. ``epoch`` counts from 0 and
    from ``initial_epoch`` (the absolute epoch, as checkpoints number them)."""

    def on_chunk_end(self, epoch: int, state: TrainState, frozen: dict) -> None:
        """After each compiled chunk of steps, when the epoch runs in chunks (``every_steps``,
        or the rest of a resumed epoch)."""

    def on_epoch_end(self, epoch: int, history: History, state: TrainState,
                     frozen: dict) -> None:
        """After each epoch, its results recorded in ``history``."""


def fit(
    model: Model,
    x: Any,
    y: Any,
    config: TrainConfig | None = None,
    *,
    trainer: Trainer | None = None,
    params: Mapping[str, Any] | None = None,
    state: TrainState | None = None,
    initial_epoch: int = 0,
    initial_step: int = 0,
    every_steps: int | None = None,
    callbacks: Sequence[Callback] = (),
    on_epoch: Callable[[int, History], None] | None = None,
    on_start: Callable[[History], None] | None = None,
    overlap_epochs: bool = True,
    progress: Callable[[Any, Any], None] | None = None,
    devices: int | Sequence[jax.Device] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    new_head: int | None = None,
    lora: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: str | Sequence[str] = "all",
    **overrides: Any,
) -> FitResult:
    """Train ``model`` on (x, y): epochs of compiled scans, onert's conventions by default.

    ``new_head`` / ``lora`` (with ``lora_alpha``, ``lora_targets``) train
    ``model.personalize(...)`` instead, seeded by the config's ``seed``, as ``circle-jax
    train --new_head K --lora R --seed S`` does; ``FitResult.model`` is that model.
    ``lora_alpha`` / ``lora_targets`` without ``lora`` are refused (`check_lora_options`).

    ``x`` is an array or a sequence of arrays (one per model input) with samples on axis 0.
    The configuration is ``config`` with ``overrides`` (TrainConfig fields), resolved once
    against the model's circle+ values; or pass a ``trainer`` to reuse its compiled step
    (then only ``epochs`` may be overridden: how many epochs this call trains).
    ``devices`` (N, or the devices) or ``mesh`` train data-parallel
    (`circle_jax.distributed`); the returned params and state are then on this process's
    first device.

    Training starts from ``state`` (default: fresh, from ``params`` or the model's) at epoch
    ``initial_epoch`` (it numbers the shuffling order and callbacks), of which
    ``initial_step`` steps are already done. ``every_steps`` runs each epoch as compiled
    chunks of that many steps, calling ``Callback.on_chunk_end`` after each; no per-step
    Python either way. A whole epoch is one compiled call that also validates and
    summarizes it; after each epoch (the logging point: one read of that summary) the
    history is recorded (per-epoch loss = mean of the batches' pre-update losses, accuracy,
    validation loss and accuracy over all validation samples, skipped steps, loss scale,
    ms/step), then the callbacks and ``on_epoch(i, history)`` (``i`` from 0 in this call)
    run. With ``on_epoch`` alone (no callbacks, ``progress`` or ``every_steps``) and
    asynchronous dispatch (JAX's default; not after `inline_cpu_dispatch`), epochs run in
    calls of about `QUEUED_CALL_SECONDS` (at most `QUEUED_MAX_EPOCHS` epochs), each queued
    before the previous one's logging points, so the device trains while ``on_epoch`` runs
    and ``on_epoch(i, ...)`` comes up to about that long after epoch i ended: the results
    of fused epochs (``overlap_epochs=False``: one epoch a call, each ``on_epoch`` before
    the next epoch starts).
    ``on_start(history)`` is called once, when the epochs are compiled and before the
    first runs (``history.prepare_ms`` and ``compile_ms`` set). ``progress(done, total)``
    is called from the compiled epoch about 40 times (a host callback: such a trace is not
    kept by a ``Trainer.program_cache``).
    When nothing needs the host between epochs (no callbacks, ``on_epoch``, ``progress`` or
    ``every_steps``), they run fused: one compiled program for all of them (up to float32
    rounding the same results, see `Trainer.run_epoch`), called for the first epoch, then
    for as many epochs as take about `FUSED_CALL_SECONDS` a call (at most
    `FUSED_MAX_EPOCHS`), so that an interrupt (Ctrl-C, a notebook's stop) ends ``fit``
    within about that time; ``ms_per_step`` is each call's average.
    Whole epochs, fused, queued or one a call, run one compiled program whatever ``epochs``
    is: a ``fit`` that passes the same ``trainer`` again, on data of the same shapes,
    compiles nothing.
    """
    started = time.perf_counter()
    check_lora_options(lora, lora_alpha, lora_targets)
    check_overrides(overrides, _FIT_KEYWORDS)
    epochs = overrides.get("epochs")
    if new_head is not None or lora is not None:
        if trainer is not None:
            raise ConfigError("new_head and lora personalize the model a trainer is built "
                              "for: give them without a trainer, or to the trainer's model")
        seed = overrides.get("seed", config.seed if config is not None else 0)
        model = model.personalize(new_head=new_head, seed=seed, lora=lora,
                                  lora_alpha=lora_alpha, lora_targets=lora_targets)
    if trainer is None:
        trainer = Trainer(model, config, placement=DataParallel.of(devices, mesh), **overrides)
    elif config is not None or set(overrides) - {"epochs"} or devices or mesh is not None:
        raise ValueError("give either a trainer or a config (and overrides, devices, mesh), "
                         "not both")
    check_trains(trainer)
    check_integer("every_steps", every_steps, 1)
    check_integer("initial_epoch", initial_epoch, 0)
    check_integer("initial_step", initial_step, 0)
    trainer.progress = progress
    cfg = trainer.config
    check_integer("TrainConfig.epochs", epochs, 0)  # as TrainConfig checks it
    epochs = cfg.epochs if epochs is None else epochs
    # freed host memory kept for the next compiled call while training, as the command
    # line keeps it for good (see memory); the process-wide setting is undone on leaving
    with host_memory_kept() if trainer.platform == "cpu" else contextlib.nullcontext():
        x_tr, y_tr, val = prepare_data(trainer, x, y)
        hist = History()
        n_train = int(y_tr.shape[0])
        steps = steps_per_epoch(cfg, n_train)
        if initial_step >= max(steps, 1):
            raise ValueError(f"initial_step {initial_step} is not inside an epoch of {steps} "
                             "steps; expected 0 to steps - 1")
        if state is None:
            check_updates(cfg, epochs * steps - initial_step, steps)
        # Whole epochs (not in chunks, at least one full batch) run as `Trainer.epochs_runner`;
        # when nothing needs the host between epochs, fused: several a call (`_whole_epochs`).
        whole = every_steps is None and n_train >= cfg.batch_size
        # whole epochs from the first step that nothing but on_epoch needs between them
        unobserved = whole and not callbacks and progress is None and not initial_step
        fused = unobserved and epochs > 1 and on_epoch is None
        # with on_epoch alone and calls that return before their programs run, epochs are
        # queued ahead of their logging points (`_queued_epochs`)
        queued = (overlap_epochs and unobserved and on_epoch is not None
                  and dispatches_async(trainer.platform))
        # the most epochs a call runs; the program holds `FUSED_MAX_EPOCHS` whatever this
        # call asks, so that a trainer's calls of any length share it
        per_call = (min(epochs, FUSED_MAX_EPOCHS) if fused else
                    QUEUED_MAX_EPOCHS if queued and epochs > 1 else 1)
        if whole and state is None:  # a kept program loads while the fresh state is made
            trainer.prefetch_epochs(params, x_tr, y_tr, FUSED_MAX_EPOCHS, val)
        fresh, frozen = trainer.init(params)
        state, frozen = trainer.placed((fresh if state is None else state, frozen))
        t0 = time.perf_counter()
        if whole:  # compiled here, looked up once
            run = trainer.epochs_runner(state, frozen, x_tr, y_tr, FUSED_MAX_EPOCHS, val)
        else:
            trainer.compile_epoch(state, frozen, x_tr, y_tr, every_steps, val)
        hist.compile_ms = (time.perf_counter() - t0) * 1000
        hist.prepare_ms = (time.perf_counter() - started) * 1000
        if on_start is not None:
            on_start(hist)
        if fused:
            state = _whole_epochs(trainer, run, hist, state, y_tr, initial_epoch, epochs,
                                  per_call)
            warn_if_stuck(trainer, hist, state, frozen, x_tr, y_tr)
        elif queued and epochs:
            state = _queued_epochs(trainer, run, hist, state, frozen, x_tr, y_tr,
                                   initial_epoch, epochs, per_call, on_epoch)
        for i in range(0 if fused or queued else epochs):
            epoch = initial_epoch + i
            if whole and not (i == 0 and initial_step):
                state = _whole_epochs(trainer, run, hist, state, y_tr, epoch, 1)
            else:
                t = time.perf_counter()

                def chunk_done(s: TrainState, e: int = epoch) -> None:
                    for cb in callbacks:
                        cb.on_chunk_end(e, s, frozen)

                state, m = trainer.run_epoch(state, frozen, x_tr, y_tr, epoch,
                                             every_steps=every_steps,
                                             skip_steps=initial_step if i == 0 else 0,
                                             after_chunk=chunk_done)
                record_epoch(trainer, hist, i, state, frozen, m, t, n_train, val)
            warn_if_stuck(trainer, hist, state, frozen, x_tr, y_tr)
            if callbacks:  # they read the params by name
                state = trainer.unpacked(state)
            for cb in callbacks:
                cb.on_epoch_end(epoch, hist, state, frozen)
            if on_epoch is not None:
                on_epoch(i, hist)
    state, frozen = local((trainer.unpacked(state), frozen))
    return FitResult(trainer.merge(state, frozen), state, hist, trainer)


#: ``fit``'s own keywords (besides model, x, y and the TrainConfig overrides)
_FIT_KEYWORDS = tuple(inspect.signature(fit).parameters)[3:-1]


def check_trains(trainer: Trainer) -> None:
    """ConfigError (one line) when the run would train no param unasked: a fully quantized
    model loaded to run its integer kernels (the line names ``qat=True`` and
    ``dequantize=True``), a model without trainable weights (`Model.param_roles` says why
    each is frozen), or a ``trainable``
    spec that selects none of them (last operators without weights, names of frozen
    params). Asking for none (``"none"``, 0: onert_train's ``--num_of_trainable_ops 0``,
    the loss of the model as it is) is no mistake and runs."""
    model, spec = trainer.model, trainer.config.trainable
    if trainer.trainable or asks_none(spec):
        return
    if not model.trainable_params and model.simulated is None \
            and quantized_activations(model.ir):
        raise ConfigError("the model is fully quantized (integer activations and weights): "
                          "it has no float weights to train; load it with qat=True to train "
                          "it by quantization-aware training (export writes the integer "
                          "model), or dequantize=True to train its float model")
    if not model.trainable_params:
        raise ConfigError(f"the model has no trainable weights ({len(model.params)} params, "
                          "none trainable; Model.param_roles says why): nothing would train; "
                          "expected a model with weights")
    raise ConfigError(f"trainable={spec!r} selects none of the model's "
                      f"{len(model.trainable_params)} trainable weights: nothing would train; "
                      "expected 'all', N >= 1 last operators with weights, or param names")


def check_updates(cfg: TrainConfig, run_steps: int, epoch_steps: int) -> None:
    """TrainingError (one line) when a run of ``run_steps`` steps from a fresh state would
    update no weight: streamed accumulation (``accumulate=k``, "stream") updates on every
    k-th step, counted across epoch boundaries, so k above the run's steps never updates.
    (A run of 0 epochs trains nothing by request and is not refused.)"""
    k = cfg.accumulate
    if cfg.accumulate_mode == "stream" and k > 1 and 0 < run_steps < k:
        raise TrainingError(f"accumulate={k} updates the weights every {k} steps, but the run "
                            f"has {run_steps} ({epoch_steps} an epoch): no weight would change;"
                            f" expected accumulate <= {run_steps}, more epochs or smaller "
                            "batches")


def steps_per_epoch(cfg: TrainConfig, n: int) -> int:
    """The steps of an epoch of ``n`` samples: full batches, and the partial one kept."""
    return n // cfg.batch_size + (not cfg.drop_remainder and n % cfg.batch_size > 0)


#: about how long one call of fused epochs runs (`fit`): how long an interrupt waits
FUSED_CALL_SECONDS = 0.5
#: the most epochs one call of fused epochs runs: the rows of the summaries of `fit`'s one
#: epochs program, which every call on the same trainer and data shapes runs (fused, queued
#: or one epoch a call; a row costs a few bytes)
FUSED_MAX_EPOCHS = 1024
#: about how long one call of queued epochs runs (`fit` with ``on_epoch``): how late
#: ``on_epoch`` may run after its epoch
QUEUED_CALL_SECONDS = 0.05
#: the most epochs one call of queued epochs runs
QUEUED_MAX_EPOCHS = 64


def _whole_epochs(trainer: Trainer, run: Callable, hist: History, state: TrainState,
                  y: jax.Array, first_epoch: int, count: int, per_call: int = 1
                  ) -> TrainState:
    """``count`` whole epochs by ``run`` (a `Trainer.epochs_runner` of ``per_call``
    epochs at most: validation included, one transfer a call): the first alone, then as
    many a call as took about `FUSED_CALL_SECONDS` at the last call's pace. Each epoch is
    appended to ``hist`` as `record_epoch` does; the final state (`Trainer.packed`)."""
    cfg, n = trainer.config, int(y.shape[0])
    steps = steps_per_epoch(cfg, n)
    unscaled = isinstance(state.loss_scale, NoLossScale)
    done, size = 0, 1
    while done < count:
        t = time.perf_counter()
        state, summaries = run(state, first_epoch + done, size)
        seconds = time.perf_counter() - t
        for row in summaries:
            _record_row(cfg, hist, unscaled, row, steps, seconds * 1000 / (size * steps), n)
        done += size
        size = min(count - done, per_call,
                   max(1, int(size * FUSED_CALL_SECONDS / max(seconds, 1e-6))))
    return state


def _queued_epochs(trainer: Trainer, run: Callable, hist: History, state: TrainState,
                   frozen: dict, x: tuple, y: jax.Array, first_epoch: int, count: int,
                   per_call: int, on_epoch: Callable[[int, History], None]) -> TrainState:
    """``count`` whole epochs by ``run`` (a `Trainer.epochs_runner` of ``per_call`` epochs
    at most), each call queued before the previous one's summaries are read: while the
    device trains the next call the host records the epochs of the last one, as
    `_whole_epochs` does, calling ``on_epoch(i, hist)`` after each. The first two calls
    train one epoch each, later ones as many as took about `QUEUED_CALL_SECONDS` at the
    last call's pace, so ``on_epoch`` runs about that long after its epoch at most. The
    results of fused epochs; an epoch's ms/step is its call's share of the time between
    two reads. Should ``on_epoch`` raise, the queued call's epochs are dropped. The final
    state (`Trainer.packed`)."""
    cfg, n = trainer.config, int(y.shape[0])
    steps = steps_per_epoch(cfg, n)
    unscaled = isinstance(state.loss_scale, NoLossScale)
    t, pace = time.perf_counter(), None  # pace: seconds an epoch, from the last read
    state, summaries = run(state, first_epoch, 1, read=False)
    size, sent, i = 1, 1, 0  # epochs in the call in flight, epochs sent, epochs recorded
    while i < count:
        done, read, n_read = state, summaries, size
        if sent < count:
            size = 1 if pace is None else max(1, int(QUEUED_CALL_SECONDS / pace))
            size = min(count - sent, per_call, size)
            state, summaries = run(state, first_epoch + sent, size, read=False)
            sent += size
        rows = host_rows(read, n_read)
        now = time.perf_counter()
        pace, t = (now - t) / n_read, now
        for row in rows:
            _record_row(cfg, hist, unscaled, row, steps, pace * 1000 / steps, n)
            warn_if_stuck(trainer, hist, done, frozen, x, y)
            on_epoch(i, hist)
            i += 1
    return state


def warn_if_stuck(trainer: Trainer, hist: History, state: TrainState, frozen: dict,
                  x: tuple, y: jax.Array) -> None:
    """At a logging point, once per run: when the last epoch skipped steps and the loss
    scale can no longer back off (a dynamic scale at its floor, or a fixed one), find the
    first non-finite tensor of the step (`first_non_finite`, host-side), record it in
    ``hist.overflow`` and warn it (`LossScaleWarning`)."""
    if hist.overflow is not None or not hist.skipped or not hist.skipped[-1] or \
            bool(state.loss_scale.can_back_off()):
        return
    found = first_non_finite(trainer, trainer.unpacked(state).params, frozen, x, y,
                             hist.loss_scale[-1])
    epoch = len(hist.loss)
    hist.overflow = (f"epoch {epoch}: {hist.skipped[-1]} of {hist.steps[-1]} steps skipped "
                     f"with the loss scale at its floor ({hist.loss_scale[-1]:g}): "
                     + (str(found) if found is not None else
                        "no non-finite value found when re-running the first batches"))
    warnings.warn(hist.overflow, LossScaleWarning, stacklevel=3)


def prepare_data(trainer: Trainer, x: Any, y: Any) -> tuple[tuple, jax.Array, tuple]:
    """(train inputs, train targets, (validation inputs, validation targets)) on device.
    Samples given as device arrays (``jax.Array``: immutable), the same objects as the last
    call's on this trainer, are checked, split and placed once: the last call's result."""
    given = (*(x if isinstance(x, (list, tuple)) else (x,)), y)
    device = all(isinstance(a, jax.Array) for a in given)
    kept = trainer.prepared_data
    if device and kept is not None and len(kept[0]) == len(given) \
            and all(a is b for a, b in zip(kept[0], given)):
        return kept[1]
    prepared = _prepared_data(trainer, x, y)
    if device:
        trainer.prepared_data = (given, prepared)
    return prepared


def _prepared_data(trainer: Trainer, x: Any, y: Any) -> tuple[tuple, jax.Array, tuple]:
    cfg = trainer.config
    xs, ys = trainer.checked_samples(x, y)
    # split on the host, then one transfer for all four
    x_tr, y_tr, x_val, y_val = jax.device_put(split_validation(xs, ys, cfg.validation_split))
    if y_tr.shape[0] < cfg.batch_size and cfg.drop_remainder:
        raise DataError(f"{y_tr.shape[0]} training samples are fewer than one batch of "
                        f"{cfg.batch_size}")
    return x_tr, y_tr, (x_val, y_val)


def record_epoch(trainer: Trainer, hist: History, epoch: int, state: TrainState, frozen: dict,
                 m: StepMetrics, started: float, n_train: int, val: tuple) -> None:
    """Append an epoch's results to ``hist`` (the logging point: one host sync), validate,
    and raise ``TrainingError`` on divergence."""
    steps = int(m.loss.shape[0])
    summary = trainer.summarize_epoch(m, state)
    ms = (time.perf_counter() - started) * 1000 / max(steps, 1)
    _record(trainer.config, hist, epoch, isinstance(state.loss_scale, NoLossScale), summary,
            steps, ms, n_train)
    x_val, y_val = val
    if y_val.shape[0]:
        _record_validation(hist, epoch,
                           *trainer.score(trainer.masters(state, frozen), x_val, y_val))


def _record(cfg: TrainConfig, hist: History, epoch: int, unscaled: bool, summary: tuple,
            steps: int, ms: float, n_train: int) -> None:
    """Append one epoch's `Trainer.summarize_epoch` values; raise ``TrainingError`` on
    divergence: without loss scaling a non-finite loss or weights (a last step's update),
    with it only when every step of the epoch was skipped."""
    loss, skipped, correct, finite, scale = summary
    if not np.isfinite(loss) and (unscaled or skipped == steps):
        raise TrainingError(f"epoch {epoch + 1}: the loss is {loss} (not finite); lower "
                            "the learning rate or check the data")
    if unscaled and not finite:
        raise TrainingError(f"epoch {epoch + 1}: the weights are no longer finite (loss "
                            f"{loss:.4g}); lower the learning rate or check the data")
    hist.loss.append(loss)
    seen = n_train if not cfg.drop_remainder else steps * cfg.batch_size
    hist.accuracy.append(correct / max(seen, 1))
    hist.skipped.append(skipped)
    hist.loss_scale.append(scale)
    hist.ms_per_step.append(ms)
    hist.steps.append(steps)


def _record_row(cfg: TrainConfig, hist: History, unscaled: bool, row: tuple, steps: int,
                ms: float, n_train: int) -> None:
    """Append the next epoch's `host_rows` row: its summary and any validation."""
    summary, validation = row
    _record(cfg, hist, len(hist.loss), unscaled, summary, steps, ms, n_train)
    if validation is not None:
        _record_validation(hist, len(hist.val_loss), *validation)


def _record_validation(hist: History, epoch: int, loss: float, accuracy: float) -> None:
    if not np.isfinite(loss):
        raise TrainingError(f"epoch {epoch + 1}: the validation loss is {loss} (not finite); "
                            "check the validation data and the learning rate")
    hist.val_loss.append(loss)
    hist.val_accuracy.append(accuracy)
