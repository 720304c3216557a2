"""A convolution as im2col and one matrix product (:func:`im2col_conv`), and the 3x3
convolution of at most ``MAX_CHANNELS`` input channels (an image's first layer) as a
primitive of its own, :data:`few_channels_p`, which the CPU lowers to hand-written kernels.

im2col materializes the kernel's nine shifted copies of the input and concatenates them
before its products; for MobileNet 0.25/128's first layer at batch 32 the copies and the
concatenate were 10.8 ms of a 62 ms step (benchmarks/README.md). The kernels
(`circle_jax.lowering.cpu_kernels`, ``cpu/conv.cc``) read the input where it lies, forward
and for the weight gradient; elsewhere (other dtypes, GPUs, several devices) the primitive
is :func:`im2col_conv` and its autodiff, as before. The input's gradient is im2col's
transpose everywhere (a first layer's input is data: it is not computed there).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from ..ops.conv import Geometry, out_sizes
from . import cpu_kernels
from ._taps import batch_by_vmap, batch_convolution, taps
from .matmul import matmul_nt

#: the most input channels :func:`few_channels_conv` takes (the kernels' limit)
MAX_CHANNELS = 4


def im2col_conv(x: jax.Array, w: jax.Array, g: Geometry) -> jax.Array:
    """An ungrouped convolution (x [N, *S, I], w [*K, I, O]) as the concatenation of the
    kernel's shifted slices of the padded input on the channel axis (im2col) times the
    filter as stored ([O, K]: `matmul_nt`)."""
    cols = taps(x, g)
    im2col = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
    rows = math.prod(im2col.shape[:-1])
    c_out = w.shape[-1]
    y = matmul_nt(im2col.reshape(rows, -1), jnp.moveaxis(w, -1, 0).reshape(c_out, -1))
    return y.reshape(*im2col.shape[:-1], c_out)


def applies(x: jax.Array, w: jax.Array, g: Geometry) -> bool:
    """Whether :func:`few_channels_conv` takes this convolution: 2-d, 3x3, dilation 1,
    equal strides 1 or 2, 1 to ``MAX_CHANNELS`` input channels, one group."""
    return cpu_kernels.kernel_geometry(x, g) and 1 <= x.shape[-1] <= MAX_CHANNELS \
        and w.shape[-2] == x.shape[-1]


def few_channels_conv(x: jax.Array, w: jax.Array, g: Geometry) -> jax.Array:
    """:func:`im2col_conv` of a convolution :func:`applies` takes, as one primitive
    (:data:`few_channels_p`) whose CPU lowering is a kernel; all AD modes and vmap work."""
    return few_channels_p.bind(x, w.astype(x.dtype), geometry=g)


def _filter(x: jax.core.ShapedArray | jax.Array, outputs: int, dtype: jnp.dtype
            ) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((3, 3, x.shape[-1], outputs), dtype)


def _weight_gradient(x: jax.Array, ct: jax.Array, *, geometry: Geometry) -> jax.Array:
    """im2col's weight gradient: [3, 3, I, O] for the output's cotangent ``ct``."""
    (dw,) = jax.linear_transpose(lambda w: im2col_conv(x, w, geometry),
                                 _filter(x, ct.shape[-1], ct.dtype))(ct)
    return dw


#: ``few_channels_p.bind(x, w, geometry=...)`` is :func:`im2col_conv` (bilinear in ``x`` and
#: ``w``); transposed w.r.t. ``w`` it is :data:`weight_gradient_p`.
few_channels_p = Primitive("few_channels_conv")
#: ``weight_gradient_p.bind(x, ct, geometry=...)``: :func:`_weight_gradient`, bilinear.
weight_gradient_p = Primitive("few_channels_weight_gradient")


def _product(x: jax.Array, w: jax.Array, *, geometry: Geometry) -> jax.Array:
    return im2col_conv(x, w, geometry)


@few_channels_p.def_abstract_eval
def _product_shape(x: jax.core.ShapedArray, w: jax.core.ShapedArray, *, geometry: Geometry
                   ) -> jax.core.ShapedArray:
    shape = (x.shape[0], *out_sizes(x.shape[1:-1], geometry), w.shape[-1])
    return jax.core.ShapedArray(shape, x.dtype)


@weight_gradient_p.def_abstract_eval
def _weight_gradient_shape(x: jax.core.ShapedArray, ct: jax.core.ShapedArray, *,
                           geometry: Geometry) -> jax.core.ShapedArray:
    return jax.core.ShapedArray(_filter(x, ct.shape[-1], ct.dtype).shape, ct.dtype)


def input_gradient(ct: jax.Array, w: jax.Array, g: Geometry, x: Any) -> jax.Array:
    """im2col's transpose: the cotangent of the input ``x`` (an array or its aval)."""
    (dx,) = jax.linear_transpose(lambda x: im2col_conv(x, w, g),
                                 jax.ShapeDtypeStruct(x.shape, x.dtype))(ct)
    return dx


def _transpose_x(ct: jax.Array, x: ad.UndefinedPrimal, w: jax.Array, *, geometry: Geometry
                 ) -> jax.Array:
    return input_gradient(ct, w, geometry, x.aval)


def _transpose_w(ct: jax.Array, x: jax.Array, w: ad.UndefinedPrimal, *, geometry: Geometry
                 ) -> jax.Array:
    return weight_gradient_p.bind(x, ct, geometry=geometry).astype(w.aval.dtype)


def _gradient_transpose_x(dw: jax.Array, x: ad.UndefinedPrimal, ct: jax.Array, *,
                          geometry: Geometry) -> jax.Array:
    return _transpose_x(ct, x, dw, geometry=geometry)


def _gradient_transpose_ct(dw: jax.Array, x: jax.Array, ct: ad.UndefinedPrimal, *,
                           geometry: Geometry) -> jax.Array:
    return few_channels_p.bind(x, dw.astype(x.dtype), geometry=geometry)


few_channels_p.def_impl(_product)
weight_gradient_p.def_impl(_weight_gradient)
cpu_kernels.register_lowerings(few_channels_p, _product, "circle_jax_conv3x3_forward")
cpu_kernels.register_lowerings(weight_gradient_p, _weight_gradient,
                               "circle_jax_conv3x3_weight_gradient")
ad.defbilinear(few_channels_p, _transpose_x, _transpose_w)
ad.defbilinear(weight_gradient_p, _gradient_transpose_x, _gradient_transpose_ct)
batching.primitive_batchers[few_channels_p] = batch_convolution(few_channels_p, im2col_conv)
batching.primitive_batchers[weight_gradient_p] = batch_by_vmap(_weight_gradient)
