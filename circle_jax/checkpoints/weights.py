"""onert-micro's weight-only file (``.wof``).

onert-micro's weight-only file: buffer ``k`` belongs to tensor ``k`` of subgraph 0; circle-jax
fills the buffers of the trainable float weights and leaves the others empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import CircleFormatError, DataError, TrainingError
from ..formats.atomic import PathLike, atomic_write
from ..formats.checkpoint import as_array
from ..formats.reader import read_bytes
from ..formats.wof import decode_wof, encode_wof
from ..graph import ir
from ..model import Model
from ._common import Source, _describe, _main_params, _nbytes, require_finite


def wof_bytes(model: Model, params: Mapping[str, Any] | None = None,
              trainable: Iterable[str] | None = None) -> bytes:
    """The ``.wof`` bytes of ``params`` (default: the model's) for the ``trainable`` names
    (or aliases such as ``op3.bias``).

    Buffer ``k`` is tensor ``k`` of subgraph 0, filled for trainable float weights only
    (default: those that train by default: a new head and adapters where the model has
    them, else `Model.trainable_params`), in the tensor's dtype.
    """
    params = model.params if params is None else params
    names = _main_params(model)
    chosen = (model.personal_params or model.trainable_params) if trainable is None \
        else model.resolve_params(trainable)
    sg = model.ir.main
    buffers: list[np.ndarray | None] = [None] * len(sg.tensors)
    for i, name in names.items():
        if name in chosen:
            dt = ir.as_numpy_dtype(sg.tensors[i].dtype)
            buffers[i] = require_finite(np.asarray(params[name]).astype(dt),
                                        f"weight {name!r} to write", TrainingError)
    return encode_wof(buffers)


def save_wof(path: PathLike, model: Model, params: Mapping[str, Any] | None = None,
             trainable: Iterable[str] | None = None, *,
             protect: PathLike | Iterable[PathLike] | None = None) -> None:
    """Write the trainable weights as a ``.wof`` file (atomically); see :func:`wof_bytes`."""
    atomic_write(path, wof_bytes(model, params, trainable), protect=protect)


def load_wof(source: Source, model: Model,
             params: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
    """``params`` (default: the model's) with the weights of a ``.wof`` file put in.

    The file must have one buffer per tensor of subgraph 0; each filled buffer must belong to
    a float weight and have exactly its size (dtype and shape come from the model). A filled
    buffer of another constant is accepted only when it repeats that constant's bytes.
    """
    buf, where = read_bytes(source, "wof", DataError)
    sg = model.ir.main
    try:
        buffers = decode_wof(buf, num_tensors=len(sg.tensors))
    except CircleFormatError as e:
        raise CircleFormatError(f"{where}: {e}") from None
    names = _main_params(model)
    out = dict(model.params if params is None else params)
    for k, raw in enumerate(buffers):
        if raw is None:
            continue
        t = sg.tensors[k]
        if k not in names:
            if t.is_constant and raw.tobytes() == np.ascontiguousarray(t.data).tobytes():
                continue
            raise CircleFormatError(
                f"{where}: buffer {k} has {raw.size} bytes of data, but {_describe(t)} is not a "
                "float weight of the model: the file belongs to another model")
        if raw.size != _nbytes(t):
            raise CircleFormatError(
                f"{where}: buffer {k} has {raw.size} bytes, expected {_nbytes(t)} for "
                f"{_describe(t)}: the file belongs to another model")
        value = as_array(raw, ir.as_numpy_dtype(t.dtype), t.shape)
        out[names[k]] = jnp.asarray(require_finite(value, f"{where}: {_describe(t)}",
                                                   DataError))
    return out
