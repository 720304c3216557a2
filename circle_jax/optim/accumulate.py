"""Gradient accumulation: one optimizer update from ``k`` micro-batches.

Two forms with the same arithmetic:

- `accumulate` wraps an optimizer (optax.MultiSteps semantics): call it once per
  micro-batch; it emits zero updates on ``k - 1`` calls and the real update on the k-th.
- `accumulate_in_step` wraps a gradient function: one call splits a batch into ``k``
  micro-batches and returns the combined loss and gradients, scanning so only one
  micro-batch of activations is live.

``reduction`` must match the loss's reduction over the batch. With ``"sum_over_batch_size"``
(a mean) the big-batch gradient is the MEAN of ``k`` equal-size micro-batch gradients: use
``reduction="mean"``. With ``"sum"`` the big-batch loss is the SUM of the micro-batch sums,
so its gradient is the SUM of theirs: use ``reduction="sum"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from circle_jax.errors import ConfigError

ACC_REDUCTIONS = ("mean", "sum")


def _check_args(every_k: int, reduction: str) -> None:
    if isinstance(every_k, bool) or not isinstance(every_k, int) or every_k < 1:
        raise ConfigError(f"the number of micro-batches must be an int >= 1, got {every_k!r}")
    if reduction not in ACC_REDUCTIONS:
        raise ConfigError(f"unknown accumulation reduction {reduction!r}: use 'mean' or 'sum'")


class AccumulateState(NamedTuple):
    """State of `accumulate`.

    Attributes:
      mini_step: int32 micro-batches accumulated since the last real update, in ``[0, k)``.
      gradient_step: int32 number of real (inner) updates made so far.
      acc_grads: running mean (or sum) of this cycle's micro-batch gradients; one buffer
        per parameter, in the parameter dtype unless ``acc_dtype`` is given.
      inner_state: state of the wrapped optimizer; advances once per real update, so Adam's
        step count and learning-rate schedules see real updates, not micro-steps.
    """

    mini_step: jax.Array
    gradient_step: jax.Array
    acc_grads: optax.Updates
    inner_state: optax.OptState


def accumulate(
    inner: optax.GradientTransformation,
    every_k: int,
    reduction: str = "mean",
    acc_dtype: Any = None,
) -> optax.GradientTransformation:
    """Apply ``inner`` once every ``every_k`` calls, to the mean (or sum) of their gradients.

    Same results as ``optax.MultiSteps(inner, every_k, use_grad_mean=reduction == "mean")``
    (the running mean is ``acc += (g - acc) / (n + 1)``), but the inner update only runs on
    the k-th call (``lax.cond``) and the accumulator defaults to the parameter dtype.
    """
    _check_args(every_k, reduction)
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: optax.Params) -> AccumulateState:
        return AccumulateState(
            mini_step=jnp.zeros([], jnp.int32),
            gradient_step=jnp.zeros([], jnp.int32),
            acc_grads=optax.tree.zeros_like(params, dtype=acc_dtype),
            inner_state=inner.init(params),
        )

    def update_fn(updates, state: AccumulateState, params=None, **extra_args):
        n = state.mini_step
        if reduction == "mean":
            acc = jax.tree.map(lambda g, a: a + (g - a) / (n + 1), updates, state.acc_grads)
        else:
            acc = jax.tree.map(lambda g, a: g + a, updates, state.acc_grads)
        acc = jax.tree.map(lambda a, old: a.astype(old.dtype), acc, state.acc_grads)
        emit = n == every_k - 1

        def run_inner(acc, inner_state):
            return inner.update(
                optax.tree.cast_like(acc, updates), inner_state, params, **extra_args
            )

        out_shape = jax.eval_shape(run_inner, acc, state.inner_state)

        def apply(acc, inner_state):
            new_updates, new_state = run_inner(acc, inner_state)
            new_state = jax.tree.map(lambda s, o: s.astype(o.dtype), new_state, inner_state)
            return new_updates, new_state

        def hold(acc, inner_state):
            del acc
            return optax.tree.zeros_like(out_shape[0]), inner_state

        new_updates, inner_state = lax.cond(emit, apply, hold, acc, state.inner_state)
        new_state = AccumulateState(
            mini_step=jnp.where(emit, 0, optax.safe_int32_increment(n)).astype(jnp.int32),
            gradient_step=jnp.where(
                emit, optax.safe_int32_increment(state.gradient_step), state.gradient_step
            ),
            acc_grads=jax.tree.map(lambda a: jnp.where(emit, jnp.zeros_like(a), a), acc),
            inner_state=inner_state,
        )
        return new_updates, new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def has_updated(state: AccumulateState) -> jax.Array:
    """True when the call that produced ``state`` emitted a real update (optax's name)."""
    return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)


