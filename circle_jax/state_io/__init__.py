"""Training state in and out of files: onert checkpoints, ``.wof`` weights and circle+ metadata.

The JAX-aware bridge between :class:`~circle_jax.model.Model` / :class:`~circle_jax.train.Trainer`
/ :class:`~circle_jax.train.TrainState` and the byte-level codecs of ``circle_jax.io`` (which
know nothing of JAX). Every file is written with :func:`~circle_jax.io.atomic.atomic_write`.

- :mod:`.checkpoint`: onert checkpoints (write in either entry order, read whatever the
  order, resume bit-identically);
- :mod:`.wof`: onert-micro's weight-only files;
- :mod:`.circleplus`: circle+ ``CIRCLE_TRAINING`` metadata from a trainer;
- :mod:`.driver`: training that saves and resumes checkpoints (``fit_checkpointed``).
"""

# The public names are listed once, in circle_jax.io (which re-exports them lazily).
from ..io import _BRIDGE
from .checkpoint import (  # noqa: F401 - re-exported (__all__)
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
from .circleplus import circleplus_metadata, traininfo_of  # noqa: F401
from .driver import fit_checkpointed  # noqa: F401
from .wof import load_wof, save_wof, wof_bytes  # noqa: F401

__all__ = list(_BRIDGE)

