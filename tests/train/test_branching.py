"""A tensor consumed by a Conv2D and an Add gets the sum of both gradients (onert's old bug)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

import circle_jax as cj
from circle_jax.examples import branching_cnn


def test_branching_gradient_matches_finite_differences(x64: None) -> None:
    model = cj.load(branching_cnn(channels=4).to_bytes("circle"))
    x = np.random.default_rng(1).uniform(0, 1, (2, 8, 8, 1))
    params = {k: jnp.asarray(v, jnp.float64) for k, v in model.params.items()}
    xs = jnp.asarray(x, jnp.float64)

    def loss(p: dict) -> jax.Array:
        return jnp.sum(model.apply(p, xs)[0] * jnp.arange(10.0))

    for fn in (loss, jax.jit(loss)):
        check_grads(fn, (params,), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)

