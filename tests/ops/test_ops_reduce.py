"""MEAN / SUM / REDUCE_MAX / REDUCE_MIN / REDUCE_PROD / REDUCE_ANY / REDUCE_ALL: LiteRT
conformance rows, gradient checks and TF's gradient rules at ties and zeros."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.ops.reduce import reduction_axes
from tests.conformance import Const, check_op, check_op_grads, one_op_model

FLOAT_OPS = ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"]

# (axis tensor, keep_dims): one axis, negative, several, duplicates mixed with negatives,
# empty (identity), a scalar axis tensor and every axis.
AXES = [
    ([1], False),
    ([-1], True),
    ([0, 2], False),
    ([2, -1, 2, 0], True),
    ([], False),
    (1, True),
    ([0, 1, 2], False),
]


def _x(shape: tuple[int, ...] = (3, 4, 5), seed: int = 0) -> np.ndarray:
    # Values in [0.5, 1.5] keep products tame and are distinct (no ties).
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(np.float32)


def _axis(axes: object) -> Const:
    return Const(np.array(axes, np.int32))


@pytest.mark.parametrize("op", FLOAT_OPS)
@pytest.mark.parametrize("axes,keep", AXES)
def test_reduce_float_matches_litert(op: str, axes, keep: bool) -> None:
    check_op(op, [_x(), _axis(axes)], {"keep_dims": keep})


@pytest.mark.parametrize("op", FLOAT_OPS)
@pytest.mark.parametrize("axes,keep", [([1, 2], True), ([0], False)])
def test_reduce_int32_matches_litert(op: str, axes, keep: bool) -> None:
    """int32: sums wrap, MEAN truncates toward zero (negative sums included)."""
    x = np.random.default_rng(1).integers(-50, 50, (4, 3, 5)).astype(np.int32)
    if op == "REDUCE_PROD":
        x = np.clip(x, -6, 6)
    check_op(op, [x, _axis(axes)], {"keep_dims": keep})


def test_mean_int32_does_not_overflow() -> None:
    """LiteRT accumulates an int32 MEAN in 64 bits; circle-jax gets the same answer."""
    x = np.array([[2**30, 2**30, 2**30], [-(2**31), -(2**31), 5], [-7, 0, 0]], np.int32)
    check_op("MEAN", [x, _axis([1])], {"keep_dims": False})


@pytest.mark.parametrize("op", ["REDUCE_ANY", "REDUCE_ALL"])
@pytest.mark.parametrize("axes,keep", [([1], False), ([0, -1], True), ([], False)])
def test_reduce_bool_matches_litert(op: str, axes, keep: bool) -> None:
    x = np.random.default_rng(2).uniform(size=(3, 4, 2)) < 0.6
    x[0] = True
    x[1] = False
    check_op(op, [x, _axis(axes)], {"keep_dims": keep})


def test_large_mean_like_a_global_pool() -> None:
    """MEAN over H, W of an NHWC tensor with keep_dims (Keras GlobalAveragePooling)."""
    check_op("MEAN", [_x((2, 16, 16, 8)), _axis([1, 2])], {"keep_dims": True})


@pytest.mark.parametrize("op", FLOAT_OPS)
@pytest.mark.parametrize("axes,keep", [([1, -1], False), ([0], True)])
def test_reduce_grads(op: str, axes, keep: bool) -> None:
    check_op_grads(op, [_x((3, 4, 2), seed=5), _axis(axes)], {"keep_dims": keep})


def _grad(op: str, x: np.ndarray, axes: list[int]) -> np.ndarray:
    b, _ = one_op_model(op, [x, _axis(axes)], {"keep_dims": False})
    model = cj.load(b.to_bytes("circle"))
    return np.asarray(jax.grad(lambda v: model.apply(model.params, v)[0].sum())(jnp.asarray(x)))


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_extremum_ties_split_gradient_equally(op: str) -> None:
    """TF's _MinOrMaxGrad: the gradient is divided equally among tied extrema."""
    x = np.array([[3.0, 1.0, 3.0, 3.0], [2.0, 5.0, -1.0, 0.0]], np.float32)
    if op == "REDUCE_MIN":
        x = -x
    np.testing.assert_allclose(_grad(op, x, [1]), [[1 / 3, 0, 1 / 3, 1 / 3], [0, 1, 0, 0]])


def test_prod_gradient_with_zeros() -> None:
    """d prod / d x_i = product of the others, also when some x are zero (as TF computes)."""
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 4.0], [1.5, 2.0, -1.0]], np.float32)
    want = [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0], [-2.0, -1.5, 3.0]]
    np.testing.assert_allclose(_grad("REDUCE_PROD", x, [1]), want)


def test_reduction_axes_normalisation() -> None:
    """int64 axis tensors (which LiteRT's SUM refuses) work too; duplicates collapse."""
    assert reduction_axes(np.array([2, -1, 0, -3], np.int64), 3) == (0, 2)
    assert reduction_axes(np.array(-2, np.int32), 4) == (2,)
    with pytest.raises(ValueError, match="out of range"):
        reduction_axes(np.array([3], np.int32), 3)


def test_runtime_axis_is_rejected() -> None:
    """The axis must be a constant: a graph-input axis gives a clear lowering error."""
    b, feeds = one_op_model("SUM", [_x(), np.array([1], np.int32)], {"keep_dims": False},
                            shapes=[(3, 5)])
    model = cj.load(b.to_bytes("circle"))
    with pytest.raises(ValueError, match="known when the model is lowered"):
        jax.jit(model.apply)(model.params, *feeds)
