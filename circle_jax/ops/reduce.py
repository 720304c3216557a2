"""Reductions: MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_ANY, REDUCE_ALL.

TFLite semantics shared by all of them: the axis input is a static int32/int64 scalar or
vector; negative axes count from the end; repeated axes count once; an empty axis list
returns the input unchanged; ``keep_dims`` keeps reduced axes as size 1; the output has the
input's dtype (integer sums wrap around). Quantized tensors are supported only by
REDUCE_MAX / REDUCE_MIN with the same input and output quantization (no rescaling).

Gradients follow TF: REDUCE_MAX / REDUCE_MIN split the incoming gradient equally among tied
extrema (TF's ``_MinOrMaxGrad``: ``indicators / num_selected``), which is also what
``lax.reduce_max``'s derivative does; REDUCE_PROD is exact when some inputs are zero.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .common import static
from .registry import OpContext, register


def reduction_axes(axis: object, rank: int) -> tuple[int, ...]:
    """Normalised, de-duplicated, sorted reduction axes from a static axis tensor."""
    values = static(axis, "reduction axis").astype(np.int64).ravel()
    out = set()
    for a in values.tolist():
        if not -rank <= a < max(rank, 1):
            raise ValueError(f"reduction axis {a} is out of range for a rank-{rank} input")
        out.add(a % rank if rank else 0)
    return tuple(sorted(out))


def _needs_requantize(ctx: OpContext, allow_same_scale: bool) -> bool:
    """True for a quantized input whose result would need rescaling (unsupported)."""
    q = ctx.inputs[0].quantization if ctx.inputs and ctx.inputs[0] is not None else None
    if q is None or not q.scale:
        return False
    return not (allow_same_scale and ctx.outputs and ctx.outputs[0].quantization == q)


def _reducer(
    name: str, fn: Callable[..., jax.Array], allow_quantized: bool = False
) -> Callable[..., jax.Array]:
    def op(ctx: OpContext, x: jax.Array, axis: object) -> jax.Array:
        if _needs_requantize(ctx, allow_quantized):
            raise NotImplementedError(
                f"{name} of a quantized tensor is not supported"
                + (" unless input and output share scale and zero point" if allow_quantized
                   else ""))
        axes = reduction_axes(axis, np.ndim(x))
        keep = bool(ctx.options.keep_dims)
        if not axes:
            return jnp.asarray(x)
        return fn(jnp.asarray(x), axis=axes, keepdims=keep)

    op.__name__ = name.lower()
    op.__doc__ = f"TFLite {name} over static axes (see the module docstring)."
    return op


def _mean(x: jax.Array, axis: tuple[int, ...], keepdims: bool) -> jax.Array:
    """Float mean; integer mean truncates toward zero like TFLite (which sums in 64 bits).

    The integer path avoids a 32-bit overflow of the sum without int64: with
    ``x = n*q + r`` (``0 <= r < n``), ``floor(sum/n) = sum(q) + sum(r)//n``.
    """
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.mean(x, axis=axis, keepdims=keepdims)
    n = int(np.prod([x.shape[a] for a in axis]))
    xi = x.astype(jnp.int32)
    q, r = xi // n, xi % n
    rs = jnp.sum(r, axis=axis, keepdims=keepdims, dtype=jnp.int32)
    floor = jnp.sum(q, axis=axis, keepdims=keepdims, dtype=jnp.int32) + rs // n
    inexact = rs % n != 0
    return (floor + ((floor < 0) & inexact).astype(jnp.int32)).astype(x.dtype)


def _typed(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """A jnp reduction that keeps the input dtype (jnp.sum/prod promote small integers)."""

    def reduce(x: jax.Array, axis: tuple[int, ...], keepdims: bool) -> jax.Array:
        return fn(x, axis=axis, keepdims=keepdims, dtype=x.dtype)

    return reduce


register("MEAN")(_reducer("MEAN", _mean))
register("SUM")(_reducer("SUM", _typed(jnp.sum)))
register("REDUCE_PROD")(_reducer("REDUCE_PROD", _typed(jnp.prod)))
register("REDUCE_MAX")(_reducer("REDUCE_MAX", jnp.max, allow_quantized=True))
register("REDUCE_MIN")(_reducer("REDUCE_MIN", jnp.min, allow_quantized=True))
register("REDUCE_ANY")(_reducer("REDUCE_ANY", jnp.any))
register("REDUCE_ALL")(_reducer("REDUCE_ALL", jnp.all))
