"""Depthwise convolution as shifted slices times per-channel weights, summed ("shift").

No grouped convolution anywhere, forward or backward: XLA CPU's grouped convolution and
its gradient are the biggest performance trap of these models (benchmarks/README.md).

The weight gradient is one variadic reduction per layer (:func:`weight_gradient`): every
tap's product summed over the last spatial axis in one pass over the input and the output's
cotangent, then over the rest. Transposing the weight tangent as JAX does would give one
reduction per tap, each of which XLA CPU hands to YNNPACK after materializing its slice:
nine passes over the data and eighteen kernels to compile per layer. To choose that
transpose, the convolution is a primitive of its own, :data:`channelwise_p`; a gradient's
trace then holds one primitive per layer where the taps' slices, products and sums were
dozens (the trace's size and compile time: benchmarks/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from ..ops.conv import Geometry, out_sizes
from . import cpu_kernels
from ._taps import batch_by_vmap, batch_convolution, offsets, tap_bounds, taps


def shift_sum(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """sum_k slice_k(padded x) * wk[k] for x [N, *S, C], wk [K, C]: one elementwise fusion.

    Written in `jax.lax` primitives: ``jnp``'s arithmetic is a jitted call per operation,
    which a gradient's trace pays for at every tap of every layer."""
    dtype = jnp.result_type(x.dtype, wk.dtype)
    x, wk = x.astype(dtype), wk.astype(dtype)
    acc = None
    for k, t in enumerate(taps(x, g)):
        term = lax.mul(t, _tap_weights(wk, k, t.shape))
        acc = term if acc is None else lax.add(acc, term)
    return acc


def _tap_weights(wk: jax.Array, k: int, shape: Sequence[int]) -> jax.Array:
    """Tap ``k``'s per-channel weights ``wk[k]`` broadcast to a [N, *S, C] ``shape``."""
    return lax.broadcast_in_dim(lax.index_in_dim(wk, k, keepdims=False), shape,
                                (len(shape) - 1,))


def weight_gradient(x: jax.Array, ct: jax.Array, g: Geometry) -> jax.Array:
    """The cotangent of ``wk`` in :func:`shift_sum` for the output's cotangent ``ct``:
    [K, C] = per tap, sum over samples and positions of slice_k(padded x) * ct.

    One variadic reduction over the last spatial axis computes all K partial sums in one
    pass (XLA fuses the slices into it; no slice is materialized), then one plain sum over
    the samples and the other spatial axes. Half-precision inputs are accumulated, and
    returned, in float32.
    """
    acc = jnp.promote_types(ct.dtype, jnp.float32)
    ct = ct.astype(acc)
    products = tuple(lax.mul(t.astype(acc), ct) for t in taps(x, g))
    rows = lax.reduce(products, tuple(jnp.zeros((), acc) for _ in products),
                      lambda a, b: tuple(map(lax.add, a, b)),
                      (x.ndim - 2,))
    return jnp.stack(rows).sum(axis=tuple(range(1, x.ndim - 1))).astype(ct.dtype)


#: ``channelwise_p.bind(x, wk, geometry=...)`` is :func:`shift_sum` (bilinear in ``x`` and
#: ``wk``); transposed w.r.t. ``wk`` it is :func:`weight_gradient`.
channelwise_p = Primitive("depthwise_channelwise")


def _product(x: jax.Array, wk: jax.Array, *, geometry: Geometry) -> jax.Array:
    return shift_sum(x, wk, geometry)


channelwise_p.def_impl(_product)


@channelwise_p.def_abstract_eval
def _abstract_eval(x: jax.core.ShapedArray, wk: jax.core.ShapedArray, *, geometry: Geometry
                   ) -> jax.core.ShapedArray:
    shape = (x.shape[0], *out_sizes(x.shape[1:-1], geometry), x.shape[-1])
    return jax.core.ShapedArray(shape, jnp.result_type(x.dtype, wk.dtype))


cpu_kernels.register_lowerings(channelwise_p, _product, "circle_jax_depthwise_forward")


