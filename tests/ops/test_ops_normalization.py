"""L2_NORMALIZATION / LOCAL_RESPONSE_NORMALIZATION (LiteRT conformance) and Circle's
INSTANCE_NORM / RMS_NORM.

LiteRT cannot run Circle-only operators (negative builtin codes), so INSTANCE_NORM and
RMS_NORM are checked against float64 numpy references of ONE's luci-interpreter kernels
(circle-jax jitted and eager, on the .circle bytes), plus gradient checks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from tests.conformance import (
    Const,
    check_op,
    check_op_grads,
    one_op_model,
    run_circle_jax,
    run_litert,
)


def _x(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _circle_outputs(op: str, inputs: list, options: dict) -> list[np.ndarray]:
    """circle-jax's output of a one-op Circle model, jitted and eager (must agree)."""
    b, feeds = one_op_model(op, inputs, options)
    data = b.to_bytes("circle")
    jitted, eager = run_circle_jax(data, feeds, jit=True), run_circle_jax(data, feeds, jit=False)
    np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6, atol=1e-6)
    assert jitted[0].dtype == np.float32
    return jitted


# ---------------------------------------------------------------- L2_NORMALIZATION


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (1, 4, 4, 6), (1, 2, 2, 2, 3)])
def test_l2_normalization_matches_litert(shape: tuple[int, ...]) -> None:
    check_op("L2_NORMALIZATION", [_x(shape, seed=len(shape))])


def test_l2_normalization_epsilon() -> None:
    """TFLite divides by max(||x||, 1e-6): tiny and all-zero rows (1e-7 -> 0.1)."""
    x = np.array([[1e-7, 0.0, 0.0], [3e-7, 4e-7, 0.0], [0.0, 0.0, 0.0], [1e-3, 0.0, 2e-3]],
                 np.float32)
    out = check_op("L2_NORMALIZATION", [x])[0]
    np.testing.assert_allclose(out[0], [0.1, 0.0, 0.0], rtol=1e-5)


def test_l2_normalization_rejects_fused_activation() -> None:
    options = {"fused_activation_function": "RELU"}
    b, feeds = one_op_model("L2_NORMALIZATION", [_x((2, 3))], options, shapes=[(2, 3)])
    with pytest.raises(RuntimeError, match="activation"):
        run_litert(b.to_bytes("tflite"), feeds)
    with pytest.raises(ValueError, match="fused activation"):
        cj.load(b.to_bytes("circle")).apply({}, *feeds)


def test_l2_normalization_grads() -> None:
    check_op_grads("L2_NORMALIZATION", [_x((2, 3, 4), seed=3)])


def test_l2_normalization_zero_row_gradient_is_finite() -> None:
    b, _ = one_op_model("L2_NORMALIZATION", [_x((2, 3))])
    model = cj.load(b.to_bytes("circle"))
    x = jnp.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]])
    g = jax.grad(lambda v: jnp.sum(model.apply(model.params, v)[0] * jnp.arange(3.0)))(x)
    np.testing.assert_allclose(g[0], jnp.arange(3.0) / 1e-6, rtol=1e-5)
    assert np.isfinite(g).all()


# ---------------------------------------------------- LOCAL_RESPONSE_NORMALIZATION

LRN_OPTIONS = [
    {"radius": 2, "bias": 1.0, "alpha": 1e-4, "beta": 0.75},  # AlexNet-style
    {"radius": 1, "bias": 2.0, "alpha": 0.5, "beta": 0.5},
    {"radius": 0, "bias": 0.5, "alpha": 1.0, "beta": 1.0},
    {"radius": 9, "bias": 1.0, "alpha": 0.2, "beta": 0.3},  # window wider than C = 6
]


@pytest.mark.parametrize("options", LRN_OPTIONS)
def test_lrn_matches_litert(options: dict) -> None:
    check_op("LOCAL_RESPONSE_NORMALIZATION", [_x((2, 3, 4, 6), scale=2.0)], options)


@pytest.mark.parametrize("options", LRN_OPTIONS[1:3])
def test_lrn_grads(options: dict) -> None:
    check_op_grads("LOCAL_RESPONSE_NORMALIZATION", [_x((1, 2, 2, 5), seed=4)], options)


# ------------------------------------------------------------------ INSTANCE_NORM


