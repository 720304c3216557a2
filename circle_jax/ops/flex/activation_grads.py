"""Gradients of activations, as TF defines them: ReluGrad, Relu6Grad, TanhGrad, SigmoidGrad.

- ``ReluGrad(gradients, features)``: ``gradients`` where ``features > 0``, else 0;
- ``Relu6Grad(gradients, features)``: ``gradients`` where ``0 < features < 6``, else 0;
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
