"""Train a .circle/.tflite file with onert's train backend, the way ``onert_train`` does.

``onert_fit`` is the peer the agreement tests and the benchmark compare circle-jax with. It
drives the pybind session of the ``onert`` wheel directly (``nnfw_session(path, "train")``,
``train_set_traininfo``, ``train_prepare``, ``train_set_input``/``_expected``/``_output``,
``train``, ``train_get_loss``) and follows onert_train's conventions:

- batches are taken in order, no shuffling; a trailing partial batch is dropped;
- the epoch loss is the mean over the epoch's steps of each step's loss, where a step's loss
  is what ``train_get_loss`` returns after ``train(update_weights=True)``. That is the loss
  of the forward pass that computed the gradients, i.e. the batch's PRE-update loss:
  ``train(True)`` on a batch reports exactly the same float as ``train(False)`` on the same
  batch in a fresh session (checked by ``tests/oracle/test_onert_agreement.py``).

Codes are onert_train's: loss 1 = mean squared error, 2 = categorical crossentropy;
reduction 1 = sum over batch size, 2 = sum; optimizer 1 = sgd, 2 = adam;
``trainable_ops`` -1 = all, 0 = none, N = the last N operators.

Two defects of the onert 0.1.0 binding are worked around here:

- ``train_set_input``/``train_set_expected``/``train_set_output`` keep the raw pointer of
  the numpy array they are given. Every array handed over is an exact-dtype, C-contiguous
  array held in a local variable until ``train`` has returned (a temporary made by the
  binding's own conversion would be freed at once, and the loss then silently reads 0).
- ``train_export_circle`` garbles paths longer than 15 bytes: the export runs in a temporary
  directory with a short relative file name.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from circle_jax.interop.onert_session import io_dtypes, open_session, train_batch

__all__ = ["OnertRun", "export_circle", "onert_fit", "open_session", "train_batch",
           "train_epoch"]

@dataclass
class OnertRun:
    """What ``onert_fit`` returns.

    Attributes:
      loss: per-epoch loss (mean of the epoch's per-step pre-update losses), as onert_train.
      step_loss: per-epoch lists of the per-step losses.
      step_ms: per-epoch mean wall time of ``session.train`` per step, in milliseconds.
      epoch_ms: per-epoch wall time of the whole step loop (batch copies, set input /
        expected / output, ``train``, ``train_get_loss``), in milliseconds.
      prepare_ms: time of ``train_prepare`` (onert's compilation).
      model: the trained model's bytes (``export=True`` only), as ``train_export_circle``
        writes them.
    """

    loss: list[float] = field(default_factory=list)
    step_loss: list[list[float]] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    epoch_ms: list[float] = field(default_factory=list)
    prepare_ms: float = 0.0
    model: bytes | None = None


def _as_list(x: Any) -> list[np.ndarray]:
    return [np.asarray(a) for a in x] if isinstance(x, (list, tuple)) else [np.asarray(x)]


def onert_fit(
    model_path: str | os.PathLike,
    x: Any,
    y: Any,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    loss: int = 2,
    reduction: int = 1,
    optimizer: int = 1,
    trainable_ops: int = -1,
    max_steps: int | None = None,
    export: bool = False,
) -> OnertRun:
    """Train with onert as onert_train does and return per-epoch (and per-step) losses.

    ``x`` is an array or a sequence of arrays (one per model input), samples on axis 0;
    ``y`` the expected outputs of output 0. ``max_steps`` cuts each epoch short (timing runs).
    """
    xs, ys = _as_list(x), _as_list(y)
    n = ys[0].shape[0]
    if any(a.shape[0] != n for a in xs):
        raise ValueError(f"inputs have {[a.shape[0] for a in xs]} samples, targets have {n}")
    steps = n // batch_size  # onert_train drops a trailing partial batch
    if steps == 0:
        raise ValueError(f"{n} samples are fewer than one batch of {batch_size}")
    if max_steps is not None:
        steps = min(steps, max_steps)
    t = time.perf_counter()
    session = open_session(model_path, batch_size=batch_size, learning_rate=learning_rate,
                           loss=loss, reduction=reduction, optimizer=optimizer,
                           trainable_ops=trainable_ops)
    run = OnertRun(prepare_ms=(time.perf_counter() - t) * 1000)
    in_dt, out_dt = io_dtypes(session)
    xs = [np.ascontiguousarray(a, dt) for a, dt in zip(xs, in_dt)]
    ys = [np.ascontiguousarray(a, dt) for a, dt in zip(ys, out_dt)]
    for _ in range(epochs):
        t = time.perf_counter()
        losses, times = train_epoch(session, xs, ys, batch_size, steps)
        run.epoch_ms.append((time.perf_counter() - t) * 1000)
        run.step_loss.append(losses)
        run.loss.append(float(np.mean(losses)))
        run.step_ms.append(float(np.mean(times)))
    if export:
        run.model = export_circle(session)
    return run


def train_epoch(session: Any, xs: list[np.ndarray], ys: list[np.ndarray], batch_size: int,
                steps: int) -> tuple[list[float], list[float]]:
    """One epoch of ``steps`` sequential batches on an open session (arrays already in the
    session's dtypes): each step's loss and ``train`` time (ms)."""
    losses, times = [], []
    for s in range(steps):
        lo, hi = s * batch_size, (s + 1) * batch_size
        bx = [np.ascontiguousarray(a[lo:hi]) for a in xs]
        by = [np.ascontiguousarray(a[lo:hi]) for a in ys]
        step_loss, ms = train_batch(session, bx, by)
        losses.append(step_loss)
        times.append(ms)
    return losses, times


def export_circle(session: Any) -> bytes:
    """The session's current model (trained weights) as .circle bytes.

    onert 0.1.0 garbles export paths over 15 bytes: write a short relative name from
    inside a temporary directory (this changes the working directory for a moment).
    """
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            session.train_export_circle("m.circle")
            with open("m.circle", "rb") as f:
                return f.read()
        finally:
            os.chdir(cwd)
