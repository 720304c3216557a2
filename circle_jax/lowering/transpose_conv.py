"""Transpose convolutions as col2im: TRANSPOSE_CONV and Convolution2DTransposeBias.

One matmul gives every tap's contribution at every input pixel; each tap's part is placed
at its strided output positions with ``lax.pad`` (interior padding) and summed. XLA CPU's
``lhs_dilation`` convolution (the reference) works over the zeros of the dilated input, so
col2im is used whenever its per-tap product fits ``COL2IM_MAX_BYTES`` (benchmarks/README.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..ops.conv import TransposeGeometry, bias_act, transpose_conv_2d, transpose_geometry
from ..ops.registry import OpContext
from . import TRANSPOSE_CONV_METHODS, LoweringOptions, fast
from ._taps import offsets
from .matmul import matmul_2d

#: Largest per-tap product (input pixels x taps x output channels) lowered as col2im; beyond
#: it memory decides.
COL2IM_MAX_BYTES = 512 << 20


def choose_transpose_conv_lowering(kernel: Sequence[int], c_out: int, in_pixels: int,
                                   itemsize: int = 4) -> str:
    """``"col2im"`` while the per-tap product (``in_pixels`` = batch x input spatial size,
    times taps and output channels) fits ``COL2IM_MAX_BYTES``, else ``"xla"``."""
    if in_pixels * math.prod(kernel) * c_out * itemsize <= COL2IM_MAX_BYTES:
        return "col2im"
    return "xla"


def transpose_method(x: Any, w: Any, options: LoweringOptions) -> str:
    """The method ``options`` give this transpose convolution."""
    if options.force is not None:
        if options.force not in TRANSPOSE_CONV_METHODS:
            raise ValueError(f"lowering {options.force!r} cannot compute a transpose "
                             f"convolution (use one of {TRANSPOSE_CONV_METHODS})")
        return options.force
    return choose_transpose_conv_lowering(tuple(w.shape[1:3]), w.shape[0],
                                          math.prod(x.shape[:3]), x.dtype.itemsize)


@functools.partial(jax.jit, static_argnums=(2, 3))
def transpose_conv_nd(x: jax.Array, w: jax.Array, g: TransposeGeometry,
                      method: str) -> jax.Array:
    """:func:`circle_jax.ops.conv.transpose_conv_2d` computed with ``method``."""
    if method == "xla":
        return transpose_conv_2d(x, w, g)
    if method != "col2im":
        raise ValueError(f"unknown transpose convolution lowering {method!r}")
    c_out, kh, kw, c_in = w.shape
    if x.shape[-1] != c_in:
        raise ValueError(f"input channels {x.shape[-1]} != filter input channels {c_in}")
    # y[..., tap, o] = sum_c x[..., c] w[o, tap, c]: one matmul for every tap.
    y = matmul_2d(x, jnp.transpose(w, (3, 1, 2, 0)).reshape(c_in, kh * kw * c_out))
    # lax.split, not y[..., k, :]: the transpose of a split is one concatenate, that of
    # indexing pads every tap's cotangent to the size of y.
    parts = lax.split(y, [c_out] * (kh * kw), axis=3)
    zero = jnp.zeros((), y.dtype)
    acc = None
    for part, taps in zip(parts, offsets((kh, kw)), strict=True):
        config = [(0, 0, 0)]
        for f, p, n, m, s in zip(taps, g.before, x.shape[1:3], g.out, g.strides, strict=True):
            lo = f - p
            config.append((lo, m - lo - (n - 1) * s - 1, s - 1))
        config.append((0, 0, 0))
        term = lax.pad(part, zero, config)
        acc = term if acc is None else acc + term
    return acc


@fast("TRANSPOSE_CONV")
def transpose_conv(ctx: OpContext, output_shape: Any, w: Any, x: Any, b: Any = None
                   ) -> jax.Array:
    """TRANSPOSE_CONV with the method :func:`transpose_method` picks."""
    g = transpose_geometry(ctx, x, w, output_shape)
    y = transpose_conv_nd(x, w, g, transpose_method(x, w, ctx.lowering))
    return bias_act(y, b, ctx.options.fused_activation_function)


@fast("CUSTOM:Convolution2DTransposeBias")
def convolution_2d_transpose_bias(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """Convolution2DTransposeBias with the method :func:`transpose_method` picks."""
    g = transpose_geometry(ctx, x, w)
    return bias_act(transpose_conv_nd(x, w, g, transpose_method(x, w, ctx.lowering)), b, None)