def _instance_norm_ref(x, gamma, beta, eps: float, act: str) -> np.ndarray:
    """luci-interpreter's InstanceNorm in float64: NHWC stats over H, W; rank 3 is N x C x D."""
    x = x.astype(np.float64)
    axes, shape = ((1, 2), (1, 1, 1, -1)) if x.ndim == 4 else ((2,), (1, -1, 1))
    mean = x.mean(axis=axes, keepdims=True)
    var = (x * x).mean(axis=axes, keepdims=True) - mean * mean
    a = np.asarray(gamma, np.float64).reshape(shape) / np.sqrt(var + eps)
    y = x * a + (np.asarray(beta, np.float64).reshape(shape) - mean * a)
    lo, hi = {"NONE": (-np.inf, np.inf), "RELU": (0, np.inf), "RELU6": (0, 6),
              "RELU_N1_TO_1": (-1, 1)}[act]
    return np.clip(y, lo, hi)


@pytest.mark.parametrize("shape,per_channel,act,eps", [
    ((2, 5, 4, 3), True, "NONE", 1e-5),
    ((1, 6, 6, 4), False, "RELU", 1e-3),
    ((2, 3, 3, 2), True, "RELU6", 0.0),
    ((1, 4, 5, 3), True, "RELU_N1_TO_1", 1e-6),
    ((2, 3, 7), True, "NONE", 1e-5),  # rank 3: N x C x D
    ((2, 4, 5), False, "RELU", 1e-5),
])
def test_instance_norm_matches_reference(shape, per_channel: bool, act: str, eps: float) -> None:
    channels = shape[-1] if len(shape) == 4 else shape[1]
    n = channels if per_channel else 1
    gamma, beta = _x((n,), seed=1) + 1.0, _x((n,), seed=2)
    x = _x(shape, scale=2.0) + 0.5
    got = _circle_outputs("INSTANCE_NORM", [x, Const(gamma), Const(beta)],
                          {"epsilon": eps, "fused_activation_function": act})[0]
    # float32 vs float64 reference: a few ulps of the normalised values (|y| up to ~6).
    np.testing.assert_allclose(got, _instance_norm_ref(x, gamma, beta, eps, act),
                               rtol=1e-5, atol=1e-5)


def test_instance_norm_without_beta_and_activation_errors() -> None:
    x, gamma = _x((1, 3, 3, 2)), np.array([1.5, -0.5], np.float32)
    got = _circle_outputs("INSTANCE_NORM", [x, Const(gamma), None], {"epsilon": 1e-5})[0]
    np.testing.assert_allclose(got, _instance_norm_ref(x, gamma, np.zeros(2), 1e-5, "NONE"),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="TANH"):
        one_op_model("INSTANCE_NORM", [x, Const(gamma), Const(gamma)],
                     {"epsilon": 1e-5, "fused_activation_function": "TANH"})
    with pytest.raises(ValueError, match="gamma must have shape"):
        one_op_model("INSTANCE_NORM", [x, Const(np.ones(3, np.float32)), None], {})


@pytest.mark.parametrize("shape,act", [((2, 3, 4, 2), "NONE"), ((1, 3, 5), "RELU6")])
def test_instance_norm_grads(shape, act: str) -> None:
    channels = shape[-1] if len(shape) == 4 else shape[1]
    check_op_grads("INSTANCE_NORM", [_x(shape, seed=6), Const(_x((channels,), seed=7) + 1.0),
                                     Const(_x((channels,), seed=8) + 2.0)],
                   {"epsilon": 1e-3, "fused_activation_function": act})


# ----------------------------------------------------------------------- RMS_NORM


def _rms_norm_ref(x, gamma, beta, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    y = np.asarray(gamma, np.float64) * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if beta is None else y + np.asarray(beta, np.float64)


@pytest.mark.parametrize("shape,per_channel,with_beta,eps", [
    ((2, 5, 8), True, False, 1e-6),  # the 2-input form (current Circle)
    ((1, 3, 4, 6), True, False, 1e-5),
    ((3, 16), False, False, 0.0),
    ((2, 4, 6), True, True, 1e-6),  # the older 3-input form with beta
])
def test_rms_norm_matches_reference(shape, per_channel: bool, with_beta: bool, eps: float) -> None:
    n = shape[-1] if per_channel else 1
    gamma, beta = _x((n,), seed=1) + 1.0, (_x((n,), seed=2) if with_beta else None)
    inputs = [_x(shape, scale=3.0), Const(gamma)] + ([Const(beta)] if with_beta else [])
    got = _circle_outputs("RMS_NORM", inputs, {"epsilon": eps})[0]
    np.testing.assert_allclose(got, _rms_norm_ref(inputs[0], gamma, beta, eps),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_beta", [False, True])
def test_rms_norm_grads(with_beta: bool) -> None:
    inputs = [_x((2, 3, 5), seed=9), Const(_x((5,), seed=10) + 1.0)]
    if with_beta:
        inputs.append(Const(_x((5,), seed=11)))
    check_op_grads("RMS_NORM", inputs, {"epsilon": 1e-5})
