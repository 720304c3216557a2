"""The depthwise layer with its bias and clamping activation as one primitive
(`circle_jax.lowering.depthwise_clamped`) against the unfused layer it replaces: float32
with the CPU kernels (values, gradients of every subset of x, w and b, the clamp's kinks),
float64 through its reference in every AD mode and under vmap, and where a model's layers
take it.

Tolerance in float32: 2e-6 of the largest value, as for the other kernels
(tests/ops/test_cpu_kernels.py): the bias gradient is a float32 sum over N * OH * OW terms
in another order; the output, the input and the weight gradients are the unfused kernels'
own sums and must be the same bits. float64: 1e-12 relative (summation order only)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.graph import ir
from circle_jax.lowering import depthwise_clamped
from circle_jax.lowering.depthwise import channelwise
from circle_jax.ops.conv import Geometry, bias_act
from tests.paths import SHARED_MODELS

FORWARD, GRADIENT = "circle_jax_depthwise_clamped_forward", "circle_jax_depthwise_masked_gradient"
ACTS = {"RELU6": ir.ACT_RELU6, "RELU": ir.ACT_RELU, "RELU_N1_TO_1": ir.ACT_RELU_N1_TO_1}
TOLERANCE = 2e-6


pytestmark = pytest.mark.usefixtures("cpu_kernels")


def _unfused(x, wk, b, g, act):
    return bias_act(channelwise(x, wk, g), b, act)


def _inputs(shape: tuple, act: int, seed: int) -> tuple[np.ndarray, ...]:
    """x, wk, b with channel 0's weights zero and its bias at the clamp's lower bound and
    channel 1's at its upper one (RELU: 0 and 0): outputs exactly on the kinks, where the
    gradient is 0 (TF's rule)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    wk = rng.standard_normal((9, shape[-1])).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    lo, hi = depthwise_clamped.CLAMPS[act]
    wk[:, :2] = 0
    b[:2] = lo, (hi if np.isfinite(hi) else lo)
    return x, wk, b


SHAPES = [  # (N, H, W, C), stride, ((top, bottom), (left, right))
    ((3, 8, 8, 8), 2, ((0, 1), (0, 1))),      # TFLite SAME at stride 2: 8 lanes
    ((9, 12, 10, 16), 1, ((1, 1), (1, 1))),   # 16 lanes, more samples than chunks
    ((2, 9, 7, 5), 1, ((0, 0), (0, 0))),      # one lane, VALID
    ((5, 10, 11, 12), 2, ((1, 2), (0, 1))),   # 4 lanes, uneven padding
]


@pytest.mark.parametrize("act", ACTS, ids=str)
@pytest.mark.parametrize("shape, stride, pads", SHAPES, ids=str)
def test_the_layer_is_the_unfused_layer(shape, stride, pads, act) -> None:
    act = ACTS[act]
    g = Geometry((3, 3), (stride, stride), (1, 1), pads)
    x, wk, b = _inputs(shape, act, sum(shape))
    fused = jax.jit(lambda x, wk, b: depthwise_clamped.layer(x, wk, b, g, act))
    assert FORWARD in fused.lower(x, wk, b).as_text()
    y = np.asarray(fused(x, wk, b))
    want = np.asarray(jax.jit(_unfused, static_argnums=(3, 4))(x, wk, b, g, act))
    assert y.tobytes() == want.tobytes()
    lo = depthwise_clamped.CLAMPS[act][0]
    assert (y[..., 0] == lo).all() and (y[..., 1] == b[1]).all()
    ct = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    for argnums in ((0, 1, 2), (0,), (1,), (2,), (0, 2)):
        def grad(f, argnums=argnums):
            return jax.jit(jax.grad(lambda *a: jnp.sum(f(*a, g, act) * ct), argnums))

        step = grad(depthwise_clamped.layer)
        assert (GRADIENT in step.lower(x, wk, b).as_text()) == (argnums != (0,))
        got, want = step(x, wk, b), grad(_unfused)(x, wk, b)
        for i, have, need in zip(argnums, got, want, strict=True):
            have, need = np.asarray(have), np.asarray(need)
            if i == 2:
                assert np.abs(have - need).max() <= TOLERANCE * np.abs(need).max()
                assert have[:2].tolist() == [0, 0]  # outputs on the kinks pass no gradient
            else:
                assert have.tobytes() == need.tobytes(), (i, np.abs(have - need).max())


def test_float64_every_ad_mode_and_vmap_through_the_reference() -> None:
    """float64 takes the reference lowering: value, reverse, forward and second derivatives
    and per-sample gradients equal the unfused layer's."""
    g = Geometry((3, 3), (2, 2), (1, 1), ((0, 1), (1, 1)))
    x, wk, b = (a.astype(np.float64) for a in _inputs((3, 7, 6, 5), ir.ACT_RELU6, 0))
    with jax.enable_x64(True):
        ct = np.random.default_rng(2).standard_normal((3, 3, 3, 5))
        tangents = [np.random.default_rng(3).standard_normal(np.shape(a)) for a in (x, wk, b)]

        def fused(x, wk, b):
            return depthwise_clamped.layer(x, wk, b, g, ir.ACT_RELU6)

        def unfused(x, wk, b):
            return _unfused(x, wk, b, g, ir.ACT_RELU6)

        def measures(f):
            y, vjp = jax.vjp(f, x, wk, b)
            jvp = jax.jvp(f, (x, wk, b), tuple(tangents))[1]
            mixed = jax.grad(lambda x: jnp.sum(jax.grad(
                lambda wk, b: jnp.sum(f(x, wk, b) * ct), (0, 1))(wk, b)[0] * wk))(x)
            per_sample = jax.vmap(jax.grad(lambda wk, b, x, c: jnp.sum(f(x[None], wk, b)
                                                                       * c[None])),
                                  in_axes=(None, None, 0, 0))(wk, b, x, ct)
            return y, vjp(ct), jvp, mixed, per_sample

        for got, want in zip(jax.tree.leaves(measures(fused)),
                             jax.tree.leaves(measures(unfused)), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["multiplier 2", "no bias", "TANH", "NONE", "float16"])
def test_a_layer_it_does_not_cover_stays_unfused(case) -> None:
    g = Geometry((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)))
    dtype = np.float16 if case == "float16" else np.float32
    x, wk, b = (np.ones(s, dtype) for s in ((1, 4, 4, 4), (9, 4), (4,)))
    act = {"TANH": ir.ACT_TANH, "NONE": ir.ACT_NONE}.get(case, ir.ACT_RELU6)
    if case == "multiplier 2":
        wk = np.ones((9, 8), dtype)
    assert not depthwise_clamped.applies(x, wk, None if case == "no bias" else b, g, act)


def test_a_converted_models_depthwise_layers_are_fused_and_train_the_same() -> None:
    """MobileNet 0.25/128 as TF's converter wrote it (13 depthwise layers with RELU6): the
    default lowering's gradient program holds the fused layer and its one-pass backward, and
    its float32 gradients equal the reference lowering's (to 1e-4 of each gradient's
    largest value: 28 layers of float32 sums in other orders)."""
    path = Path(SHARED_MODELS) / "mobilenet_v1_0.25_128_float.tflite"
    fast, ref = cj.load(path), cj.load(path, lowering="reference")
    x = np.random.default_rng(0).uniform(0, 1, (2, 128, 128, 3)).astype(np.float32)

    def grad(model):
        return jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x)[0] ** 2)))

    text = grad(fast).lower(fast.params).compile().as_text()
    calls = [f'custom_call_target="{t}"' for t in (FORWARD, GRADIENT)]
    assert [text.count(c) for c in calls] == [13, 13]
    got, want = grad(fast)(fast.params), grad(ref)(ref.params)
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert np.abs(np.asarray(a) - np.asarray(w)).max() <= 1e-4 * np.abs(w).max()
