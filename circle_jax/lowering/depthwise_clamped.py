"""A 3x3 depthwise layer with its bias and clamping activation (RELU, RELU6, RELU_N1_TO_1)
as one primitive, so that each direction passes over the layer's activations once.

Unfused, a training step's depthwise layer is the convolution, a bias-and-clamp pass, and
backward the clamp's mask (a select), the bias gradient (a reduction), the weight gradient
and the input gradient: a pass over the activations each, in a step bound by that memory
traffic (MobileNet, benchmarks/README.md). Here:

- :data:`clamped_p` ``(x, wk, b)`` is ``bias_act(channelwise(x, wk), b, act)``: one kernel
  on the CPU (``circle_jax_depthwise_clamped_forward``).
- Its JVP is :data:`masked_p`, linear in the tangents: the convolution's and the bias'
  tangents where the output ``y`` is strictly inside the clamp's range (``y > 0`` for
  RELU), the rule of `circle_jax.ops.common.clip_tf` and ``jax.nn.relu``, read from ``y``
  as theirs is, so ``y`` is the layer's only residual besides ``x``.
- :data:`masked_p`'s transpose computes the masked cotangent with the weight and bias
  gradients in one pass (:data:`masked_gradient_p`, ``circle_jax_depthwise_masked_gradient``
  on the CPU), then the input gradient from the masked cotangent
  (`circle_jax.lowering.depthwise.input_gradient`, XLA).

Every primitive's value is its reference, the unfused composition, which is also its
lowering wherever the kernels do not apply, its JVP and its vmap rule: the kernels change
the number of passes and float32 summation order, nothing else.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..graph import ir
from ..ops.conv import Geometry, bias_act
from . import cpu_kernels
from ._taps import batch_by_vmap, tangent_sum
from .depthwise import channelwise_p, input_gradient, weight_gradient_p

#: The clamping activations fused, by code: the range [lo, hi] they clamp to.
CLAMPS = {ir.ACT_RELU: (0.0, math.inf), ir.ACT_RELU6: (0.0, 6.0),
          ir.ACT_RELU_N1_TO_1: (-1.0, 1.0)}


def applies(x: Any, wk: Any, b: Any, g: Geometry, act: int | None) -> bool:
    """Whether the layer ``bias_act(channelwise(x, wk), b, act)`` is a :func:`layer`: a
    clamping activation, a bias of one float32 value per channel, float32 ``x`` [N, H, W, C]
    and ``wk`` [9, C] in a geometry the CPU kernels take."""
    return (act in CLAMPS and b is not None and cpu_kernels.kernel_geometry(x, g)
            and tuple(wk.shape) == (9, x.shape[-1]) and tuple(np.shape(b)) == (x.shape[-1],)
            and all(jnp.result_type(v) == np.float32 for v in (x, wk, b)))


# Jitted so that eager (op-by-op) execution compiles the layer once (inside an outer jit it
# is simply inlined).
@functools.partial(jax.jit, static_argnums=(3, 4))
def layer(x: jax.Array, wk: jax.Array, b: jax.Array, g: Geometry, act: int) -> jax.Array:
    """``bias_act(channelwise(x, wk, g), b, act)`` as :data:`clamped_p` (see :func:`applies`)."""
    return clamped_p.bind(x, wk, b, geometry=g, act=act)


def inside(y: jax.Array, act: int) -> jax.Array:
    """Where the clamp ``act`` passes the gradient: ``lo < y < hi`` (``y > 0`` for RELU)."""
    lo, hi = CLAMPS[act]
    above = lax.gt(y, lax.full_like(y, lo))
    return above if hi == math.inf else lax.bitwise_and(above, lax.lt(y, lax.full_like(y, hi)))


def _masked(mask: jax.Array, t: jax.Array) -> jax.Array:
    return lax.select(mask, t, lax.full_like(t, 0))


def _attributes(act: int, **_: Any) -> dict[str, np.float32]:
    lo, hi = CLAMPS[act]
    return {"lo": np.float32(lo), "hi": np.float32(hi)}


def _jvp_by_reference(fn: Callable[..., Any], multiple_results: bool = False
                      ) -> Callable[..., tuple[Any, Any]]:
    """The JVP rule of a primitive computing ``fn(*args, **params)``: ``fn``'s own."""
    def rule(primals: Sequence[Any], tangents: Sequence[Any], **params: Any
             ) -> tuple[Any, Any]:
        out, t = jax.jvp(functools.partial(fn, **params), tuple(primals),
                         tuple(map(ad.instantiate_zeros, tangents)))
        return (list(out), list(t)) if multiple_results else (out, t)

    return rule


# ------------------------------------------------------------------------ the forward layer

#: ``clamped_p.bind(x, wk, b, geometry=g, act=code)``: the layer's output ``y``.
clamped_p = Primitive("depthwise_clamped")


def _layer(x: jax.Array, wk: jax.Array, b: jax.Array, *, geometry: Geometry, act: int
           ) -> jax.Array:
    return bias_act(channelwise_p.bind(x, wk, geometry=geometry), b, act)


@clamped_p.def_abstract_eval
def _layer_shape(x: jax.core.ShapedArray, wk: jax.core.ShapedArray, b: jax.core.ShapedArray,
                 *, geometry: Geometry, act: int) -> jax.core.ShapedArray:
    return channelwise_p.abstract_eval(x, wk, geometry=geometry)[0]


