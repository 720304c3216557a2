"""Convolutions lowered per shape: CONV_2D, DEPTHWISE_CONV_2D and CONV_3D.

The methods, all computing :func:`circle_jax.ops.conv.conv`:

- ``"xla"``: ``lax.conv_general_dilated`` (the reference itself).
- ``"im2col"``: the kernel's shifted slices of the padded input are concatenated on the
  channel axis and multiplied by the flattened filter in one matmul (a batched matmul per
  group for grouped convolutions); a 3x3 one of few input channels is the primitive of
  :mod:`circle_jax.lowering.few_channels` (hand-written kernels on the CPU).
- ``"kn2row"``: one matmul gives every tap's product at every input pixel, then each tap's
  shifted slice of it is summed (ungrouped convolutions).
- ``"shift"``: depthwise only, see :mod:`circle_jax.lowering.depthwise`.

:func:`choose_conv_lowering` picks one per shape; the thresholds come from
``benchmarks/bench_conv_lowering.py`` (findings in benchmarks/README.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..ops.conv import Geometry, bias_act, conv, out_sizes, spatial_geometry
from ..ops.registry import OpContext
from . import CONV_METHODS, LoweringOptions, clamped, fast
from ._taps import offsets, pad_spatial, tap, taps
from .depthwise import channelwise
from .few_channels import applies, few_channels_conv, im2col_conv
from .matmul import (
    TRANSPOSED_OPERAND_ELEMENTS,
    matmul_2d,
    matmul_pretransposed,
)

#: Largest im2col depth (taps x input channels) and im2col matrix size lowered as im2col.
IM2COL_MAX_DEPTH = 144
IM2COL_MAX_BYTES = 640 << 10

#: Largest im2col matrix of a stride-1 convolution lowered as kn2row (when C_out <= C_in).
KN2ROW_MAX_BYTES = 72 << 10

#: Inside compiled loops (``LoweringOptions.in_loop``) XLA CPU's convolution is far slower
#: (benchmarks/README.md, finding 1), so im2col is used up to this matrix size (memory, not
#: time, bounds it there).
IM2COL_LOOP_MAX_BYTES = 256 << 20


def choose_conv_lowering(kernel: Sequence[int], c_in: int, c_out: int, groups: int,
                         out_pixels: int, strides: Sequence[int] = (), itemsize: int = 4,
                         in_loop: bool = False) -> str:
    """The method of a convolution; ``out_pixels`` = batch x output spatial size.

    Depthwise (one input channel per group) is ``"shift"``, other grouped convolutions and
    1x1 convolutions ``"im2col"``; a stride-1 convolution with C_out <= C_in and an im2col
    matrix of at most ``KN2ROW_MAX_BYTES`` is ``"kn2row"``; one with an im2col depth of at
    most ``IM2COL_MAX_DEPTH`` and a matrix of at most ``IM2COL_MAX_BYTES`` (in a loop body:
    ``IM2COL_LOOP_MAX_BYTES``) is ``"im2col"``; the rest ``"xla"``.
    """
    cg = c_in // groups
    if groups > 1:
        return "shift" if cg == 1 else "im2col"
    n_taps = math.prod(kernel)
    if n_taps == 1:
        return "im2col"
    depth = n_taps * cg
    size = out_pixels * depth * itemsize
    if all(s == 1 for s in strides) and c_out <= c_in and size <= KN2ROW_MAX_BYTES:
        return "kn2row"
    if depth <= IM2COL_MAX_DEPTH and size <= IM2COL_MAX_BYTES:
        return "im2col"
    if in_loop and size <= IM2COL_LOOP_MAX_BYTES:
        return "im2col"
    return "xla"


def conv_method(x: Any, w: Any, g: Geometry, options: LoweringOptions) -> str:
    """The method ``options`` give this convolution: the forced one, or the per-shape rule."""
    cg, c_out = w.shape[-2], w.shape[-1]
    groups = x.shape[-1] // cg
    allowed = ("xla", "im2col") + (("kn2row",) if groups == 1 else ()) + (
        ("shift",) if cg == 1 else ())
    if options.force is not None:
        if options.force not in allowed:
            raise ValueError(f"lowering {options.force!r} cannot compute a convolution with "
                             f"{cg} input channels per group (use one of {allowed})")
        return options.force
    out_pixels = x.shape[0] * math.prod(out_sizes(x.shape[1:-1], g))
    return choose_conv_lowering(g.kernel, x.shape[-1], c_out, groups, out_pixels, g.strides,
                                x.dtype.itemsize, options.in_loop)


def conv_nd(x: jax.Array, w: jax.Array, g: Geometry, method: str) -> jax.Array:
    """:func:`circle_jax.ops.conv.conv` computed with ``method`` (one of ``CONV_METHODS``)."""
    if method not in CONV_METHODS:
        raise ValueError(f"unknown convolution lowering {method!r}")
    out_sizes(x.shape[1:-1], g)
    return _conv_impl(x, w, g, method)


# Jitted so that eager (op-by-op) execution compiles one program per convolution instead of
# one per primitive (inside an outer jit it is simply inlined).
@functools.partial(jax.jit, static_argnums=(2, 3))
def _conv_impl(x: jax.Array, w: jax.Array, g: Geometry, method: str) -> jax.Array:
    cg, c_out = w.shape[-2], w.shape[-1]
    c_in = x.shape[-1]
    groups = c_in // cg
    if method == "xla":
        return conv(x, w, g)
    if method == "kn2row":
        return _kn2row(x, w, g)
    if method == "shift":
        m = c_out // c_in
        if m > 1:  # output channel c*M + k reads input channel c
            x = jnp.repeat(x, m, axis=-1)
        return channelwise(x, w.reshape(-1, c_out), g)
    if groups == 1:
        return few_channels_conv(x, w, g) if applies(x, w, g) else im2col_conv(x, w, g)
    cols = taps(x, g)
    stacked = jnp.stack(cols, axis=-2)  # [N, *S', K, C_in]
    stacked = stacked.reshape(*stacked.shape[:-1], groups, cg)
    wg = w.reshape(len(cols), cg, groups, c_out // groups)
    y = jnp.einsum("...kgc,kcgo->...go", stacked, wg)
    return y.reshape(*y.shape[:-2], c_out)


def _kn2row(x: jax.Array, w: jax.Array, g: Geometry) -> jax.Array:
    """Every tap's product at every input pixel (one matmul), then the sum of each tap's
    shifted slice of its own product (one fusion).

    The products are cut apart with ``lax.split``, whose transpose is one concatenate: the
    backward pass is the im2col of the output gradient and two matmuls.
    """
    nd = x.ndim - 2
    c_in, c_out = w.shape[-2], w.shape[-1]
    n_taps = math.prod(w.shape[:nd])
    w_all = jnp.moveaxis(w.reshape(n_taps, c_in, c_out), 0, 1).reshape(c_in, n_taps * c_out)
    if x.size > TRANSPOSED_OPERAND_ELEMENTS:
        products = matmul_2d(x, w_all)
    else:
        products = matmul_pretransposed(x.reshape(-1, c_in), w_all).reshape(
            *x.shape[:-1], n_taps * c_out)
    parts = lax.split(products, [c_out] * n_taps, axis=x.ndim - 1)
    out = out_sizes(x.shape[1:-1], g)
    return functools.reduce(jnp.add, (
        tap(pad_spatial(p, g.pads), offset, g, out)
        for p, offset in zip(parts, offsets(g.kernel), strict=True)))


@fast("CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D")
def spatial_conv(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """The spatial convolutions with the method :func:`conv_method` picks; a 3x3 depthwise
    one, or one of few input channels, with a bias and a clamping activation that the CPU
    kernels take is one layer (:mod:`circle_jax.lowering.clamped`)."""
    w, g = spatial_geometry(ctx, x, w)
    method = conv_method(x, w, g, ctx.lowering)
    act = ctx.options.fused_activation_function
    if clamped.applies(x, w, b, g, act):
        if method == "shift" and w.size == 9 * x.shape[-1]:  # depth multiplier 1
            return clamped.DEPTHWISE(x, w.reshape(9, -1), b, g, act)
        if method == "im2col" and applies(x, w, g):
            return clamped.FEW_CHANNELS(x, w, b, g, act)
    return bias_act(conv_nd(x, w, g, method), b, act)
