"""Half-float models on the interpreter: where an operator computes in float32 around half
float arguments (`LoweringOptions.float32_ops`) and where float32 weights are rounded to half
with float32 gradients (`LoweringOptions.half_weights`).

Rules: an operator listed in ``float32_ops`` sees float32 arguments and gives back half
outputs, except the main subgraph's outputs (the loss reads them in float32); with
``half_weights`` a traced float32 argument is rounded to half on the way in and its gradient
comes back in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ops.registry import OpContext


def in_float32(fn: Callable[..., Any], ctx: OpContext, args: Sequence[Any],
                keep: Sequence[bool]) -> Any:
    """``fn(ctx, *args)`` computed in float32 when an argument is a half float: those
    arguments cast up, float32 outputs cast back to the (first) half dtype, except where
    ``keep`` is set (the main subgraph's outputs, which the loss reads in float32)."""
    half = next((a.dtype for a in args if _half(a)), None)
    if half is None:
        return fn(ctx, *args)
    out = fn(ctx, *(a.astype(np.float32) if _half(a) else a for a in args))
    many = isinstance(out, (tuple, list))
    outs = tuple(out) if many else (out,)
    if len(outs) != len(keep):  # the caller reports the count
        return out
    outs = tuple(o if kept or getattr(o, "dtype", None) != np.float32 else o.astype(half)
                 for o, kept in zip(outs, keep))
    return outs if many else outs[0]


def float32_weight_grads(fn: Callable[..., Any], ctx: OpContext, args: Sequence[Any],
                          half: str) -> Any:
    """``fn(ctx, *args)`` with its traced float arguments rounded to ``half`` (the float32
    weights; the activations already are), whose backward runs in float32: each argument's
    gradient comes back in that argument's dtype, so a float32 weight's gradient is
    accumulated and kept in float32 (`LoweringOptions.half_weights`)."""
    dtype = np.dtype(half)
    where = [j for j, a in enumerate(args) if isinstance(a, jax.Array)]

    def call(values: Sequence[Any]) -> Any:
        full = list(args)
        for j, v in zip(where, values):
            full[j] = v
        return fn(ctx, *full)

    def floating(a: Any) -> bool:
        return jnp.issubdtype(a.dtype, jnp.floating)

    def rounded(a: jax.Array) -> jax.Array:  # float32, the value rounded to half
        if not floating(a):
            return a
        up = a.astype(np.float32)
        return up + jax.lax.stop_gradient(a.astype(dtype).astype(np.float32) - up)

    @jax.custom_vjp
    def op(*values: jax.Array) -> Any:
        return call([v.astype(dtype) if floating(v) else v for v in values])

    def fwd(*values: jax.Array) -> tuple[Any, tuple]:
        return op(*values), values

    def bwd(values: tuple, g: Any) -> tuple:
        _, vjp = jax.vjp(lambda *v: call([rounded(a) for a in v]), *values)
        return vjp(jax.tree.map(lambda c: c.astype(np.float32) if floating(c) else c, g))

    op.defvjp(fwd, bwd)
    return op(*(args[j] for j in where))


def traced_float32(x: Any) -> bool:
    return isinstance(x, jax.Array) and x.dtype == np.float32


def _half(x: Any) -> bool:
    return getattr(x, "dtype", None) in (np.float16, jnp.bfloat16)
