"""Gradients of 2-D pooling (NHWC), as the vector-Jacobian products of the forward pooling of
:mod:`circle_jax.ops.pooling`, so exact by construction:

- ``MaxPoolGrad(orig_input, orig_output, grad)`` (attrs ``ksize``, ``strides``, ``padding``
  SAME / VALID / EXPLICIT): each window's gradient goes to the FIRST maximum of the window
  of ``orig_input`` in row-major order (TF's CPU kernel; XLA's select-and-scatter does the
  same), padding never wins; ``orig_output`` only fixes the shape;
- ``MaxPoolGradV2(orig_input, orig_output, grad, ksize, strides)``: the same with ``ksize``
  and ``strides`` as (static) inputs;
- ``AvgPoolGrad(orig_input_shape, grad)`` (static shape; SAME / VALID): each window's
  gradient divided by the number of its non-padded elements, spread over them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from circle_jax.errors import CircleFormatError

from ..pooling import Window, out_size, window_max, window_mean
from . import attrs as A
from .registry import flex_kernel


def _window(op: str, attrs: dict, shape: tuple[int, ...], grad: Any) -> Window:
    A.nhwc(op, attrs)
    kernel, strides = A.spatial(op, attrs, "ksize"), A.spatial(op, attrs, "strides")
    sizes = (shape[1], shape[2])
    pads = A.pads(op, attrs, sizes, kernel, strides)
    want = (shape[0], *(out_size(n, k, s, p) for n, k, s, p in zip(sizes, kernel, strides,
                                                                     pads)), shape[3])
    if tuple(grad.shape) != want:
        raise CircleFormatError(f"Flex {op}: grad has shape {list(grad.shape)}, the pooling "
                                f"of {list(shape)} gives {list(want)}")
    return kernel, strides, pads


@flex_kernel("MaxPoolGrad")
def max_pool_grad(attrs: dict, orig_input: jax.Array, orig_output: Any,
                  grad: jax.Array) -> jax.Array:
    window = _window("MaxPoolGrad", attrs, tuple(orig_input.shape), grad)
    _, vjp = jax.vjp(lambda x: window_max(x, window), orig_input)
    return vjp(jnp.asarray(grad, orig_input.dtype))[0]


@flex_kernel("AvgPoolGrad", static_inputs=(0,))
def avg_pool_grad(attrs: dict, orig_input_shape: Any, grad: jax.Array) -> jax.Array:
    shape = A.shape_input("AvgPoolGrad", orig_input_shape, "orig_input_shape")
    window = _window("AvgPoolGrad", attrs, shape, grad)
    _, vjp = jax.vjp(lambda x: window_mean(x, window), jnp.zeros(shape, grad.dtype))
    return vjp(grad)[0]


@flex_kernel("MaxPoolGradV2", static_inputs=(3, 4))
def max_pool_grad_v2(attrs: dict, orig_input: jax.Array, orig_output: Any, grad: jax.Array,
                     ksize: Any, strides: Any) -> jax.Array:
    window = {"ksize": list(A.shape_input("MaxPoolGradV2", ksize, "ksize")),
              "strides": list(A.shape_input("MaxPoolGradV2", strides, "strides"))}
    return max_pool_grad({**attrs, **window}, orig_input, orig_output, grad)
