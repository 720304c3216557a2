"""Gradients of 2-D convolutions (NHWC, filters HWIO) and of a bias, as the vector-Jacobian
products of the forward convolution (:func:`circle_jax.ops.conv.conv`, computed at full
float32 precision), so exact by construction:

- ``Conv2DBackpropInput(input_sizes, filter, out_backprop)``,
  ``Conv2DBackpropFilter(input, filter_sizes, out_backprop)``: of ``Conv2D`` (attrs
  ``strides``, ``dilations``, ``padding`` SAME / VALID / EXPLICIT; a filter with fewer input
  channels than the input is a grouped convolution, as in TF);
- ``DepthwiseConv2dNativeBackpropInput(input_sizes, filter, out_backprop)``,
  ``DepthwiseConv2dNativeBackpropFilter(input, filter_sizes, out_backprop)``: of
  ``DepthwiseConv2dNative``, filter [H, W, C, M], output channel ``c * M + m``, WITHOUT
  dilation whatever ``dilations`` says: TF's CPU kernels of these two ops (the ones a Flex
  delegate runs) ignore it. Measured with TF 2.21, ``dilations`` [1, 2, 2, 1], SAME: their
  results equal those of [1, 1, 1, 1], not the gradient of the dilated forward (TF's own
  ``tf.nn.depthwise_conv2d`` differentiates a dilated convolution through SpaceToBatchND
  instead, so its graphs do not meet this);
- ``BiasAddGrad(out_backprop)``: the sum over every dimension but the last (NHWC).

The sizes inputs are static. ``out_backprop`` must have the forward output's shape.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from circle_jax.errors import CircleFormatError

from ..conv import Geometry, out_sizes
from . import attrs as A
from .registry import flex_kernel


def _forward(op: str, attrs: dict, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
             depthwise: bool, dy: Any):
    """The forward convolution ``f(x, w)`` the op differentiates (``w`` in the op's filter
    layout), after checking ``dy`` has its output's shape."""
    A.nhwc(op, attrs)
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise CircleFormatError(f"Flex {op}: input {list(x_shape)} and filter "
                                f"{list(w_shape)} must be 4-D (NHWC, HWIO)")
    strides = A.spatial(op, attrs, "strides")
    # TF's CPU kernels of the depthwise gradients ignore dilations (see the docstring)
    dilations = (1, 1) if depthwise else A.spatial(op, attrs, "dilations", default=1)
    kernel = (w_shape[0], w_shape[1])
    g = Geometry(kernel, strides, dilations,
                 A.pads(op, attrs, (x_shape[1], x_shape[2]), kernel, strides, dilations))
    channels = x_shape[3]
    if depthwise:
        groups, out_channels = channels, w_shape[2] * w_shape[3]
        ok = w_shape[2] == channels
    else:
        groups = channels // w_shape[2] if w_shape[2] else 0
        out_channels = w_shape[3]
        ok = groups > 0 and groups * w_shape[2] == channels and out_channels % groups == 0
    if not ok:
        raise CircleFormatError(f"Flex {op}: a filter of shape {list(w_shape)} does not fit "
                                f"an input of {channels} channels")
    try:
        want = (x_shape[0], *out_sizes(x_shape[1:3], g), out_channels)
    except ValueError as e:
        raise CircleFormatError(f"Flex {op}: {e}") from None
    if tuple(dy.shape) != want:
        raise CircleFormatError(f"Flex {op}: out_backprop has shape {list(dy.shape)}, the "
                                f"convolution gives {list(want)}")

    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        if depthwise:
            w = w.reshape(*kernel, 1, out_channels)
        return lax.conv_general_dilated(
            x, w, g.strides, g.pads, rhs_dilation=g.dilations,
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
            precision=lax.Precision.HIGHEST)

    return f


def _backprop_input(op: str, depthwise: bool):
    def kernel(attrs: dict, input_sizes: Any, w: jax.Array, dy: jax.Array) -> jax.Array:
        shape = A.shape_input(op, input_sizes, "input_sizes")
        f = _forward(op, attrs, shape, tuple(w.shape), depthwise, dy)
        _, vjp = jax.vjp(lambda x: f(x, w), jnp.zeros(shape, dy.dtype))
        return vjp(dy)[0]

    kernel.__doc__ = f"TF's {op}: the gradient of its convolution w.r.t. the input."
    return kernel


def _backprop_filter(op: str, depthwise: bool):
    def kernel(attrs: dict, x: jax.Array, filter_sizes: Any, dy: jax.Array) -> jax.Array:
        shape = A.shape_input(op, filter_sizes, "filter_sizes")
        f = _forward(op, attrs, tuple(x.shape), shape, depthwise, dy)
        _, vjp = jax.vjp(lambda w: f(x, w), jnp.zeros(shape, dy.dtype))
        return vjp(dy)[0]

    kernel.__doc__ = f"TF's {op}: the gradient of its convolution w.r.t. the filter."
    return kernel


for _op, _depthwise in (("Conv2D", False), ("DepthwiseConv2dNative", True)):
    flex_kernel(f"{_op}BackpropInput", static_inputs=(0,))(
        _backprop_input(f"{_op}BackpropInput", _depthwise))
    flex_kernel(f"{_op}BackpropFilter", static_inputs=(1,))(
        _backprop_filter(f"{_op}BackpropFilter", _depthwise))


@flex_kernel("BiasAddGrad")
def bias_add_grad(attrs: dict, out_backprop: jax.Array) -> jax.Array:
    A.nhwc("BiasAddGrad", attrs)
    return jnp.sum(out_backprop, axis=tuple(range(out_backprop.ndim - 1)))
