"""Gradients of activations, as TF defines them (``features`` the forward input, ``outputs``
/ ``y`` its output):

- ``ReluGrad(gradients, features)``: ``gradients`` where ``features > 0``, else 0;
- ``Relu6Grad(gradients, features)``: ``gradients`` where ``0 < features < 6``, else 0;
- ``LeakyReluGrad(gradients, features)`` (attr ``alpha``, default 0.2): ``gradients`` where
  ``features > 0``, else ``gradients * alpha``;
- ``EluGrad(gradients, outputs)``: ``gradients`` where ``outputs > 0``, else
  ``gradients * (outputs + 1)``;
- ``SeluGrad(gradients, outputs)``: ``gradients * (outputs + scale * alpha)`` where
  ``outputs < 0``, else ``gradients * scale`` (so at 0 too: measured with TF 2.21; scale
  1.0507009873554805, scale * alpha 1.7580993408473769);
- ``SoftplusGrad(gradients, features)``: ``gradients / (exp(-features) + 1)``;
- ``SoftsignGrad(gradients, features)``: ``gradients / (1 + |features|)^2``;
- ``TanhGrad(y, dy)``: ``dy * (1 - y * y)``, ``y`` the forward output;
- ``SigmoidGrad(y, dy)``: ``dy * y * (1 - y)``, ``y`` the forward output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import flex_kernel


@flex_kernel("ReluGrad")
def relu_grad(attrs: dict, gradients: jax.Array, features: jax.Array) -> jax.Array:
    return jnp.where(features > 0, gradients, jnp.zeros_like(gradients))


@flex_kernel("Relu6Grad")
def relu6_grad(attrs: dict, gradients: jax.Array, features: jax.Array) -> jax.Array:
    inside = (features > 0) & (features < 6)
    return jnp.where(inside, gradients, jnp.zeros_like(gradients))


@flex_kernel("TanhGrad")
def tanh_grad(attrs: dict, y: jax.Array, dy: jax.Array) -> jax.Array:
    return dy * (1 - y * y)


@flex_kernel("SigmoidGrad")
def sigmoid_grad(attrs: dict, y: jax.Array, dy: jax.Array) -> jax.Array:
    return dy * y * (1 - y)


@flex_kernel("LeakyReluGrad")
def leaky_relu_grad(attrs: dict, gradients: jax.Array, features: jax.Array) -> jax.Array:
    alpha = jnp.asarray(attrs.get("alpha", 0.2), gradients.dtype)
    return jnp.where(features > 0, gradients, gradients * alpha)


@flex_kernel("EluGrad")
def elu_grad(attrs: dict, gradients: jax.Array, outputs: jax.Array) -> jax.Array:
    return jnp.where(outputs > 0, gradients, gradients * (outputs + 1))


_SELU_SCALE = 1.0507009873554804934193349852946
_SELU_SCALE_ALPHA = 1.7580993408473768599402175208123


@flex_kernel("SeluGrad")
def selu_grad(attrs: dict, gradients: jax.Array, outputs: jax.Array) -> jax.Array:
    scale = jnp.asarray(_SELU_SCALE, gradients.dtype)
    scale_alpha = jnp.asarray(_SELU_SCALE_ALPHA, gradients.dtype)
    return jnp.where(outputs < 0, gradients * (outputs + scale_alpha), gradients * scale)


@flex_kernel("SoftplusGrad")
def softplus_grad(attrs: dict, gradients: jax.Array, features: jax.Array) -> jax.Array:
    return gradients / (jnp.exp(-features) + 1)


@flex_kernel("SoftsignGrad")
def softsign_grad(attrs: dict, gradients: jax.Array, features: jax.Array) -> jax.Array:
    d = 1 + jnp.abs(features)
    return gradients / (d * d)
