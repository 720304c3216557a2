"""RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR: LiteRT conformance rows and gradient checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.ops.resize import bilinear_taps, nearest_indices
from tests.conformance import Const, check_op, check_op_grads, one_op_model, run_litert
from tests.paths import shared_model

DEEPLAB = shared_model("deeplabv3_257_mv_gpu.tflite")

# (input H, W) -> (output H, W): up, down, odd ratios, identity, to and from size 1.
SIZES = [((4, 5), (8, 10)), ((3, 7), (7, 3)), ((9, 6), (1, 4)), ((5, 5), (5, 5)),
         ((1, 1), (3, 4)), ((13, 8), (31, 17))]
FLAGS = [(False, False), (True, False), (False, True), (True, True)]


def _x(shape: tuple[int, ...], seed: int = 0, dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _opts(align: bool, half: bool) -> dict:
    return {"align_corners": align, "half_pixel_centers": half}


# Bilinear with align_corners AND half_pixel_centers is rejected by LiteRT (and by
# circle-jax): test_bilinear_rejects_align_and_half_pixel covers it.
OPS_FLAGS = [(op, f) for op in ("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR") for f in FLAGS
             if not (op == "RESIZE_BILINEAR" and all(f))]


@pytest.mark.parametrize("op,flags", OPS_FLAGS, ids=[f"{o[7:11]}-{int(a)}{int(h)}"
                                                     for o, (a, h) in OPS_FLAGS])
@pytest.mark.parametrize("hw,out", SIZES)
def test_resize_matches_litert(op: str, flags: tuple[bool, bool], hw, out) -> None:
    x = _x((2, *hw, 3), seed=sum(hw))
    check_op(op, [x, Const(np.array(out, np.int32))], _opts(*flags))


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int8"])
@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "align", "half", "align+half"])
def test_resize_nearest_integer_dtypes(dtype: str, flags: tuple[bool, bool]) -> None:
    x = _x((1, 5, 4, 2), dtype=dtype)
    if dtype == "uint8":
        x = x.astype(np.int32).clip(0, 255).astype(np.uint8)
    check_op("RESIZE_NEAREST_NEIGHBOR", [x, Const(np.array([9, 3], np.int32))], _opts(*flags))


def test_bilinear_rejects_align_and_half_pixel() -> None:
    """LiteRT refuses this combination at prepare time; circle-jax raises too."""
    inputs = [_x((1, 2, 2, 1)), Const(np.array([3, 3], np.int32))]
    b, feeds = one_op_model("RESIZE_BILINEAR", inputs, _opts(True, True), shapes=[(1, 3, 3, 1)])
    with pytest.raises(RuntimeError, match="align_corners must be False"):
        run_litert(b.to_bytes("tflite"), feeds)
    with pytest.raises(ValueError, match="exclusive"):
        cj.load(b.to_bytes("circle")).apply({}, *feeds)
    with pytest.raises(ValueError, match="exclusive"):
        one_op_model("RESIZE_BILINEAR", inputs, _opts(True, True))


def test_coordinate_rules() -> None:
    """Spot values of TFLite's rules: round half away from zero, clamps, half-pixel offsets."""
    # align_corners 3 -> 5: scale 0.5, src 0, .5, 1, 1.5, 2 -> round half up 0, 1, 1, 2, 2.
    assert nearest_indices(3, 5, True, False).tolist() == [0, 1, 1, 2, 2]
    # plain 3 -> 5: scale 0.6, floor(0, .6, 1.2, 1.8, 2.4).
    assert nearest_indices(3, 5, False, False).tolist() == [0, 0, 1, 1, 2]
    # half-pixel 4 -> 4 with align_corners (scale 1): round(o + .5) clamps to in - 1.
    assert nearest_indices(4, 4, True, True).tolist() == [1, 2, 3, 3]
    # bilinear half-pixel 2 -> 4: src -.25, .25, .75, 1.25; edges collapse onto one pixel.
    (lo, w_lo), (hi, w_hi) = bilinear_taps(2, 4, False, True)
    assert lo.tolist() == [0, 0, 0, 1] and hi.tolist() == [0, 1, 1, 1]
    np.testing.assert_allclose(w_lo + w_hi, 1.0)


