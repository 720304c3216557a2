"""Circle's ROPE (rotary position embedding, code -7)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .registry import OpContext, register

# RoPEMode of the Circle schema.
GPT_NEOX, GPT_J = 0, 1


def _rotate(x: jax.Array, mode: int) -> jax.Array:
    """The partner of every element, negated for the first of each pair.

    GPT_NEOX pairs element i with i + d/2 (halves), GPT_J pairs 2i with 2i + 1 (neighbours).
    """
    d = x.shape[-1]
    if mode == GPT_NEOX:
        return jnp.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    pairs = x.reshape(x.shape[:-1] + (d // 2, 2))
    return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


@register("ROPE")
def rope(ctx: OpContext, x: Any, sin: Any, cos: Any) -> jax.Array:
    """x * cos + rotate(x) * sin, with the sin/cos tables broadcast against x.

    Per pair (a, b): out[a] = x[a] cos[a] - x[b] sin[a], out[b] = x[a] sin[b] + x[b] cos[b],
    as in ONE's kernels (luci-interpreter, cker) for GPT_NEOX. Those kernels read only the
    first row of each table (they serve one token at a time); broadcasting agrees with them on
    such tables and gives the fused graph's meaning (a table row per position) otherwise.
    GPT_J (not implemented in ONE's runtimes) pairs neighbouring elements, as GPT-J does.
    """
    mode = ctx.options.mode or GPT_NEOX
    if mode not in (GPT_NEOX, GPT_J):
        raise NotImplementedError(f"ROPE mode {mode} (known: 0 GPT_NEOX, 1 GPT_J)")
    x = jnp.asarray(x)
    d = x.shape[-1] if x.ndim else 0
    if d % 2:
        raise ValueError(f"ROPE needs an even last dimension, got shape {list(x.shape)}")
    for name, t in (("sin", sin), ("cos", cos)):
        shape = tuple(jnp.shape(t))
        if not shape or shape[-1] != d or jnp.broadcast_shapes(x.shape, shape) != x.shape:
            raise ValueError(
                f"ROPE {name} table of shape {list(shape)} does not broadcast to the input "
                f"shape {list(x.shape)} with the same last dimension"
            )
    sin, cos = jnp.asarray(sin, x.dtype), jnp.asarray(cos, x.dtype)
    return x * cos + _rotate(x, mode) * sin
