"""Data-only work of a training step, computed for a whole epoch before its loop.

Part of a step depends only on its batch (and on loop-invariant values such as frozen
weights): the im2col of an input image, the class index of a one-hot label, the forward of a
frozen prefix when only the last operators train. `split_step` separates that part from the
rest by JAX's partial evaluation of the step's jaxpr; an epoch then computes it for all of
its batches at once, vectorized, before the scan, and every step does only the work that
depends on the state it updates. Values and gradients are those of the unsplit step: the same
operations run, only earlier. (Vectorized over batches, the matmuls of a frozen prefix may
round differently in the last bits: a frozen MobileNet's batch losses moved by 2e-6.)

It pays where steps are dispatch-bound (many small XLA operations; benchmarks/README.md,
finding 7). Partial evaluation is JAX-internal
(``jax._src.interpreters.partial_eval``, the machinery behind ``jax.linearize``); where it
is missing or fails, `split_step` returns None and epochs run the plain step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
from jax import lax

if TYPE_CHECKING:
    from jax.extend.core import ClosedJaxpr

try:
    from jax._src.interpreters.partial_eval import partial_eval_jaxpr_nounits
    from jax.extend.core import jaxpr_as_fun
except ImportError:  # pragma: no cover - a JAX without them trains without hoisting
    partial_eval_jaxpr_nounits = None

#: Largest precomputed values of one step: beyond, streaming them costs about what computing
#: them in the loop does (benchmarks/README.md, finding 7).
MAX_STEP_BYTES = 64 << 10

#: Largest total size of the precomputed values of one epoch (memory).
MAX_HOISTED_BYTES = 256 << 20

#: Intermediate values the vectorized precomputation may hold at once (it runs in chunks).
CHUNK_BYTES = 64 << 20


def _nbytes(avals: Any) -> int:
    return sum(math.prod(a.shape) * a.dtype.itemsize for a in avals)


@dataclasses.dataclass(frozen=True)
class SplitStep:
    """A step ``(carry, invariant, batch) -> (carry, out)`` cut in two.

    ``precompute(invariant, batches)`` returns the batch-dependent values of every step
    (leading axis: steps) and ``step(carry, invariant, values)`` is one step given its own.
    """

    state_part: ClosedJaxpr  # (*residuals, *carry leaves) -> outputs
    invariant_part: ClosedJaxpr  # (*invariant leaves) -> (*invariant residuals, *res2)
    batch_part: ClosedJaxpr  # (*res2, *batch leaves) -> batch residuals
    from_batch: tuple[bool, ...]  # per residual: computed by batch_part (else invariant_part)
    out_tree: Any
    chunk: int  # steps per vectorized chunk of precompute

    def _invariant(self, invariant: Any) -> tuple[list, list]:
        outs = jaxpr_as_fun(self.invariant_part)(*jax.tree.leaves(invariant))
        n = self.from_batch.count(False)
        return list(outs[:n]), list(outs[n:])

    def precompute(self, invariant: Any, batches: Any) -> tuple[jax.Array, ...]:
        _, res2 = self._invariant(invariant)

        def one(b: list[jax.Array]) -> tuple[jax.Array, ...]:
            return tuple(jaxpr_as_fun(self.batch_part)(*res2, *b))

        # Chunks of ``chunk`` steps vectorized; one step at a time unbatched (a vmap of one
        # step is slower).
        return lax.map(one, jax.tree.leaves(batches),
                       batch_size=None if self.chunk == 1 else self.chunk)

    def step(self, carry: Any, invariant: Any, values: tuple[jax.Array, ...]) -> Any:
        fixed, _ = self._invariant(invariant)
        fixed, values = iter(fixed), iter(values)
        residuals = [next(values) if b else next(fixed) for b in self.from_batch]
        outs = jaxpr_as_fun(self.state_part)(*residuals, *jax.tree.leaves(carry))
        return jax.tree.unflatten(self.out_tree, outs)


def _over_limits(step_bytes: int, steps: int) -> bool:
    return step_bytes > MAX_STEP_BYTES or step_bytes * steps > MAX_HOISTED_BYTES


def split_step(step: Callable, carry: Any, invariant: Any, batch: Any,
               steps: int, needed: Any = ()) -> SplitStep | None:
    """Split ``step(carry, invariant, batch)`` (``batch`` one step's) for ``steps`` steps.

    None when nothing depends on the batch alone, when the precomputed values would exceed
    ``MAX_STEP_BYTES`` per step or ``MAX_HOISTED_BYTES`` in all, or when this JAX cannot
    partially evaluate the step. ``needed``: parts of ``batch`` that the state-dependent
    part is known to need whole (a dense loss's targets: its gradient reads every one of
    them): when they alone exceed the limits, None at once, without tracing the step.
    """
    if partial_eval_jaxpr_nounits is None or \
            _over_limits(_nbytes(jax.tree.leaves(needed)), steps):
        return None
    closed, out_shape = jax.make_jaxpr(step, return_shape=True)(carry, invariant, batch)
    n_carry, n_inv, n_batch = (len(jax.tree.leaves(t)) for t in (carry, invariant, batch))
    try:
        known, state_part, _, residuals = partial_eval_jaxpr_nounits(
            closed, [True] * n_carry + [False] * (n_inv + n_batch), instantiate=True)
        invariant_part, batch_part, from_batch, _ = partial_eval_jaxpr_nounits(
            known, [False] * n_inv + [True] * n_batch, instantiate=False)
    except Exception:  # noqa: BLE001 - an internal API: any failure means "do not split"
        return None
    hoisted = [a for a, b in zip(residuals, from_batch, strict=True) if b]
    if not hoisted or _over_limits(_nbytes(hoisted), steps):
        return None
    work = _nbytes(v.aval for e in batch_part.jaxpr.eqns for v in e.outvars)
    return SplitStep(state_part, invariant_part, batch_part, tuple(from_batch),
                     jax.tree.structure(out_shape), max(1, CHUNK_BYTES // max(work, 1)))
