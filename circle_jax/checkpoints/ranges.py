"""A QAT model's moving activation ranges beside its onert checkpoint.

onert's checkpoint format has no place for them, so the checkpoint of a
``load(qat_ranges="ema")`` run gets a sidecar file, ``<checkpoint>.ranges.json``: group
name -> ``[min, max]`` (`circle_jax.train.TrainState.stats`; float32 values written as
decimals that read back to the same float32). Resuming such a model from a checkpoint
path reads it back, so the run continues bit-identically; a missing or mismatched sidecar
is refused in one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import DataError
from ..formats.atomic import PathLike, atomic_write
from ..model import Model
from ..train import TrainState


def ranges_path(checkpoint: PathLike) -> Path:
    """The sidecar of checkpoint file ``checkpoint``."""
    return Path(f"{os.fspath(checkpoint)}.ranges.json")


def save_ranges(checkpoint: PathLike, state: TrainState, protect: Any = None) -> None:
    """Write ``state``'s moving ranges beside ``checkpoint`` (nothing when it has none)."""
    if not state.stats:
        return
    ranges = {k: [float(v) for v in np.asarray(r, np.float32)] for k, r in state.stats.items()}
    atomic_write(ranges_path(checkpoint), json.dumps(ranges, indent=1).encode(),
                 protect=protect)


def read_ranges(source: Any, model: Model) -> dict[str, jax.Array]:
    """The moving ranges saved beside checkpoint ``source`` (a path) for ``model``; empty
    for a model without them; DataError in one line when they cannot be read."""
    if not model.ranges:
        return {}
    path = ranges_path(source) if isinstance(source, (str, os.PathLike)) else None
    if path is None or not path.is_file():
        raise DataError(f"the model moves its activation ranges (qat_ranges='ema') but "
                        f"{path or 'a checkpoint given as bytes'} is missing: resume from the "
                        "checkpoint file whose ranges were saved beside it")
    try:
        saved = json.loads(path.read_text())
        return {k: jnp.asarray(np.asarray(saved[k], np.float32).reshape(2))
                for k in model.ranges}
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not the ranges of this model's activations "
                        f"({type(e).__name__}: {str(e)[:100]})") from None


def restore_ranges(source: Any, model: Model, state: TrainState) -> TrainState:
    """``state`` with the moving ranges saved beside checkpoint ``source`` (`read_ranges`)."""
    ranges = read_ranges(source, model)
    return state._replace(stats=ranges) if ranges else state
