"""The 3x3 layers with their bias and clamping activation as one primitive
(`circle_jax.lowering.clamped`: the depthwise layer and the first layer of few input
channels) against the unfused layers they replace: float32 with the CPU kernels (values,
gradients of every subset of x, w and b, the clamp's kinks), float64 through their
reference in every AD mode and under vmap, and where a model's layers take them.

Tolerance in float32: 2e-6 of the largest value, as for the other kernels
(tests/ops/test_cpu_kernels.py): the bias gradient is a float32 sum over N * OH * OW terms
in another order; the output, the input and the weight gradients are the unfused kernels'
own sums and must be the same bits. float64: 1e-12 relative (summation order only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.graph import ir
from circle_jax.lowering import clamped
from circle_jax.lowering.depthwise import channelwise
from circle_jax.lowering.few_channels import few_channels_conv
from circle_jax.ops.conv import Geometry, bias_act
from tests.paths import shared_model

ACTS = {"RELU6": ir.ACT_RELU6, "RELU": ir.ACT_RELU, "RELU_N1_TO_1": ir.ACT_RELU_N1_TO_1}
TOLERANCE = 2e-6
#: per family: the layer, its convolution, its kernels' targets (forward, masked gradient)
FAMILIES = {
    "depthwise": (clamped.DEPTHWISE, channelwise, ("circle_jax_depthwise_clamped_forward",
                                                   "circle_jax_depthwise_masked_gradient")),
    "few_channels": (clamped.FEW_CHANNELS, few_channels_conv,
                     ("circle_jax_conv3x3_clamped_forward",
                      "circle_jax_conv3x3_masked_gradient")),
}

pytestmark = pytest.mark.usefixtures("cpu_kernels")


def _inputs(family: str, shape: tuple, act: int, seed: int) -> tuple[np.ndarray, ...]:
    """x, w, b with output channel 0's weights zero and its bias at the clamp's lower bound
    and channel 1's at its upper one (RELU: 0 and 0): outputs exactly on the kinks, where
    the gradient is 0 (TF's rule). Few-channel filters have 12 outputs."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w_shape = (9, shape[-1]) if family == "depthwise" else (3, 3, shape[-1], 12)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[-1]).astype(np.float32)
    lo, hi = clamped.CLAMPS[act]
    w[..., :2] = 0
    b[:2] = lo, (hi if np.isfinite(hi) else lo)
    return x, w, b


SHAPES = [  # family, (N, H, W, C), stride, ((top, bottom), (left, right))
    ("depthwise", (3, 8, 8, 8), 2, ((0, 1), (0, 1))),      # TFLite SAME at stride 2: 8 lanes
    ("depthwise", (9, 12, 10, 16), 1, ((1, 1), (1, 1))),   # 16 lanes, more samples than chunks
    ("depthwise", (2, 9, 7, 5), 1, ((0, 0), (0, 0))),      # one lane, VALID
    ("depthwise", (5, 10, 11, 12), 2, ((1, 2), (0, 1))),   # 4 lanes, uneven padding
    ("few_channels", (10, 16, 16, 3), 2, ((0, 1), (0, 1))),  # an image's first layer
    ("few_channels", (2, 9, 7, 1), 1, ((1, 1), (1, 1))),
    ("few_channels", (3, 8, 8, 4), 1, ((0, 0), (0, 0))),
]


#: every shape with RELU6, the first of each family with the other clamps too
CASES = [(*case, "RELU6") for case in SHAPES] + [
    (*case, act) for case in (SHAPES[0], SHAPES[4]) for act in ("RELU", "RELU_N1_TO_1")]


@pytest.mark.parametrize("family, shape, stride, pads, act", CASES, ids=str)
def test_the_layer_is_the_unfused_layer(family, shape, stride, pads, act) -> None:
    layer, conv, (forward, gradient) = FAMILIES[family]
    act = ACTS[act]
    g = Geometry((3, 3), (stride, stride), (1, 1), pads)
    x, w, b = _inputs(family, shape, act, sum(shape))

    def unfused(x, w, b, g, act):
        return bias_act(conv(x, w, g), b, act)

    fused = jax.jit(lambda x, w, b: layer(x, w, b, g, act))
    assert forward in fused.lower(x, w, b).as_text()
    y = np.asarray(fused(x, w, b))
    want = np.asarray(jax.jit(unfused, static_argnums=(3, 4))(x, w, b, g, act))
    assert y.tobytes() == want.tobytes()
    lo = clamped.CLAMPS[act][0]
    assert (y[..., 0] == lo).all() and (y[..., 1] == b[1]).all()
    ct = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    for argnums in ((0, 1, 2), (0,), (1,), (2,), (0, 2)):
        def grad(f, argnums=argnums):
            return jax.jit(jax.grad(lambda *a: jnp.sum(f(*a, g, act) * ct), argnums))

        step = grad(layer)
        assert (gradient in step.lower(x, w, b).as_text()) == (argnums != (0,))
        got, want = step(x, w, b), grad(unfused)(x, w, b)
        for i, have, need in zip(argnums, got, want, strict=True):
            have, need = np.asarray(have), np.asarray(need)
            if i == 2:
                assert np.abs(have - need).max() <= TOLERANCE * np.abs(need).max()
                assert have[:2].tolist() == [0, 0]  # outputs on the kinks pass no gradient
            else:
                assert have.tobytes() == need.tobytes(), (i, np.abs(have - need).max())


@pytest.mark.slow  # float64 AD traces: the slow tier (CI runs it)
@pytest.mark.parametrize("family", FAMILIES)
def test_float64_every_ad_mode_and_vmap_through_the_reference(family) -> None:
    """float64 takes the reference lowering: value, reverse, forward and second derivatives
    and per-sample gradients equal the unfused layer's."""
    layer, conv, _ = FAMILIES[family]
    g = Geometry((3, 3), (2, 2), (1, 1), ((0, 1), (1, 1)))
    x, w, b = (a.astype(np.float64) for a in _inputs(family, (3, 7, 6, 3), ir.ACT_RELU6, 0))
    with jax.enable_x64(True):
        ct = np.random.default_rng(2).standard_normal((3, 3, 3, w.shape[-1]))
        tangents = [np.random.default_rng(3).standard_normal(np.shape(a)) for a in (x, w, b)]

        def fused(x, w, b):
            return layer(x, w, b, g, ir.ACT_RELU6)

        def unfused(x, w, b):
            return bias_act(conv(x, w, g), b, ir.ACT_RELU6)

        def measures(f):
            y, vjp = jax.vjp(f, x, w, b)
            jvp = jax.jvp(f, (x, w, b), tuple(tangents))[1]
            mixed = jax.grad(lambda x: jnp.sum(jax.grad(
                lambda w, b: jnp.sum(f(x, w, b) * ct), (0, 1))(w, b)[0] * w))(x)
            per_sample = jax.vmap(jax.grad(lambda w, b, x, c: jnp.sum(f(x[None], w, b)
                                                                      * c[None])),
                                  in_axes=(None, None, 0, 0))(w, b, x, ct)
            return y, vjp(ct), jvp, mixed, per_sample

        for got, want in zip(jax.tree.leaves(measures(fused)),
                             jax.tree.leaves(measures(unfused)), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _layer_model(op: str, act: str, multiplier: int = 1, bias: bool = True) -> cj.Model:
    """One 3x3 convolution ``op`` of 4 input channels, SAME, stride 1, activation ``act``."""
    b = cj.Builder("layer")
    rng = np.random.default_rng(0)
    x = b.input("x", (1, 6, 6, 4))
    out = 4 * multiplier if op == "DEPTHWISE_CONV_2D" else 8
    shape = (1, 3, 3, out) if op == "DEPTHWISE_CONV_2D" else (out, 3, 3, 4)
    inputs = [x, b.constant("w", rng.standard_normal(shape).astype(np.float32))]
    if bias:
        inputs.append(b.constant("b", np.zeros(out, np.float32)))
    options = {"padding": "SAME", "stride_h": 1, "stride_w": 1,
               "fused_activation_function": act}
    if op == "DEPTHWISE_CONV_2D":
        options["depth_multiplier"] = multiplier
    b.output(b.op(op, inputs, options))
    return cj.load(b.to_bytes("circle"))


@pytest.mark.parametrize("op, act, multiplier, bias, fused", [
    ("DEPTHWISE_CONV_2D", "RELU6", 1, True, True),
    ("CONV_2D", "RELU", 1, True, True),
    ("DEPTHWISE_CONV_2D", "RELU6", 2, True, False),  # a depth multiplier
    ("DEPTHWISE_CONV_2D", "RELU6", 1, False, False),  # no bias
    ("CONV_2D", "TANH", 1, True, False),
    ("DEPTHWISE_CONV_2D", "NONE", 1, True, False),
], ids=str)
def test_which_layers_of_a_model_are_fused(op, act, multiplier, bias, fused) -> None:
    model = _layer_model(op, act, multiplier, bias)
    x = np.ones((2, 6, 6, 4), np.float32)
    jaxpr = str(jax.make_jaxpr(model.apply)(model.params, x))
    assert ("_clamped[" in jaxpr) == fused


def test_half_precision_stays_unfused() -> None:
    g = Geometry((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)))
    x, w, b = (np.ones(s, np.float16) for s in ((1, 4, 4, 4), (9, 4), (4,)))
    assert not clamped.applies(x, w, b, g, ir.ACT_RELU6)
    assert clamped.applies(*(a.astype(np.float32) for a in (x, w, b)), g, ir.ACT_RELU6)


def test_a_converted_models_layers_are_fused_and_train_the_same() -> None:
    """MobileNet 0.25/128 as TF's converter wrote it (a first layer of 3 input channels and
    13 depthwise layers, all with RELU6): the default lowering's gradient program holds the
    fused layers and their one-pass backward, and
    its float32 gradients equal the reference lowering's (to 1e-4 of each gradient's
    largest value: 28 layers of float32 sums in other orders)."""
    path = shared_model("mobilenet_v1_0.25_128_float.tflite")
    fast, ref = cj.load(path), cj.load(path, lowering="reference")
    x = np.random.default_rng(0).uniform(0, 1, (1, 128, 128, 3)).astype(np.float32)

    def grad(model):
        return jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x)[0] ** 2)))

    text = grad(fast).lower(fast.params).compile().as_text()
    calls = [f'custom_call_target="{t}"' for _, _, targets in FAMILIES.values()
             for t in targets]
    assert [text.count(c) for c in calls] == [13, 13, 1, 1]
    got, want = grad(fast)(fast.params), grad(ref)(ref.params)
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert np.abs(np.asarray(a) - np.asarray(w)).max() <= 1e-4 * np.abs(w).max()
