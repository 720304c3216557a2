"""Resizes whose backward pass is a matmul: RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR.

The forward is the reference's gathers (a broadcast-and-reshape for whole-number
upscales); the backward multiplies by the static [out, in] resampling matrix instead of
XLA's scatter-add, slow on XLA CPU (benchmarks/README.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..ops.registry import OpContext
from ..ops.resize import AxisResampling, axis_resamplings
from ..ops.resize import resample as reference_resample
from . import fast


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def resample(x: jax.Array, axis: int, spec: AxisResampling) -> jax.Array:
    """:func:`circle_jax.ops.resize.resample` with a matmul backward pass."""
    return reference_resample(x, axis, spec, _gather)


def _gather(x: jax.Array, axis: int, idx: np.ndarray) -> jax.Array:
    """x[..., idx, ...] along ``axis``; a broadcast-and-reshape for whole-number upscales."""
    n, m = x.shape[axis], len(idx)
    factor = m // n
    if m == factor * n and (idx == np.arange(m) // factor).all():
        return jnp.repeat(x, factor, axis=axis, total_repeat_length=m)
    return jnp.take(x, jnp.asarray(idx), axis=axis)


def _resample_fwd(x, axis, spec):
    return resample(x, axis, spec), None


def _resample_bwd(axis, spec, _, g):
    m = jnp.asarray(spec.matrix(), g.dtype)
    dx = jnp.matmul(jnp.moveaxis(g, axis, -1), m, precision=jax.lax.Precision.HIGHEST)
    return (jnp.moveaxis(dx, -1, axis),)


resample.defvjp(_resample_fwd, _resample_bwd)


@fast("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def resize(ctx: OpContext, x: jax.Array, size: object) -> jax.Array:
    """The resizes with :func:`resample`."""
    x = jnp.asarray(x)
    for axis, spec in axis_resamplings(ctx, x, size, ctx.op.key == "RESIZE_BILINEAR"):
        x = resample(x, axis, spec)
    return x
