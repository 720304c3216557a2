"""Depthwise convolution as shifted slices times per-channel weights, summed ("shift").

No grouped convolution anywhere, forward or backward: XLA CPU's grouped convolution and
its gradient are the biggest performance trap of these models (benchmarks/README.md).

The weight gradient is one variadic reduction per layer (:func:`weight_gradient`): every
tap's product summed over the last spatial axis in one pass over the input and the output's
cotangent, then over the rest. Transposing the weight tangent as JAX does would give one
reduction per tap, each of which XLA CPU hands to YNNPACK after materializing its slice:
nine passes over the data and eighteen kernels to compile per layer. To choose the
transpose, the weight tangent is a primitive of its own, :data:`weight_product_p`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..ops.conv import Geometry, out_sizes
from ._taps import tangent_sum, taps


def shift_sum(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """sum_k slice_k(padded x) * wk[k] for x [N, *S, C], wk [K, C]: one elementwise fusion.

    Written in `jax.lax` primitives: ``jnp``'s arithmetic is a jitted call per operation,
    which a gradient's trace pays for at every tap of every layer."""
    dtype = jnp.result_type(x.dtype, wk.dtype)
    x, wk = x.astype(dtype), wk.astype(dtype)
    acc = None
    for k, t in enumerate(taps(x, g)):
        w = lax.broadcast_in_dim(lax.index_in_dim(wk, k, keepdims=False), t.shape,
                                 (t.ndim - 1,))
        term = lax.mul(t, w)
        acc = term if acc is None else lax.add(acc, term)
    return acc


def weight_gradient(x: jax.Array, ct: jax.Array, g: Geometry) -> jax.Array:
    """The cotangent of ``wk`` in :func:`shift_sum` for the output's cotangent ``ct``:
    [K, C] = per tap, sum over samples and positions of slice_k(padded x) * ct.

    One variadic reduction over the last spatial axis computes all K partial sums in one
    pass (XLA fuses the slices into it; no slice is materialized), then one plain sum over
    the samples and the other spatial axes. Half-precision inputs are accumulated in float32.
    """
    acc = jnp.promote_types(ct.dtype, jnp.float32)
    ct = ct.astype(acc)
    products = tuple(lax.mul(t.astype(acc), ct) for t in taps(x, g))
    rows = lax.reduce(products, tuple(jnp.zeros((), acc) for _ in products),
                      lambda a, b: tuple(map(lax.add, a, b)),
                      (x.ndim - 2,))
    return jnp.stack(rows).sum(axis=tuple(range(1, x.ndim - 1))).astype(ct.dtype)


#: ``weight_product_p.bind(x, wk, g=...)`` is :func:`shift_sum` (bilinear in ``x`` and
#: ``wk``); transposed w.r.t. ``wk`` it is :func:`weight_gradient`.
weight_product_p = Primitive("depthwise_weight_product")


def _product(x: jax.Array, wk: jax.Array, *, g: Geometry) -> jax.Array:
    return shift_sum(x, wk, g)


weight_product_p.def_impl(_product)


@weight_product_p.def_abstract_eval
def _abstract_eval(x: jax.core.ShapedArray, wk: jax.core.ShapedArray, *, g: Geometry
                   ) -> jax.core.ShapedArray:
    shape = (x.shape[0], *out_sizes(x.shape[1:-1], g), x.shape[-1])
    return jax.core.ShapedArray(shape, jnp.result_type(x.dtype, wk.dtype))


mlir.register_lowering(weight_product_p, mlir.lower_fun(_product, multiple_results=False))


def _transpose_x(ct: jax.Array, x: ad.UndefinedPrimal, wk: jax.Array, *, g: Geometry
                 ) -> jax.Array:
    return jax.linear_transpose(lambda u: shift_sum(u, wk, g), x.aval)(ct)[0]


def _transpose_wk(ct: jax.Array, x: jax.Array, wk: ad.UndefinedPrimal, *, g: Geometry
                  ) -> jax.Array:
    return weight_gradient(x, ct, g).astype(wk.aval.dtype)


def _batch(args: tuple, dims: tuple, *, g: Geometry) -> tuple[jax.Array, int]:
    """vmap: a mapped ``x`` with shared weights folds its mapped axis into the samples';
    mapped weights run :func:`shift_sum` under vmap."""
    (x, wk), (dx, dwk) = args, dims
    if dwk is not None:
        return jax.vmap(functools.partial(shift_sum, g=g), in_axes=(dx, dwk))(x, wk), 0
    x = jnp.moveaxis(x, dx, 0)
    y = weight_product_p.bind(x.reshape(-1, *x.shape[2:]), wk, g=g)
    return y.reshape(x.shape[0], -1, *y.shape[1:]), 0


ad.defbilinear(weight_product_p, _transpose_x, _transpose_wk)
batching.primitive_batchers[weight_product_p] = _batch


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def channelwise(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """Depthwise convolution with one weight per (tap, channel): x [N, *S, C], wk [K, C].

    The value is :func:`shift_sum`; the weight tangent is :data:`weight_product_p`, so the
    weight gradient is :func:`weight_gradient`. All AD modes and vmap work.
    """
    return shift_sum(x, wk, g)


@functools.partial(channelwise.defjvp, symbolic_zeros=True)
def _channelwise_jvp(g: Geometry, primals: tuple, tangents: tuple) -> tuple:
    x, wk = primals
    tx, twk = tangents
    y = shift_sum(x, wk, g)
    terms = []
    if not isinstance(tx, SymbolicZero):
        terms.append(shift_sum(tx, wk, g))
    if not isinstance(twk, SymbolicZero):
        terms.append(weight_product_p.bind(x, twk, g=g))
    return y, tangent_sum(terms, y)