def _layer_jvp(primals: Sequence[jax.Array], tangents: Sequence[Any], *, geometry: Geometry,
               act: int) -> tuple[jax.Array, jax.Array]:
    y = clamped_p.bind(*primals, geometry=geometry, act=act)
    which = tuple(type(t) is not ad.Zero for t in tangents)
    given = [t for t, w in zip(tangents, which, strict=True) if w]
    if not given:
        return y, lax.full_like(y, 0)
    return y, masked_p.bind(y, *primals[:2], *given, geometry=geometry, act=act, which=which)


clamped_p.def_impl(_layer)
cpu_kernels.register_lowerings(clamped_p, _layer, "circle_jax_depthwise_clamped_forward",
                               attributes=_attributes)
ad.primitive_jvps[clamped_p] = _layer_jvp
batching.primitive_batchers[clamped_p] = batch_by_vmap(_layer)


# ------------------------------------------------------------------------- its tangent map

#: ``masked_p.bind(y, x, wk, *tangents, geometry=g, act=code, which=(tx, twk, tb))``: the
#: layer's tangent, linear in ``tangents`` (those of x, wk and b that ``which`` marks given).
masked_p = Primitive("depthwise_clamped_tangent")


def _tangent(y: jax.Array, x: jax.Array, wk: jax.Array, *tangents: jax.Array,
             geometry: Geometry, act: int, which: tuple[bool, bool, bool]) -> jax.Array:
    given = iter(tangents)
    tx, twk, tb = (next(given) if w else None for w in which)
    terms = []
    if tx is not None:
        terms.append(channelwise_p.bind(tx, wk, geometry=geometry))
    if twk is not None:
        terms.append(channelwise_p.bind(x, twk, geometry=geometry))
    if tb is not None:
        terms.append(lax.broadcast_in_dim(tb, y.shape, (y.ndim - 1,)))
    return _masked(inside(y, act), tangent_sum(terms, y))


def _tangent_transpose(ct: Any, y: jax.Array, x: jax.Array, wk: jax.Array, *tangents: Any,
                       geometry: Geometry, act: int, which: tuple[bool, bool, bool]
                       ) -> list[Any]:
    if any(ad.is_undefined_primal(v) for v in (y, x, wk)):
        raise NotImplementedError("the depthwise layer's tangent is linear in its tangents only")
    wanted = iter(ad.is_undefined_primal(t) for t in tangents)
    want_x, want_wk, want_b = (w and next(wanted) for w in which)
    ct = ad.instantiate_zeros(ct)
    if want_wk or want_b:
        g, dwb = masked_gradient_p.bind(x, y, ct, geometry=geometry, act=act)
    else:
        g, dwb = _masked(inside(y, act), ct), None
    cts = {0: input_gradient(g, wk, geometry, x.shape[1:-1]) if want_x else None,
           1: dwb[:9].astype(wk.dtype) if want_wk else None,
           2: dwb[9].astype(wk.dtype) if want_b else None}
    return [None, None, None, *(cts[i] for i, w in enumerate(which) if w)]


@masked_p.def_abstract_eval
def _tangent_shape(y: jax.core.ShapedArray, *args: Any, **params: Any) -> jax.core.ShapedArray:
    return jax.core.ShapedArray(y.shape, y.dtype)


masked_p.def_impl(_tangent)
mlir.register_lowering(masked_p, mlir.lower_fun(_tangent, multiple_results=False))
ad.primitive_jvps[masked_p] = _jvp_by_reference(_tangent)
ad.primitive_transposes[masked_p] = _tangent_transpose
batching.primitive_batchers[masked_p] = batch_by_vmap(_tangent)


# ------------------------------------------------------------- the backward pass in one go

#: ``masked_gradient_p.bind(x, y, ct, geometry=g, act=code)``: ``(g, dwb)``, the cotangent
#: ``ct`` of ``y`` masked by the clamp (the convolution's output cotangent) and ``dwb``
#: [10, C]: the weight gradient's nine taps, then the bias gradient.
masked_gradient_p = Primitive("depthwise_masked_gradient")
masked_gradient_p.multiple_results = True


def _masked_gradient(x: jax.Array, y: jax.Array, ct: jax.Array, *, geometry: Geometry,
                     act: int) -> tuple[jax.Array, jax.Array]:
    g = _masked(inside(y, act), ct)
    dwk = weight_gradient_p.bind(x, g, geometry=geometry)
    db = lax.reduce(g, np.zeros((), g.dtype), lax.add, (0, 1, 2)).astype(dwk.dtype)
    return g, lax.concatenate([dwk, lax.broadcast_in_dim(db, (1, db.shape[0]), (1,))], 0)


@masked_gradient_p.def_abstract_eval
def _masked_gradient_shape(x: jax.core.ShapedArray, y: jax.core.ShapedArray,
                           ct: jax.core.ShapedArray, *, geometry: Geometry, act: int
                           ) -> list[jax.core.ShapedArray]:
    dwk = weight_gradient_p.abstract_eval(x, ct, geometry=geometry)[0]
    return [jax.core.ShapedArray(ct.shape, ct.dtype),
            jax.core.ShapedArray((dwk.shape[0] + 1, dwk.shape[1]), dwk.dtype)]


masked_gradient_p.def_impl(_masked_gradient)
cpu_kernels.register_lowerings(masked_gradient_p, _masked_gradient,
                               "circle_jax_depthwise_masked_gradient", attributes=_attributes)
ad.primitive_jvps[masked_gradient_p] = _jvp_by_reference(_masked_gradient, True)
batching.primitive_batchers[masked_gradient_p] = batch_by_vmap(_masked_gradient, True)
