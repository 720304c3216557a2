"""Helpers shared by the checkpoint, .wof and training-driver modules.
"""

from __future__ import annotations

import numpy as np

from ..formats.atomic import PathLike
from ..graph import ir
from ..model import Model
from ..train import (
    Trainer,
)

Source = PathLike | bytes | bytearray | memoryview
"""A file path or the file's bytes."""


def _nbytes(t: ir.Tensor) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * ir.as_numpy_dtype(t.dtype).itemsize


def _describe(t: ir.Tensor) -> str:
    return f"tensor {t.index} {t.name!r} {t.dtype}{list(t.shape)}"


def _main_params(model: Model) -> dict[int, str]:
    """Tensor index -> param name for the params of subgraph 0."""
    return {i: name for name, (k, i) in model.param_keys.items() if k == 0}


def _stream_k(trainer: Trainer) -> int:
    cfg = trainer.config
    return cfg.accumulate if cfg.accumulate_mode == "stream" else 1


def require_finite(value: np.ndarray, what: str, error: type[Exception]) -> np.ndarray:
    """``value``, or ``error`` naming ``what`` when it holds a NaN or infinity (float only):
    no file is written from, and no weights are read out of, a diverged state."""
    a = np.asarray(value)
    if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise error(f"{what} holds {bad} NaN or infinite value(s); a file is written and read "
                    "only with finite weights (the previous file, if any, is kept)")
    return a

