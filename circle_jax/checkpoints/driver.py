"""Training with checkpoints: resume, save every N epochs, stop and continue bit-identically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..distributed import DataParallel, is_main_process, local
from ..errors import DataError
from ..formats.atomic import PathLike
from ..model import Model
from ..train import (
    FitResult,
    History,
    StepMetrics,
    TrainConfig,
    Trainer,
    TrainState,
    _batched,
    prepare_data,
    record_epoch,
)
from ._common import Source, _stream_k
from .state import Order, _restore, make_checkpoint, read_checkpoint, save_checkpoint


def fit_checkpointed(
    model: Model,
    x: Any,
    y: Any,
    config: TrainConfig | None = None,
    *,
    resume: Source | None = None,
    save: PathLike | None = None,
    every_steps: int | None = None,
    order: Order = "ascending",
    params: Mapping[str, Any] | None = None,
    trainer: Trainer | None = None,
    epochs: int | None = None,
    protect: PathLike | Iterable[PathLike] | None = None,
    on_epoch: Callable[[int, History], None] | None = None,
    devices: int | Sequence[jax.Device] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    **overrides: Any,
) -> FitResult:
    """``train.fit`` with onert checkpoints: resume from ``resume``, write ``save`` as it goes.

    ``save`` is rewritten atomically, entries in ``order`` (see :func:`save_checkpoint`), after
    every epoch, or after every ``every_steps`` steps when given: the epoch's scan then runs
    as compiled chunks of that many steps (no per-step Python). ``resume`` is read as
    :func:`read_checkpoint` says (weights, Adam m/v, update count). A resumed run trains
    ``epochs`` (default: the config's) more epochs, the first from the checkpoint's step when
    it was written inside an epoch (its update count goes past ``cur_epoch`` epochs); with
    shuffling, epoch numbering continues from the checkpoint's ``cur_epoch`` so the data
    order matches an uninterrupted run. Pass a ``trainer`` (instead of ``config`` and
    overrides) to reuse its compiled step across calls. Returns what ``fit`` returns.
    """
    if trainer is None:
        if epochs is not None:
            overrides["epochs"] = epochs
        trainer = Trainer(model, config, placement=DataParallel.of(devices, mesh),
                          **overrides)
    elif config is not None or overrides or devices is not None or mesh is not None:
        raise ValueError("give either a trainer or a config (and overrides, devices, mesh), "
                         "not both")
    cfg = trainer.config
    n_epochs = cfg.epochs if epochs is None else epochs
    if every_steps is not None and every_steps < 1:
        raise ValueError(f"every_steps must be >= 1, got {every_steps}")
    x_tr, y_tr, val = prepare_data(trainer, x, y)
    params = model.params if params is None else params
    b = cfg.batch_size
    n_train = int(y_tr.shape[0])
    steps = n_train // b
    start = skip = 0
    if resume is not None:
        ckpt, found = read_checkpoint(resume, model, params)
        state, frozen = _restore(ckpt, found, model, trainer, params)
        # written inside an epoch (or at its last chunk): the updates go past cur_epoch epochs
        into = ckpt.step * _stream_k(trainer) - ckpt.epoch * steps
        done, skip = divmod(into, steps) if 0 < into < 2 * steps else (0, 0)
        start = ckpt.epoch + done
    else:
        state, frozen = trainer.init(params)
    chunk = min(every_steps or steps, steps)
    if save is not None:  # fail before training, not after
        make_checkpoint(model, trainer, state, frozen, order=order)
        k = _stream_k(trainer)
        if chunk % k or (steps % chunk) % k:
            raise ValueError(f"checkpoints every {chunk} steps would cut accumulation cycles "
                             f"of {k} micro-batches; use a multiple of {k}")
    hist = History()
    t0 = time.perf_counter()
    state, frozen = trainer.placed((state, frozen))
    if chunk:
        xb, yb = trainer.placed(_batched(x_tr, y_tr, b, chunk), batch_axis=1)
        trainer._compiled_epoch(state, frozen, xb, yb)
    hist.compile_ms = (time.perf_counter() - t0) * 1000

    def checkpoint(s: TrainState, epochs_done: int) -> None:
        if save is not None and is_main_process():
            save_checkpoint(save, model, trainer, local(s), local(frozen), epoch=epochs_done,
                            order=order, protect=protect)

    for epoch in range(n_epochs):
        t = time.perf_counter()
        first = skip if epoch == 0 else 0
        if every_steps is None and not first:
            state, m = trainer.run_epoch(state, frozen, x_tr, y_tr, start + epoch)
        else:
            state, m = _chunked_epoch(trainer, state, frozen, x_tr, y_tr, start + epoch,
                                      every_steps or steps,
                                      lambda s, e=start + epoch: checkpoint(s, e), first)
        record_epoch(trainer, hist, epoch, state, frozen, m, t, n_train, val)
        checkpoint(state, start + epoch + 1)
        if on_epoch is not None:
            on_epoch(epoch, hist)
    state, frozen = local((state, frozen))
    return FitResult(trainer.merge(state, frozen), state, hist, trainer)


def _chunked_epoch(trainer: Trainer, state: TrainState, frozen: dict, x: tuple, y: jax.Array,
                   epoch: int, every: int, after_chunk: Callable[[TrainState], None],
                   skip: int = 0) -> tuple[TrainState, StepMetrics]:
    """``Trainer.run_epoch`` as compiled scans of ``every`` steps, calling back after each;
    the first ``skip`` steps (done before a mid-epoch checkpoint) are left out."""
    cfg = trainer.config
    n, b = y.shape[0], cfg.batch_size
    if cfg.shuffle:
        perm = jax.random.permutation(jax.random.fold_in(jax.random.key(cfg.seed), epoch), n)
        x, y = tuple(a[perm] for a in x), y[perm]
    steps = n // b
    if steps == 0 and cfg.drop_remainder:
        raise DataError(f"{n} training samples are fewer than one batch of {b}")
    xs, ys = _batched(x, y, b, steps)
    parts = []
    for i in range(skip, steps, every):
        part = (state, frozen, *trainer.placed((tuple(a[i:i + every] for a in xs),
                                                ys[i:i + every]), batch_axis=1))
        state, m = trainer._compiled_epoch(*part)(*part)
        parts.append(m)
        after_chunk(state)
    if not cfg.drop_remainder and n % b:
        tail = trainer.placed((tuple(a[steps * b:] for a in x), y[steps * b:]))
        state, m = trainer._step(state, frozen, tail)
        parts.append(jax.tree.map(lambda a: a[None], m))
    metrics = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
    return state, metrics
