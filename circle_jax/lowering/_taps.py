"""Kernel taps as strided slices of a padded channels-last input, and the vmap rules of the
convolution primitives (shared by the lowerings)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive

from ..ops.conv import Geometry, out_sizes


def offsets(kernel: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every tap of a kernel, in row-major order."""
    return itertools.product(*(range(k) for k in kernel))


def pad_spatial(x: jax.Array, pads: Sequence[tuple[int, int]]) -> jax.Array:
    """Zero-pad the spatial dims of [N, *S, C] (``lax.pad``: ``jnp.pad`` adds a jitted call
    per use, which a gradient's trace pays for again)."""
    if not any(lo or hi for lo, hi in pads):
        return x
    return lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads),
                                                (0, 0, 0)])


def tap_bounds(offset: Sequence[int], g: Geometry, out: Sequence[int]
               ) -> tuple[list[int], list[int]]:
    """Per spatial dim, the first and one past the last padded-input index that the kernel
    tap at ``offset`` reads for an output of spatial size ``out`` (every ``stride``-th)."""
    start = [o * d for o, d in zip(offset, g.dilations, strict=True)]
    limit = [b + (m - 1) * s + 1 for b, m, s in zip(start, out, g.strides, strict=True)]
    return start, limit


def tap(xp: jax.Array, offset: Sequence[int], g: Geometry, out: Sequence[int]) -> jax.Array:
    """The strided slice of the padded input ``xp`` [N, *S, C] seen by the kernel tap at
    ``offset``."""
    start, limit = tap_bounds(offset, g, out)
    return lax.slice(xp, (0, *start, 0), (xp.shape[0], *limit, xp.shape[-1]),
                     (1, *g.strides, 1))


def taps(x: jax.Array, g: Geometry) -> list[jax.Array]:
    """The strided slice of the padded input seen by each kernel tap of ``g``."""
    out = out_sizes(x.shape[1:-1], g)
    xp = pad_spatial(x, g.pads)
    return [tap(xp, offset, g, out) for offset in offsets(g.kernel)]


def tangent_sum(terms: list[jax.Array], y: jax.Array) -> jax.Array:
    """The sum of a jvp rule's tangent terms (zeros like ``y`` when every input's is zero),
    in `jax.lax` where the terms agree in shape and dtype (``jnp``'s ``+`` is a jitted
    call, traced again per use)."""
    if not terms:
        return jnp.zeros_like(y)
    if all(t.shape == terms[0].shape and t.dtype == terms[0].dtype for t in terms):
        return functools.reduce(lax.add, terms)
    return sum(terms[1:], terms[0])


def batch_convolution(primitive: Primitive, reference: Callable[..., jax.Array]
                      ) -> Callable[..., tuple[jax.Array, int]]:
    """The vmap rule of convolution ``primitive`` (``bind(x, w, geometry=g)``): a mapped
    ``x`` with a shared filter folds its mapped axis into the samples; a mapped filter runs
    ``reference(x, w, g)`` under vmap."""
    def rule(args: tuple, dims: tuple, *, geometry: Geometry) -> tuple[jax.Array, int]:
        (x, w), (dx, dw) = args, dims
        if dw is not None:
            return jax.vmap(functools.partial(reference, g=geometry), in_axes=(dx, dw))(
                x, w), 0
        x = jnp.moveaxis(x, dx, 0)
        y = primitive.bind(x.reshape(-1, *x.shape[2:]), w, geometry=geometry)
        return y.reshape(x.shape[0], -1, *y.shape[1:]), 0

    return rule


def batch_by_vmap(fn: Callable[..., Any], multiple_results: bool = False
                  ) -> Callable[..., tuple[Any, Any]]:
    """The vmap rule of a primitive computing ``fn(*args, **params)``: ``fn`` under vmap
    (per-sample weight gradients); ``multiple_results``: ``fn`` returns a sequence."""
    def rule(args: tuple, dims: tuple, **params: Any) -> tuple[Any, Any]:
        out = jax.vmap(functools.partial(fn, **params), in_axes=dims)(*args)
        return (out, (0,) * len(out)) if multiple_results else (out, 0)

    return rule
