"""Training with checkpoints: resume, save every N epochs, stop and continue bit-identically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from ..distributed import DataParallel, is_main_process, local
from ..formats.atomic import PathLike, check_writable
from ..model import Model
from ..train import FitResult, History, TrainConfig, Trainer, TrainState, fit
from ._common import Source, _stream_k
from .state import (
    Order,
    _restore,
    make_checkpoint,
    read_checkpoint,
    resolved_order,
    save_checkpoint,
)


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
    on_start: Callable[[History], None] | None = None,
    devices: int | Sequence[jax.Device] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    **overrides: Any,
) -> FitResult:
    """``train.fit`` with onert checkpoints: resume from ``resume``, write ``save`` as it goes.

    ``save`` is rewritten atomically, entries in ``order`` (see :func:`save_checkpoint`), after
    every epoch, or after every ``every_steps`` steps when given (``fit``'s compiled chunks,
    no per-step Python). ``resume`` is read as :func:`read_checkpoint` says (weights, Adam
    m/v, update count). A resumed run trains ``epochs`` (default: the config's) more
    epochs, the first from the checkpoint's step when it was written inside an epoch (its
    update count goes past ``cur_epoch`` epochs); epoch numbering continues from the
    checkpoint's ``cur_epoch``, so a shuffled data order matches an uninterrupted run.
    Pass a ``trainer`` (instead of ``config`` and overrides) to reuse its compiled step
    across calls. Returns what ``fit`` returns.
    """
    if trainer is None:
        if epochs is not None:
            overrides["epochs"] = epochs
        trainer = Trainer(model, config, placement=DataParallel.of(devices, mesh),
                          **overrides)
    elif config is not None or overrides or devices is not None or mesh is not None:
        raise ValueError("give either a trainer or a config (and overrides, devices, mesh), "
                         "not both")
    if every_steps is not None and every_steps < 1:
        raise ValueError(f"every_steps must be >= 1, got {every_steps}")
    cfg = trainer.config
    params = model.params if params is None else params
    n = len(y)
    steps = (n - int(n * cfg.validation_split)) // cfg.batch_size
    state, epoch, step = None, 0, 0
    if resume is not None:
        ckpt, found = read_checkpoint(resume, model, params)
        state, frozen = _restore(ckpt, found, model, trainer, params, resume)
        params = trainer.merge(state, frozen)
        # written inside an epoch (or at its last chunk): the updates go past cur_epoch epochs
        into = ckpt.step * _stream_k(trainer) - ckpt.epoch * steps
        done, step = divmod(into, steps) if steps and 0 < into < 2 * steps else (0, 0)
        epoch = ckpt.epoch + done
    callbacks = []
    if save is not None:  # fail before training, not after
        check_writable(save)
        # resolved once ("onert"/"auto" ask the onert wheel about the model's bytes)
        order = resolved_order(model, order)
        check_state, check_frozen = (state, frozen) if state is not None else \
            trainer.init(params)
        make_checkpoint(model, trainer, check_state, check_frozen, order=order)
        k, chunk = _stream_k(trainer), min(every_steps or steps, steps)
        if chunk and (chunk % k or (steps % chunk) % k):
            raise ValueError(f"checkpoints every {chunk} steps would cut accumulation cycles "
                             f"of {k} micro-batches; use a multiple of {k}")
        callbacks.append(_Checkpointer(save, model, trainer, order, protect))
    return fit(model, x, y, trainer=trainer, params=params, state=state, initial_epoch=epoch,
               initial_step=step, every_steps=every_steps, callbacks=callbacks,
               on_epoch=on_epoch, on_start=on_start,
               **({} if epochs is None else {"epochs": epochs}))


class _Checkpointer:
    """Writes the checkpoint after every chunk (``cur_epoch``: the epochs completed) and
    every epoch; process 0 alone writes."""

    def __init__(self, path: PathLike, model: Model, trainer: Trainer, order: Order,
                 protect: PathLike | Iterable[PathLike] | None) -> None:
        self.path, self.model, self.trainer = path, model, trainer
        self.order, self.protect = order, protect

    def _save(self, state: TrainState, frozen: dict, epochs_done: int) -> None:
        if is_main_process():
            save_checkpoint(self.path, self.model, self.trainer, local(state), local(frozen),
                            epoch=epochs_done, order=self.order, protect=self.protect)

    def on_chunk_end(self, epoch: int, state: TrainState, frozen: dict) -> None:
        self._save(state, frozen, epoch)

    def on_epoch_end(self, epoch: int, history: History, state: TrainState,
                     frozen: dict) -> None:
        self._save(state, frozen, epoch + 1)