def is_update_step(state: AccumulateState, every_k: int) -> jax.Array:
    """True when the next `accumulate` call with ``state`` will emit a real update."""
    return state.mini_step == every_k - 1


def split_batch(batch: Any, k: int, groups: int = 1) -> Any:
    """Reshape every leaf ``(n, ...)`` of ``batch`` to ``(k, n // k, ...)``.

    Micro-batch ``i`` is rows ``[i * n // k, (i + 1) * n // k)``. With ``groups=g`` the rows
    are first cut into g equal groups (the shards of a batch split over g devices) and
    micro-batch ``i`` is the i-th k-th of every group, so each micro-batch stays split over
    the devices. Raises ValueError when the leaves disagree on ``n`` or ``n`` is not a
    multiple of ``k * groups``.
    """
    leaves = jax.tree.leaves(batch)
    if not leaves:
        raise ValueError("cannot split an empty batch into micro-batches")
    sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
    if len(sizes) != 1 or None in sizes:
        got = ", ".join(sorted(map(str, sizes)))
        raise ValueError(f"batch leaves need one common leading (batch) size, got {got}")
    (n,) = sizes
    if n % (k * groups):
        per = f" in each of {groups} groups" if groups > 1 else ""
        raise ConfigError(f"batch size {n} is not divisible into {k} equal micro-batches{per}")
    if groups == 1:
        return jax.tree.map(lambda x: jnp.reshape(x, (k, n // k) + jnp.shape(x)[1:]), batch)

    def cut(x: jax.Array) -> jax.Array:
        rest = jnp.shape(x)[1:]
        x = jnp.reshape(x, (groups, k, n // (groups * k)) + rest)
        return jnp.reshape(jnp.swapaxes(x, 0, 1), (k, n // k) + rest)

    return jax.tree.map(cut, batch)


def accumulate_in_step(
    grad_fn: Callable[..., Any],
    k: int,
    reduction: str = "mean",
    has_aux: bool = False,
    groups: int = 1,
) -> Callable[..., Any]:
    """Turn ``grad_fn(params, batch, *args) -> (loss, grads)`` into a k-micro-batch version.

    The returned function has the same signature and output. It splits every leaf of
    ``batch`` along axis 0 into ``k`` equal micro-batches (`split_batch`, with ``groups``:
    the devices the batch is sharded over) and runs
    ``grad_fn`` on each inside one ``lax.scan``. With ``reduction="mean"`` loss and grads are
    the mean over micro-batches, with ``"sum"`` their sum (see the module docstring).
    With ``has_aux=True`` ``grad_fn`` returns ``((loss, aux), grads)`` and so does the result,
    with every aux leaf stacked over micro-batches (leading axis ``k``).
    """
    _check_args(k, reduction)

    def fn(params, batch, *args):
        micro = split_batch(batch, k, groups)

        def body(carry, mb):
            out = grad_fn(params, mb, *args)
            (loss, aux), grads = out if has_aux else ((out[0], None), out[1])
            loss_sum, grad_sum = carry
            carry = (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads))
            return carry, aux

        first = jax.tree.map(lambda x: x[0], micro)
        out_shape = jax.eval_shape(grad_fn, params, first, *args)
        (loss_shape, _), grad_shape = out_shape if has_aux else ((out_shape[0], None), out_shape[1])
        init = (optax.tree.zeros_like(loss_shape), optax.tree.zeros_like(grad_shape))
        (loss, grads), aux = lax.scan(body, init, micro)
        if reduction == "mean":
            loss = loss / k
            grads = jax.tree.map(lambda g: g / k, grads)
        return ((loss, aux), grads) if has_aux else (loss, grads)

    return fn
