"""Helpers shared by the checkpoint, .wof and training-driver modules.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..formats.atomic import PathLike
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