@pytest.mark.parametrize("flags", FLAGS[:3], ids=["plain", "align", "half"])
@pytest.mark.parametrize("hw,out", [((3, 4), (7, 5)), ((8, 6), (3, 4))])
def test_resize_bilinear_grads(flags: tuple[bool, bool], hw, out) -> None:
    check_op_grads("RESIZE_BILINEAR", [_x((2, *hw, 2)), Const(np.array(out, np.int32))],
                   _opts(*flags))


@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "align", "half", "align+half"])
@pytest.mark.parametrize("hw,out", [((3, 6), (7, 3)), ((2, 3), (4, 6))])
def test_resize_nearest_grads(flags: tuple[bool, bool], hw, out) -> None:
    check_op_grads("RESIZE_NEAREST_NEIGHBOR", [_x((2, *hw, 2)), Const(np.array(out, np.int32))],
                   _opts(*flags))


def _deeplab_resizes() -> list[tuple[tuple[int, ...], tuple[int, int], dict]]:
    """Every RESIZE_BILINEAR of the DeepLab v3 model: input shape, size and options."""
    model = cj.read_model(DEEPLAB)
    sg = model.main
    rows = []
    for op in sg.operators:
        if op.type == "RESIZE_BILINEAR":
            x, size = (sg.tensors[i] for i in op.inputs)
            rows.append((x.shape, tuple(int(v) for v in size.data), dict(op.options)))
    return rows


def test_deeplab_resize_bilinear_configurations() -> None:
    """DeepLab v3 (MobileNet v2) resizes with align_corners=True: 1x1 -> 33x33 (image pooling
    broadcast), 33x33 -> 33x33 and 33x33 -> 257x257 (logits). Each is one LiteRT row here."""
    rows = _deeplab_resizes()
    assert [(r[0], r[1]) for r in rows] == [
        ((1, 1, 1, 256), (33, 33)), ((1, 33, 33, 21), (33, 33)), ((1, 33, 33, 21), (257, 257))]
    for shape, size, options in rows:
        assert options == {"align_corners": True, "half_pixel_centers": False}
        check_op("RESIZE_BILINEAR", [_x(shape), Const(np.array(size, np.int32))], options)


def test_deeplab_upsample_gradient_is_transposed_interpolation() -> None:
    """The custom backward pass (matmul by the interpolation matrix) equals autodiff of the
    gathers on the DeepLab 33 -> 257 upsample."""
    b, _ = one_op_model("RESIZE_BILINEAR", [_x((1, 33, 33, 4)), Const(np.array([257, 257],
                        np.int32))], {"align_corners": True})
    model = cj.load(b.to_bytes("circle"))
    x = jnp.asarray(_x((1, 33, 33, 4), seed=1))
    c = jnp.asarray(_x((1, 257, 257, 4), seed=2))
    got = jax.jit(jax.grad(lambda v: jnp.sum(model.apply(model.params, v)[0] * c)))(x)
    (lo, w_lo), (hi, w_hi) = bilinear_taps(33, 257, True, False)

    def reference(v: jax.Array) -> jax.Array:
        for axis in (1, 2):
            shape = [1, 1, 1, 1]
            shape[axis] = -1
            v = (jnp.take(v, lo, axis=axis) * w_lo.reshape(shape)
                 + jnp.take(v, hi, axis=axis) * w_hi.reshape(shape))
        return jnp.sum(v * c)

    np.testing.assert_allclose(got, jax.grad(reference)(x), rtol=1e-5, atol=1e-4)


def test_resize_on_abstract_and_static_inputs() -> None:
    """The builder infers shapes via eval_shape; an all-static resize is constant-folded."""
    b, _ = one_op_model("RESIZE_NEAREST_NEIGHBOR", [Const(_x((1, 2, 3, 1))),
                        Const(np.array([4, 6], np.int32))])
    model = cj.load(b.to_bytes("circle"))
    out = model.apply(model.params)[0]
    assert out.shape == (1, 4, 6, 1)
    np.testing.assert_array_equal(out, np.repeat(np.repeat(_x((1, 2, 3, 1)), 2, 1), 2, 2))
