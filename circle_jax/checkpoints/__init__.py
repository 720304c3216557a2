"""A model's params and a training state in and out of files: onert checkpoints, ``.wof``
weights and circle+ metadata.

The layer above training: it turns :class:`~circle_jax.model.Model` params and
:class:`~circle_jax.train.TrainState` values into the byte-level codecs of
:mod:`circle_jax.formats` (which know nothing of JAX) and back. Every file is written with
:func:`~circle_jax.formats.atomic.atomic_write`.

- :mod:`.state`: onert checkpoints (write in either entry order, read whatever the order,
  resume bit-identically);
- :mod:`.weights`: onert-micro's weight-only ``.wof`` files;
- :mod:`.metadata`: circle+ ``CIRCLE_TRAINING`` metadata from a trainer;
- :mod:`.driver`: training that saves and resumes checkpoints (``fit_checkpointed``).
"""

from .driver import fit_checkpointed
from .metadata import circleplus_metadata, traininfo_of
from .state import (
    ASCENDING_MARK,
    checkpoint_bytes,
    checkpoint_order,
    checkpoint_params,
    constant_tensors,
    load_checkpoint,
    make_checkpoint,
    onert_order,
    read_checkpoint,
    save_checkpoint,
)
from .weights import load_wof, save_wof, wof_bytes

__all__ = [
    "ASCENDING_MARK", "checkpoint_bytes", "checkpoint_order", "checkpoint_params",
    "circleplus_metadata", "constant_tensors", "fit_checkpointed", "load_checkpoint",
    "load_wof", "make_checkpoint", "onert_order", "read_checkpoint", "save_checkpoint",
    "save_wof", "traininfo_of", "wof_bytes",
]
