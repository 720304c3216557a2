"""AVERAGE_POOL_2D / MAX_POOL_2D / L2_POOL_2D: LiteRT conformance rows, gradient checks and
TF's MaxPoolGrad tie rule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.ops.common import padding_pairs
from tests.conformance import check_op, check_op_grads, one_op_model
from tests.paths import shared_model

OPS = ["AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"]

# (input shape, (filter h, w), (stride h, w)): small windows (shifted-slice lowering),
# non-square, strides larger than the window, and non-overlapping windows longer than 4
# (reshaped-block lowering; DeepLab v3's global 33x33 pool has its own row below).
GEOMETRIES = [
    ((2, 7, 8, 3), (2, 2), (2, 2)),
    ((1, 9, 9, 4), (3, 3), (2, 2)),
    ((2, 6, 7, 2), (3, 2), (1, 2)),
    ((1, 8, 5, 3), (2, 3), (3, 1)),
    ((1, 11, 12, 2), (5, 5), (5, 5)),
]
# TFLite pooling applies fused activations as clamp ranges: TANH and SIGN_BIT leave the value
# unchanged in LiteRT, and these rows check that circle-jax does the same.
ACTIVATIONS = ["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH", "SIGN_BIT"]


def _x(shape: tuple[int, ...], seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _opts(kernel, stride, padding: str = "VALID", act: str = "NONE") -> dict:
    return {"filter_height": kernel[0], "filter_width": kernel[1], "stride_h": stride[0],
            "stride_w": stride[1], "padding": padding, "fused_activation_function": act}


def _model(op: str, shape, options: dict) -> cj.Model:
    b, _ = one_op_model(op, [np.zeros(shape, np.float32)], options)
    return cj.load(b.to_bytes("circle"))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("shape,kernel,stride", GEOMETRIES)
def test_pool_matches_litert(op: str, padding: str, shape, kernel, stride) -> None:
    check_op(op, [_x(shape, seed=sum(shape))], _opts(kernel, stride, padding))


@pytest.mark.parametrize("op,act", [(OPS[i % 3], act) for i, act in enumerate(ACTIVATIONS[1:])]
                         + [("MAX_POOL_2D", "RELU_N1_TO_1"), ("L2_POOL_2D", "RELU6")])
def test_pool_fused_activation(op: str, act: str) -> None:
    # Inputs around [-2, 8] so every clip bound is crossed.
    x = _x((1, 6, 6, 3), seed=3) + 3.0
    check_op(op, [x], _opts((3, 3), (2, 2), "SAME", act))


def test_deeplab_average_pool_configuration() -> None:
    """DeepLab v3's image pooling: AVERAGE_POOL_2D 33x33, stride 33, VALID on [1,33,33,160]."""
    model = cj.read_model(shared_model("deeplabv3_257_mv_gpu.tflite"))
    (op,) = [o for o in model.main.operators if o.type == "AVERAGE_POOL_2D"]
    shape = model.main.tensors[op.inputs[0]].shape
    assert shape == (1, 33, 33, 160)
    check_op("AVERAGE_POOL_2D", [_x(shape)], dict(op.options))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("padding,geometry", [("SAME", GEOMETRIES[1]), ("VALID", GEOMETRIES[2]),
                                              ("SAME", GEOMETRIES[4])])
def test_pool_grads(op: str, padding: str, geometry) -> None:
    # Continuous random inputs: no ties within a window, no zero L2 window, none exactly on
    # a RELU6 bound.
    shape, kernel, stride = geometry
    check_op_grads(op, [_x(shape, seed=7)], _opts(kernel, stride, padding, "RELU6"))


