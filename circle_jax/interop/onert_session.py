"""Driving a training session of the onert wheel (its pybind API) the way onert_train does.

``open_session`` sets onert's TrainInfo from onert_train's numeric codes and prepares the
session; ``train_batch`` runs one step. One defect of the onert 0.1.0 binding shapes the
code: ``train_set_input`` / ``_expected`` / ``_output`` keep the raw pointer of the array
they are given, so every array handed over is an exact-dtype, C-contiguous array held by
the caller until ``train`` has returned (a temporary would be freed at once, and the loss
then silently reads 0).

Codes are onert_train's: loss 1 = mean squared error, 2 = categorical crossentropy;
reduction 1 = sum over batch size, 2 = sum; optimizer 1 = sgd, 2 = adam;
``trainable_ops`` -1 = all, 0 = none, N = the last N operators.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

LOSS_CODES = {1: "MEAN_SQUARED_ERROR", 2: "CATEGORICAL_CROSSENTROPY"}
REDUCTION_CODES = {1: "SUM_OVER_BATCH_SIZE", 2: "SUM"}
OPTIMIZER_CODES = {1: "SGD", 2: "ADAM"}


def onert_library() -> Any:
    """The onert wheel's pybind module (ImportError when the wheel is not installed)."""
    from onert.native import libnnfw_api_pybind as lib

    return lib


def open_session(
    model_path: str | os.PathLike,
    *,
    batch_size: int,
    learning_rate: float,
    loss: int = 2,
    reduction: int = 1,
    optimizer: int = 1,
    trainable_ops: int = -1,
) -> Any:
    """A prepared onert training session (``train_prepare`` done) with these settings."""
    lib = onert_library()
    for name, code, table in (("loss", loss, LOSS_CODES), ("reduction", reduction,
                              REDUCTION_CODES), ("optimizer", optimizer, OPTIMIZER_CODES)):
        if code not in table:
            raise ValueError(f"unknown onert {name} code {code}: use one of {sorted(table)}")
    session = lib.experimental.nnfw_session(os.fspath(model_path), "train")
    info = session.train_get_traininfo()
    info.learning_rate = float(learning_rate)
    info.batch_size = int(batch_size)
    info.loss_info.loss = getattr(lib.loss, LOSS_CODES[loss])
    info.loss_info.reduction_type = getattr(lib.loss_reduction, REDUCTION_CODES[reduction])
    info.opt = getattr(lib.optimizer, OPTIMIZER_CODES[optimizer])
    info.num_of_trainable_ops = int(trainable_ops)
    session.train_set_traininfo(info)
    session.train_prepare()
    return session


def io_dtypes(session: Any) -> tuple[list[np.dtype], list[np.dtype]]:
    """The session's input and output dtypes, in model order."""
    ins = [np.dtype(session.input_tensorinfo(i).dtype) for i in range(session.input_size())]
    outs = [np.dtype(session.output_tensorinfo(i).dtype) for i in range(session.output_size())]
    return ins, outs


def train_batch(session: Any, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray],
                update: bool = True) -> tuple[float, float]:
    """One step on one batch: (loss that ``train_get_loss(0)`` reports, ms in ``train``).

    ``xs``/``ys`` must already be C-contiguous arrays of the model's dtypes; they are held
    here until the step returns (the binding keeps their raw pointers). The loss is that of
    the forward pass that computed the gradients: the batch's PRE-update loss.
    """
    outputs = [np.zeros(y.shape, y.dtype) for y in ys]
    for i, a in enumerate(xs):
        session.train_set_input(i, a)
    for i, (y, o) in enumerate(zip(ys, outputs)):
        session.train_set_expected(i, y)
        session.train_set_output(i, o)
    t = time.perf_counter()
    session.train(update)
    ms = (time.perf_counter() - t) * 1000
    loss = float(session.train_get_loss(0))
    del xs, ys, outputs  # alive until here, after train() returned
    return loss, ms
