"""File formats as bytes and plain data (numpy), without JAX: models, raw data, circle+
metadata, ``.wof`` weights, onert checkpoints, nnpackages and atomic writes.

Nothing here imports JAX or anything of circle_jax above :mod:`circle_jax.graph.ir`; moving a
model's params or a training state in and out of these files is :mod:`circle_jax.checkpoints`.
Every file is written atomically (:func:`atomic_write`): a reader sees the old file or the
whole new one, and an input file passed as ``protect`` is never overwritten.
"""

from __future__ import annotations

from circle_jax.formats.atomic import atomic_write
from circle_jax.formats.checkpoint import Checkpoint, as_array, decode_checkpoint, encode_checkpoint
from circle_jax.formats.rawdata import check_same_count, load_array_file, read_raw, write_raw
from circle_jax.formats.reader import read_model
from circle_jax.formats.traininfo import (
    TrainInfo,
    decode_traininfo,
    encode_traininfo,
    traininfo_from_json,
    traininfo_to_json,
)
from circle_jax.formats.wof import decode_wof, encode_wof
from circle_jax.formats.writer import export_model, write_model

__all__ = [
    "Checkpoint",
    "TrainInfo",
    "as_array",
    "atomic_write",
    "check_same_count",
    "decode_checkpoint",
    "decode_traininfo",
    "decode_wof",
    "encode_checkpoint",
    "encode_traininfo",
    "encode_wof",
    "export_model",
    "load_array_file",
    "read_model",
    "read_raw",
    "traininfo_from_json",
    "traininfo_to_json",
    "write_model",
    "write_raw",
]