def input_gradient(ct: jax.Array, wk: jax.Array, g: Geometry, sizes: Sequence[int]
                   ) -> jax.Array:
    """The cotangent of ``x`` (spatial ``sizes``) in :func:`shift_sum` for the output's
    cotangent ``ct``: sum over taps of ``ct * wk[k]`` placed back where the tap read it.

    Each tap's placement is one ``lax.pad``: the strided slice's transpose (``interior``
    stride - 1) and the input padding's (negative edges crop it) in one operation. Written
    out rather than left to ``jax.linear_transpose``, which traces :func:`shift_sum` again
    for every layer of every gradient.

    ``ct`` passes an optimization barrier, so it is computed once: XLA would otherwise fuse
    its producer (typically an activation's mask, recomputed from this layer's forward
    taps) into every tap's term, K times per element."""
    out = ct.shape[1:-1]
    ct, wk = lax.optimization_barrier(ct), wk.astype(ct.dtype)
    zero = jnp.zeros((), ct.dtype)
    acc = None
    for k, offset in enumerate(offsets(g.kernel)):
        start, limit = tap_bounds(offset, g, out)
        edges = [(b - lo, n + lo - e, s - 1) for b, e, (lo, _), n, s in
                 zip(start, limit, g.pads, sizes, g.strides, strict=True)]
        term = lax.pad(lax.mul(ct, _tap_weights(wk, k, ct.shape)), zero,
                       [(0, 0, 0), *edges, (0, 0, 0)])
        acc = term if acc is None else lax.add(acc, term)
    return acc


def input_cotangent(ct: jax.Array, wk: jax.Array, g: Geometry, x: Any) -> jax.Array:
    """:func:`input_gradient` for the input ``x`` (an array or its aval), in its dtype."""
    return input_gradient(ct, wk, g, x.shape[1:-1]).astype(x.dtype)


def _transpose_x(ct: jax.Array, x: ad.UndefinedPrimal, wk: jax.Array, *, geometry: Geometry
                 ) -> jax.Array:
    return input_cotangent(ct, wk, geometry, x.aval)


def _transpose_wk(ct: jax.Array, x: jax.Array, wk: ad.UndefinedPrimal, *, geometry: Geometry
                  ) -> jax.Array:
    return weight_gradient_p.bind(x, ct, geometry=geometry).astype(wk.aval.dtype)


#: ``weight_gradient_p.bind(x, ct, geometry=...)`` is :func:`weight_gradient`, bilinear in
#: ``x`` and ``ct``: a primitive so that the CPU lowers it to its kernel.
weight_gradient_p = Primitive("depthwise_weight_gradient")


def _weight_gradient(x: jax.Array, ct: jax.Array, *, geometry: Geometry) -> jax.Array:
    return weight_gradient(x, ct, geometry)


weight_gradient_p.def_impl(_weight_gradient)


@weight_gradient_p.def_abstract_eval
def _weight_gradient_shape(x: jax.core.ShapedArray, ct: jax.core.ShapedArray, *,
                           geometry: Geometry) -> jax.core.ShapedArray:
    return jax.core.ShapedArray((math.prod(geometry.kernel), x.shape[-1]),
                                jnp.promote_types(ct.dtype, jnp.float32))


def _weight_gradient_transpose_x(dw: jax.Array, x: ad.UndefinedPrimal, ct: jax.Array, *,
                                 geometry: Geometry) -> jax.Array:
    return input_cotangent(ct, dw, geometry, x.aval)


def _weight_gradient_transpose_ct(dw: jax.Array, x: jax.Array, ct: ad.UndefinedPrimal, *,
                                  geometry: Geometry) -> jax.Array:
    return channelwise_p.bind(x, dw.astype(x.dtype), geometry=geometry).astype(ct.aval.dtype)


cpu_kernels.register_lowerings(weight_gradient_p, _weight_gradient,
                               "circle_jax_depthwise_weight_gradient")
ad.defbilinear(weight_gradient_p, _weight_gradient_transpose_x, _weight_gradient_transpose_ct)
batching.primitive_batchers[weight_gradient_p] = batch_by_vmap(_weight_gradient)


ad.defbilinear(channelwise_p, _transpose_x, _transpose_wk)
batching.primitive_batchers[channelwise_p] = batch_convolution(channelwise_p, shift_sum)


def channelwise(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """Depthwise convolution with one weight per (tap, channel): x [N, *S, C], wk [K, C].

    The value is :func:`shift_sum`, as one primitive (:data:`channelwise_p`) whose
    transposes are chosen: w.r.t. ``x`` :func:`input_gradient`, w.r.t. ``wk``
    :func:`weight_gradient`. All AD modes and vmap work.
    """
    return channelwise_p.bind(x, wk, geometry=g)
