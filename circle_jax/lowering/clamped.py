"""A 3x3 convolution layer with its bias and clamping activation (RELU, RELU6,
RELU_N1_TO_1) as one primitive, so that each direction passes over the layer's activations
once: the depthwise layer (:data:`DEPTHWISE`) and the first layer of few input channels
(:data:`FEW_CHANNELS`).

Unfused, a training step's layer is the convolution, a bias-and-clamp pass, and backward
the clamp's mask (a select), the bias gradient (a reduction), the weight gradient and the
input gradient: a pass over the activations each, in a step bound by that memory traffic
(MobileNet, benchmarks/README.md). XLA also fuses the mask into the consumer of the input
gradient of the layer after it, which made the first depthwise layer's input gradient six
times slower (measured there). Here, per :class:`ClampedLayer`:

- ``clamped_p`` ``(x, w, b)`` is ``bias_act(conv(x, w), b, act)``: one kernel on the CPU.
- Its JVP is ``masked_p``, linear in the tangents: the convolution's and the bias' tangents
  where the output ``y`` is strictly inside the clamp's range (``y > 0`` for RELU), the
  rule of `circle_jax.ops.common.clip_tf` and ``jax.nn.relu``, read from ``y`` as theirs
  is, so ``y`` is the layer's only residual besides ``x``.
- ``masked_p``'s transpose computes the masked cotangent with the weight and bias
  gradients in one pass (``masked_gradient_p``, one kernel on the CPU), then the input
  gradient from the masked cotangent where the input needs one (XLA).

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
from . import cpu_kernels, depthwise, few_channels
from ._taps import batch_by_vmap, tangent_sum

#: The clamping activations fused, by code: the range [lo, hi] they clamp to.
CLAMPS = {ir.ACT_RELU: (0.0, math.inf), ir.ACT_RELU6: (0.0, 6.0),
          ir.ACT_RELU_N1_TO_1: (-1.0, 1.0)}


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


class ClampedLayer:
    """The primitives of one convolution family's clamped layer (see the module docstring).

    ``conv``: the family's convolution primitive, ``bind(x, w, geometry=g)``;
    ``weight_gradient``: its weight gradient, ``bind(x, ct, geometry=g)``, shaped as ``w``;
    ``input_gradient(ct, w, g, x_aval)``: the input's cotangent; ``kernels``: the CPU
    kernels' targets, (forward, masked gradient). The masked gradient's second result is
    the weight gradient as [K, O] (``O``: the output channels) with the bias gradient as
    one more row.
    """

    def __init__(self, name: str, conv: Primitive, weight_gradient: Primitive,
                 input_gradient: Callable[..., jax.Array], kernels: tuple[str, str]) -> None:
        self.conv = conv
        self.weight_gradient = weight_gradient
        self.input_gradient = input_gradient
        self.clamped_p = Primitive(f"{name}_clamped")
        self.masked_p = Primitive(f"{name}_clamped_tangent")
        self.masked_gradient_p = Primitive(f"{name}_masked_gradient")
        self.masked_gradient_p.multiple_results = True
        self.call = jax.jit(self._bind, static_argnums=(3, 4))

        p = self.clamped_p
        p.def_impl(self._layer)
        p.def_abstract_eval(lambda x, w, b, *, geometry, act:
                            conv.abstract_eval(x, w, geometry=geometry)[0])
        cpu_kernels.register_lowerings(p, self._layer, kernels[0], attributes=_attributes)
        ad.primitive_jvps[p] = self._layer_jvp
        batching.primitive_batchers[p] = batch_by_vmap(self._layer)

        p = self.masked_p
        p.def_impl(self._tangent)
        p.def_abstract_eval(lambda y, *args, **params: jax.core.ShapedArray(y.shape, y.dtype))
        mlir.register_lowering(p, mlir.lower_fun(self._tangent, multiple_results=False))
        ad.primitive_jvps[p] = _jvp_by_reference(self._tangent)
        ad.primitive_transposes[p] = self._tangent_transpose
        batching.primitive_batchers[p] = batch_by_vmap(self._tangent)

        p = self.masked_gradient_p
        p.def_impl(self._masked_gradient)
        p.def_abstract_eval(self._masked_gradient_shape)
        cpu_kernels.register_lowerings(p, self._masked_gradient, kernels[1],
                                       attributes=_attributes)
        ad.primitive_jvps[p] = _jvp_by_reference(self._masked_gradient, True)
        batching.primitive_batchers[p] = batch_by_vmap(self._masked_gradient, True)

    def __call__(self, x: jax.Array, w: jax.Array, b: jax.Array, g: Geometry, act: int
                 ) -> jax.Array:
        """``bias_act(conv(x, w, g), b, act)`` as one primitive (see :func:`applies`); jitted,
        so that eager execution compiles the layer once."""
        return self.call(x, w, b, g, act)

    def _bind(self, x: jax.Array, w: jax.Array, b: jax.Array, g: Geometry, act: int
              ) -> jax.Array:
        return self.clamped_p.bind(x, w, b, geometry=g, act=act)

    # the forward layer: y = clamped_p(x, w, b)
    def _layer(self, x: jax.Array, w: jax.Array, b: jax.Array, *, geometry: Geometry,
               act: int) -> jax.Array:
        return bias_act(self.conv.bind(x, w, geometry=geometry), b, act)

    def _layer_jvp(self, primals: Sequence[jax.Array], tangents: Sequence[Any], *,
                   geometry: Geometry, act: int) -> tuple[jax.Array, jax.Array]:
        y = self.clamped_p.bind(*primals, geometry=geometry, act=act)
        which = tuple(type(t) is not ad.Zero for t in tangents)
        given = [t for t, w in zip(tangents, which, strict=True) if w]
        if not given:
            return y, lax.full_like(y, 0)
        return y, self.masked_p.bind(y, *primals[:2], *given, geometry=geometry, act=act,
                                     which=which)

    # its tangent map: masked_p(y, x, w, *tangents), linear in the tangents of x, w and b
    # that ``which`` marks given
    def _tangent(self, y: jax.Array, x: jax.Array, w: jax.Array, *tangents: jax.Array,
                 geometry: Geometry, act: int, which: tuple[bool, bool, bool]) -> jax.Array:
        given = iter(tangents)
        tx, tw, tb = (next(given) if used else None for used in which)
        terms = []
        if tx is not None:
            terms.append(self.conv.bind(tx, w, geometry=geometry))
        if tw is not None:
            terms.append(self.conv.bind(x, tw, geometry=geometry))
        if tb is not None:
            terms.append(lax.broadcast_in_dim(tb, y.shape, (y.ndim - 1,)))
        return _masked(inside(y, act), tangent_sum(terms, y))

    def _tangent_transpose(self, ct: Any, y: jax.Array, x: jax.Array, w: jax.Array,
                           *tangents: Any, geometry: Geometry, act: int,
                           which: tuple[bool, bool, bool]) -> list[Any]:
        if any(ad.is_undefined_primal(v) for v in (y, x, w)):
            raise NotImplementedError("a clamped layer's tangent is linear in its tangents only")
        wanted = iter(ad.is_undefined_primal(t) for t in tangents)
        want_x, want_w, want_b = (used and next(wanted) for used in which)
        ct = ad.instantiate_zeros(ct)
        if want_w or want_b:
            g, dwb = self.masked_gradient_p.bind(x, y, ct, geometry=geometry, act=act,
                                                 keep=bool(want_x))
        else:
            g, dwb = _masked(inside(y, act), ct), None
        cts = {0: self.input_gradient(g, w, geometry, x) if want_x else None,
               1: dwb[:-1].reshape(w.shape).astype(w.dtype) if want_w else None,
               2: dwb[-1].astype(w.dtype) if want_b else None}
        return [None, None, None, *(cts[i] for i, used in enumerate(which) if used)]

    # the backward pass in one go: (g, dwb) = masked_gradient_p(x, y, ct), g the cotangent
    # masked by the clamp (empty unless ``keep``), dwb [K + 1, O] the weight gradient's rows
    # and the bias gradient
    def _masked_gradient(self, x: jax.Array, y: jax.Array, ct: jax.Array, *,
                         geometry: Geometry, act: int, keep: bool
                         ) -> tuple[jax.Array, jax.Array]:
        g = _masked(inside(y, act), ct)
        dw = self.weight_gradient.bind(x, g, geometry=geometry)
        dw = dw.reshape(-1, dw.shape[-1])
        db = lax.reduce(g, np.zeros((), g.dtype), lax.add, tuple(range(g.ndim - 1)))
        dwb = lax.concatenate([dw, lax.broadcast_in_dim(db.astype(dw.dtype),
                                                        (1, db.shape[0]), (1,))], 0)
        return (g if keep else jnp.zeros((0,), g.dtype)), dwb

    def _masked_gradient_shape(self, x: jax.core.ShapedArray, y: jax.core.ShapedArray,
                               ct: jax.core.ShapedArray, *, geometry: Geometry, act: int,
                               keep: bool) -> list[jax.core.ShapedArray]:
        dw = self.weight_gradient.abstract_eval(x, ct, geometry=geometry)[0]
        rows = math.prod(dw.shape[:-1]) + 1
        return [jax.core.ShapedArray(ct.shape if keep else (0,), ct.dtype),
                jax.core.ShapedArray((rows, dw.shape[-1]), dw.dtype)]


#: The depthwise layer: ``DEPTHWISE(x, wk, b, g, act)`` with ``wk`` [9, C].
DEPTHWISE = ClampedLayer("depthwise", depthwise.channelwise_p, depthwise.weight_gradient_p,
                         depthwise.input_cotangent,
                         ("circle_jax_depthwise_clamped_forward",
                          "circle_jax_depthwise_masked_gradient"))

#: The first layer of few input channels: ``FEW_CHANNELS(x, w, b, g, act)``, w [3, 3, I, O].
FEW_CHANNELS = ClampedLayer("few_channels", few_channels.few_channels_p,
                            few_channels.weight_gradient_p, few_channels.input_gradient,
                            ("circle_jax_conv3x3_clamped_forward",
                             "circle_jax_conv3x3_masked_gradient"))


def applies(x: Any, w: Any, b: Any, g: Geometry, act: int | None) -> bool:
    """Whether ``bias_act(conv(x, w, g), b, act)`` of a family's convolution (which the
    caller has chosen) is its :class:`ClampedLayer`: a clamping activation, a bias of one
    value per output channel, and ``x``, ``w`` and ``b`` the CPU kernels take
    (`cpu_kernels.attributes_3x3`)."""
    return (act in CLAMPS and b is not None and tuple(np.shape(b)) == (w.shape[-1],)
            and cpu_kernels.attributes_3x3(x, w, b, geometry=g) is not None)
