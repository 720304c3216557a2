"""An epoch's summary: computed in the compiled epoch as one vector (one transfer to the
host), read back on the host."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..optim import all_finite
from .state import StepMetrics

#: the length of an `epoch_summary` vector (a validation pass appends its loss and accuracy)
SUMMARY_SIZE = 5


def epoch_summary(m: StepMetrics, params: dict, scale: jax.Array) -> jax.Array:
    """An epoch's summary as one vector of the loss dtype, so that reading it is one
    transfer: mean loss, loss scale, skipped steps, correct samples, all weights finite
    (counts are exact below 2**24 in float32; beyond, off by less than one in 2**24);
    `host_summary` reads it."""
    return jnp.stack([jnp.mean(m.loss), scale, jnp.sum(m.skipped), jnp.sum(m.correct),
                      all_finite_flat(params)]).astype(m.loss.dtype)


def all_finite_flat(params: dict) -> jax.Array:
    """`all_finite` of the params as one reduction over all of them (their concatenation,
    exact in the widest float dtype), not one per param: the same answer in a smaller
    program (a MobileNet's summary: about 300 fewer XLA instructions to load)."""
    floats = [x.ravel() for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
    if len(floats) < 2:
        return all_finite(params)
    return jnp.all(jnp.isfinite(jnp.concatenate(floats)))


def host_summary(row: Sequence[float]) -> tuple[tuple, tuple | None]:
    """(mean loss, skipped steps, correct samples, all weights finite, loss scale) from a
    `epoch_summary` vector as host numbers, and the validation (loss, accuracy) that follows it,
    or None without it."""
    loss, scale, skipped, right, finite, *validation = row
    return ((loss, int(skipped), int(right), bool(finite), scale),
            (tuple(validation) or None))


def host_rows(summaries: jax.Array, n: int) -> list[tuple[tuple, tuple | None]]:
    """`host_summary` of each of the first ``n`` rows of a program's summaries (one
    transfer)."""
    return [host_summary(row) for row in np.asarray(summaries)[:n].tolist()]