def _tf_max_pool_grad(x: np.ndarray, g: np.ndarray, kernel, stride, padding: int) -> np.ndarray:
    """TF's MaxPoolGrad rule: each window's gradient goes to its first maximum, scanning the
    non-padded window elements row by row (h, then w)."""
    pads = padding_pairs(padding, x.shape[1:3], kernel, stride)
    dx = np.zeros_like(x)
    for n in range(x.shape[0]):
        for c in range(x.shape[3]):
            for i in range(g.shape[1]):
                for j in range(g.shape[2]):
                    h0, w0 = i * stride[0] - pads[0][0], j * stride[1] - pads[1][0]
                    best = None
                    for h in range(max(h0, 0), min(h0 + kernel[0], x.shape[1])):
                        for w in range(max(w0, 0), min(w0 + kernel[1], x.shape[2])):
                            if best is None or x[n, h, w, c] > x[n, best[0], best[1], c]:
                                best = (h, w)
                    dx[n, best[0], best[1], c] += g[n, i, j, c]
    return dx


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("shape,kernel,stride", [((1, 6, 7, 2), (3, 3), (1, 1)),
                                                 ((2, 6, 6, 1), (2, 2), (2, 2)),
                                                 ((1, 12, 10, 2), (5, 5), (5, 5)),
                                                 ((1, 7, 7, 1), (3, 2), (2, 3))])
def test_max_pool_ties_go_to_first_max(padding: str, shape, kernel, stride) -> None:
    """Inputs from {0, 1, 2} tie inside almost every window: the whole gradient of a window
    must reach its first maximum (not be split), exactly like TF's MaxPoolGrad."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 3, shape).astype(np.float32)
    pad = 0 if padding == "SAME" else 1
    model = _model("MAX_POOL_2D", shape, _opts(kernel, stride, padding))
    y = model.apply(model.params, x)[0]
    g = rng.standard_normal(y.shape).astype(np.float32)
    got = jax.jit(jax.grad(lambda v: jnp.sum(model.apply(model.params, v)[0] * g)))(x)
    np.testing.assert_allclose(got, _tf_max_pool_grad(x, g, kernel, stride, pad), atol=1e-6)


def test_max_pool_tie_rule_small_example() -> None:
    """One 2x2 window of equal values: all the gradient lands on the top-left element."""
    model = _model("MAX_POOL_2D", (1, 2, 2, 1), _opts((2, 2), (2, 2)))
    grad_fn = jax.jit(jax.grad(lambda v: model.apply(model.params, v)[0].sum()))
    grad = grad_fn(jnp.ones((1, 2, 2, 1)))
    np.testing.assert_array_equal(grad[0, :, :, 0], [[1.0, 0.0], [0.0, 0.0]])
    # The max in the second row only: the gradient goes to its first occurrence there.
    grad = grad_fn(jnp.array([[1.0, 0.0], [3.0, 3.0]]).reshape(1, 2, 2, 1))
    np.testing.assert_array_equal(grad[0, :, :, 0], [[0.0, 0.0], [1.0, 0.0]])


def test_average_pool_same_divides_by_valid_count() -> None:
    """SAME padding: a corner window of a ones image averages to exactly 1 (padding is not
    counted), and a ramp's border windows average only their in-image pixels."""
    model = _model("AVERAGE_POOL_2D", (1, 3, 3, 1), _opts((3, 3), (1, 1), "SAME"))
    out = model.apply(model.params, np.ones((1, 3, 3, 1), np.float32))[0]
    np.testing.assert_array_equal(out, np.ones((1, 3, 3, 1)))
    ramp = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    out = model.apply(model.params, ramp)[0]
    assert out[0, 0, 0, 0] == pytest.approx(np.mean([0, 1, 3, 4]))


def test_l2_pool_zero_window_has_zero_gradient() -> None:
    """sqrt at 0 has no derivative; circle-jax gives 0 there instead of NaN."""
    model = _model("L2_POOL_2D", (1, 4, 4, 1), _opts((2, 2), (2, 2)))
    x = np.zeros((1, 4, 4, 1), np.float32)
    x[0, 2:, 2:, 0] = [[1.0, 2.0], [3.0, 4.0]]
    grad = jax.jit(jax.grad(lambda v: model.apply(model.params, v)[0].sum()))(x)
    assert np.isfinite(grad).all()
    np.testing.assert_array_equal(grad[0, :2, :2, 0], 0.0)
    np.testing.assert_allclose(grad[0, 2:, 2:, 0], x[0, 2:, 2:, 0] / (4 * np.sqrt(7.5)),
                               rtol=1e-6)


def test_pool_rejects_window_larger_than_valid_input() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        one_op_model("MAX_POOL_2D", [np.zeros((1, 3, 3, 1), np.float32)],
                     _opts((4, 4), (1, 1), "VALID"))
