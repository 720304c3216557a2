"""Files in and out: models, raw data, circle+ metadata, ``.wof`` weights, onert checkpoints.

The codecs here work on bytes and numpy arrays and never import JAX. The functions that move
a :class:`~circle_jax.model.Model`'s params or a training state in and out of those files
(``save_checkpoint``, ``load_checkpoint``, ``save_wof``, ``load_wof``, ``circleplus_metadata``
...) live in :mod:`circle_jax.state_io` and are re-exported here lazily, so importing
``circle_jax.io`` alone does not import JAX.

Every file is written atomically (:func:`atomic_write`): a reader sees the old file or the
whole new one, and an input file passed as ``protect`` is never overwritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from circle_jax.io.atomic import atomic_write
from circle_jax.io.checkpoint import Checkpoint, as_array, decode_checkpoint, encode_checkpoint
from circle_jax.io.rawdata import check_same_count, load_array_file, read_raw, write_raw
from circle_jax.io.reader import read_model
from circle_jax.io.traininfo import (
    TrainInfo,
    decode_traininfo,
    encode_traininfo,
    traininfo_from_json,
    traininfo_to_json,
)
from circle_jax.io.wof import decode_wof, encode_wof
from circle_jax.io.writer import export_model

if TYPE_CHECKING:
    from circle_jax.state_io import (
        ASCENDING_MARK,
        checkpoint_bytes,
        checkpoint_order,
        checkpoint_params,
        circleplus_metadata,
        constant_tensors,
        fit_checkpointed,
        load_checkpoint,
        load_wof,
        make_checkpoint,
        onert_order,
        read_checkpoint,
        save_checkpoint,
        save_wof,
        traininfo_of,
        wof_bytes,
    )

_BRIDGE = (
    "ASCENDING_MARK",
    "checkpoint_bytes",
    "checkpoint_order",
    "checkpoint_params",
    "circleplus_metadata",
    "constant_tensors",
    "fit_checkpointed",
    "load_checkpoint",
    "load_wof",
    "make_checkpoint",
    "onert_order",
    "read_checkpoint",
    "save_checkpoint",
    "save_wof",
    "traininfo_of",
    "wof_bytes",
)


def __getattr__(name: str) -> Any:
    """Import the JAX-aware bridge functions from :mod:`circle_jax.state_io` on first use."""
    if name in _BRIDGE:
        from circle_jax import state_io

        return getattr(state_io, name)
    raise AttributeError(f"module 'circle_jax.io' has no attribute {name!r}")


__all__ = [
    "ASCENDING_MARK",
    "Checkpoint",
    "TrainInfo",
    "as_array",
    "atomic_write",
    "check_same_count",
    "checkpoint_bytes",
    "checkpoint_order",
    "checkpoint_params",
    "circleplus_metadata",
    "constant_tensors",
    "decode_checkpoint",
    "decode_traininfo",
    "decode_wof",
    "encode_checkpoint",
    "encode_traininfo",
    "encode_wof",
    "export_model",
    "fit_checkpointed",
    "load_array_file",
    "load_checkpoint",
    "load_wof",
    "make_checkpoint",
    "onert_order",
    "read_checkpoint",
    "read_model",
    "read_raw",
    "save_checkpoint",
    "save_wof",
    "traininfo_from_json",
    "traininfo_of",
    "traininfo_to_json",
    "wof_bytes",
    "write_raw",
]
