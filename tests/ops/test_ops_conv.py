"""Convolutions and matmuls against LiteRT (every lowering forced in turn), float64 gradient
checks, the custom ops against numpy references, and the dispatch rule."""

from __future__ import annotations

import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flatbuffers import flexbuffers

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.lowering import LoweringOptions, conv, matmul, transpose_conv
from circle_jax.lowering.depthwise import channelwise, shift_sum
from circle_jax.ops.conv import Geometry, parse_transpose_conv_bias_options
from tests.conformance import Const, check_op, check_op_grads, one_op_model, run_litert
from tests.paths import shared_model


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.normal(size=shape) * scale).astype(np.float32)


def _lw(method: str | None) -> LoweringOptions | None:
    """Options forcing one convolution method (None: the default per-shape choice)."""
    return None if method is None else LoweringOptions(force=method)


def _run(op_type: str, inputs: list, options: dict | None = None, jit: bool = True,
         lowering: LoweringOptions | None = None, **kwargs) -> np.ndarray:
    """circle-jax's output of a one-op model (for ops or options LiteRT cannot run)."""
    b, feeds = one_op_model(op_type, inputs, options, **kwargs)
    model = cj.load(b.to_bytes("circle"), lowering=lowering)
    fn = jax.jit(model.apply) if jit else model.apply
    return np.asarray(fn(model.params, *feeds)[0])


def _check_without_bias(op_type: str, x: np.ndarray, w: np.ndarray, options: dict,
                        lowering: LoweringOptions | None = None) -> None:
    """LiteRT's conv kernels refuse an omitted bias ("Tensor at index 2 was optional but was
    expected"): compare circle-jax without bias to LiteRT with a zero bias."""
    zeros = np.zeros(w.shape[-1] if op_type == "CONV_3D" else w.shape[0 if op_type == "CONV_2D"
                                                                       else -1], np.float32)
    want = check_op(op_type, [x, Const(w), Const(zeros)], options, lowering=lowering)[0]
    for jit in (True, False):
        np.testing.assert_allclose(_run(op_type, [x, Const(w), None], options, jit=jit,
                                        lowering=lowering), want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- FULLY_CONNECTED


@pytest.mark.parametrize(
    "x_shape, keep, act",
    [((3, 5), False, "NONE"), ((2, 3, 5), False, "RELU"), ((2, 3, 5), True, "RELU6"),
     ((2, 2, 3, 5), True, "RELU_N1_TO_1"), ((4, 6), False, "NONE"),
     ((1, 2, 2, 5), False, "RELU")],
    ids=["rank2", "rank3-flatten", "rank3-keep", "rank4-keep", "rows-split", "rank4-flatten"],
)
def test_fully_connected(x_shape, keep, act):
    r = np.random.default_rng(2)
    n_in = 5 if x_shape[-1] == 5 else 3  # [4, 6] is read as 8 rows of 3
    bias = Const(_normal(r, 4)) if act != "NONE" else None
    check_op("FULLY_CONNECTED", [_normal(r, *x_shape), Const(_normal(r, 4, n_in)), bias],
             {"keep_num_dims": keep, "fused_activation_function": act})


def test_fully_connected_runtime_weights_and_grads():
    r = np.random.default_rng(3)
    x, w, b = _normal(r, 3, 5), _normal(r, 4, 5), _normal(r, 4)
    check_op("FULLY_CONNECTED", [x, w, b])  # weights and bias as graph inputs
    check_op_grads("FULLY_CONNECTED", [_normal(r, 2, 3, 5), Const(w), Const(b)],
                   {"keep_num_dims": True})


@pytest.mark.parametrize("options, match", [
    ({"weights_format": 1}, "weights_format"),
    ({"fused_activation_function": "TANH"}, "TANH"),
])
def test_fully_connected_unsupported(options, match):
    b = Builder()
    x = b.input("x", (2, 5))
    w = b.constant("w", np.ones((3, 5), np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, -1], options, shapes=[(2, 3)]))
    with pytest.raises(cj.UnsupportedOperatorError, match=match):  # refused at load
        cj.load(b.to_bytes("circle"))


def test_fused_relu_gradient_is_zero_at_the_kink():
    """TF's rule: ReLU passes no gradient AT 0, ReLU6 none at 6 (the pre-activation is exact)."""
    w = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    for act, value in (("RELU", 0.0), ("RELU6", 6.0)):
        b = Builder()
        x = b.input("x", (1, 2))
        bias = b.constant("bias", np.zeros(2, np.float32))
        b.output(b.op("FULLY_CONNECTED", [x, b.constant("w", w), bias],
                      {"fused_activation_function": act}))
        model = cj.load(b.to_bytes("circle"))
        xv = np.array([[value, 1.0]], np.float32)
        g = jax.grad(lambda p, xv=xv, m=model: jnp.sum(m.apply(p, xv)[0]))(model.params)
        np.testing.assert_array_equal(np.asarray(g["bias"]), [0.0, 1.0])


# ----------------------------------------------------------------------------- CONV_2D

# (lowering, options, kernel): every lowering sees SAME and VALID, strides and dilations.
CONV_ROWS = [
    ("im2col", {"padding": "SAME", "stride_h": 1, "stride_w": 1}, (3, 3)),
    ("xla", {"padding": "SAME", "stride_h": 1, "stride_w": 1}, (3, 3)),
    ("kn2row", {"padding": "SAME", "stride_h": 1, "stride_w": 1}, (3, 3)),
    ("kn2row", {"padding": "VALID", "stride_h": 2, "stride_w": 1,
                "fused_activation_function": "RELU"}, (3, 3)),
    ("im2col", {"padding": "VALID", "stride_h": 2, "stride_w": 1,
                "fused_activation_function": "RELU"}, (3, 3)),
    ("xla", {"padding": "SAME", "stride_h": 2, "stride_w": 2,
             "fused_activation_function": "RELU6"}, (2, 3)),
    ("im2col", {"padding": "SAME", "stride_h": 2, "stride_w": 2,
                "fused_activation_function": "RELU6"}, (2, 3)),
    ("im2col", {"padding": "SAME", "stride_h": 1, "stride_w": 1, "dilation_h_factor": 2,
                "dilation_w_factor": 1, "fused_activation_function": "RELU_N1_TO_1"}, (3, 3)),
    ("xla", {"padding": "VALID", "stride_h": 1, "stride_w": 2, "dilation_h_factor": 1,
             "dilation_w_factor": 2}, (3, 2)),
    ("im2col", {"padding": "VALID", "stride_h": 1, "stride_w": 2, "dilation_h_factor": 1,
                "dilation_w_factor": 2}, (3, 2)),
    ("kn2row", {"padding": "SAME", "stride_h": 2, "stride_w": 2, "dilation_h_factor": 2,
                "dilation_w_factor": 1, "fused_activation_function": "RELU6"}, (2, 3)),
    (None, {"padding": "SAME", "stride_h": 2, "stride_w": 2}, (1, 1)),
    # LiteRT's conv kernels clamp to the activation's range: TANH/SIGN_BIT change nothing.
    (None, {"padding": "SAME", "stride_h": 1, "stride_w": 1,
            "fused_activation_function": "TANH"}, (3, 3)),
    ("xla", {"padding": "VALID", "stride_h": 1, "stride_w": 1,
             "fused_activation_function": "SIGN_BIT"}, (1, 1)),
]


@pytest.mark.parametrize("method, options, kernel", CONV_ROWS)
def test_conv_2d(method, options, kernel):
    r = np.random.default_rng(4)
    x = _normal(r, 2, 7, 6, 3)
    w, b = _normal(r, 5, *kernel, 3), _normal(r, 5)
    check_op("CONV_2D", [x, Const(w), Const(b)], options, lowering=_lw(method))


@pytest.mark.parametrize("method", ["xla", "im2col", "kn2row"])
def test_conv_2d_without_bias(method):
    r = np.random.default_rng(5)
    _check_without_bias("CONV_2D", _normal(r, 1, 5, 5, 2), _normal(r, 4, 3, 3, 2),
                        {"padding": "SAME", "stride_h": 1, "stride_w": 1}, _lw(method))


@pytest.mark.parametrize("method, filter_in, c_out", [
    ("xla", 3, 4), ("im2col", 3, 4), ("im2col", 2, 9), ("shift", 2, 9),
    ("xla", 1, 12), ("im2col", 1, 12), ("shift", 1, 12), ("kn2row", 3, 4),
])
def test_conv_2d_grouped(method, filter_in, c_out):
    if (method == "shift" and filter_in != 1) or method == "kn2row":
        with pytest.raises(ValueError, match="cannot compute"):
            _run("CONV_2D", [np.zeros((1, 4, 4, 6), np.float32),
                             Const(np.zeros((c_out, 3, 3, filter_in), np.float32))],
                 {"padding": "SAME", "stride_h": 1, "stride_w": 1}, lowering=_lw(method))
        return
    r = np.random.default_rng(6)
    x, w, b = _normal(r, 2, 6, 5, 6), _normal(r, c_out, 3, 3, filter_in), _normal(r, c_out)
    check_op("CONV_2D", [x, Const(w), Const(b)],  # LiteRT needs a bias for grouped convs
             {"padding": "SAME", "stride_h": 2, "stride_w": 1, "dilation_w_factor": 2},
             lowering=_lw(method))


@pytest.mark.parametrize("method, filter_in", [("xla", 3), ("im2col", 3), ("im2col", 1),
                                               ("kn2row", 3)],
                         ids=["xla", "im2col", "im2col-3groups", "kn2row"])
def test_conv_2d_grads(method, filter_in):
    r = np.random.default_rng(7)
    x, w, b = _normal(r, 1, 6, 5, 3), _normal(r, 6, 3, 2, filter_in), _normal(r, 6)
    check_op_grads("CONV_2D", [x, Const(w), Const(b)],
                   {"padding": "SAME", "stride_h": 2, "stride_w": 1, "dilation_w_factor": 2},
                   lowering=_lw(method))


def test_conv_2d_kernel_larger_than_input_is_an_error():
    with pytest.raises(ValueError, match="larger than the padded input"):
        _run("CONV_2D", [np.zeros((1, 2, 2, 1), np.float32),
                         Const(np.zeros((1, 3, 3, 1), np.float32))],
             {"padding": "VALID", "stride_h": 1, "stride_w": 1}, shapes=[(1, 1, 1, 1)])


# ----------------------------------------------------------------------------- DEPTHWISE

DW_ROWS = [  # (lowering, options, depth multiplier)
    ("shift", {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1}, 1),
    ("xla", {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1}, 1),
    ("shift", {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 2,
               "fused_activation_function": "RELU6"}, 2),
    ("im2col", {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 2,
                "fused_activation_function": "RELU6"}, 2),
    ("shift", {"padding": "VALID", "stride_h": 1, "stride_w": 2, "depth_multiplier": 1,
               "fused_activation_function": "RELU"}, 1),
    ("shift", {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 3,
               "dilation_h_factor": 2, "dilation_w_factor": 3,
               "fused_activation_function": "RELU_N1_TO_1"}, 3),
    ("xla", {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 3,
             "dilation_h_factor": 2, "dilation_w_factor": 3,
             "fused_activation_function": "RELU_N1_TO_1"}, 3),
    ("shift", {"padding": "VALID", "stride_h": 2, "stride_w": 1, "depth_multiplier": 0,
               "fused_activation_function": "TANH"}, 1),  # 0: multiplier from the shapes
    ("im2col", {"padding": "VALID", "stride_h": 2, "stride_w": 1, "depth_multiplier": 0}, 1),
]


@pytest.mark.parametrize("method, options, m", DW_ROWS)
def test_depthwise_conv_2d(method, options, m):
    r = np.random.default_rng(8)
    x = _normal(r, 2, 8, 7, 4)
    w, b = _normal(r, 1, 3, 3, 4 * m), _normal(r, 4 * m)
    check_op("DEPTHWISE_CONV_2D", [x, Const(w), Const(b)], options, lowering=_lw(method))


def test_depthwise_conv_2d_default_lowering_no_bias():
    r = np.random.default_rng(9)
    _check_without_bias("DEPTHWISE_CONV_2D", _normal(r, 1, 9, 9, 8), _normal(r, 1, 5, 5, 8),
                        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 1})


@pytest.mark.parametrize("method", ["shift"])  # "xla" is lax's own gradient
def test_depthwise_conv_2d_grads(method):
    r = np.random.default_rng(10)
    x, w, b = _normal(r, 1, 6, 5, 3), _normal(r, 1, 3, 3, 6), _normal(r, 6)
    check_op_grads("DEPTHWISE_CONV_2D", [x, Const(w), Const(b)],
                   {"padding": "SAME", "stride_h": 2, "stride_w": 1, "depth_multiplier": 2,
                    "dilation_w_factor": 2}, lowering=_lw(method))


@pytest.mark.parametrize("shape, geom", [
    ((3, 4, 5, 2), Geometry((3, 3), (1, 2), (1, 1), ((1, 1), (1, 1)))),
    ((2, 7, 3), Geometry((3,), (2,), (2,), ((2, 1),))),  # 1-d, dilated, uneven padding
    # TF's SAME at stride 2 (the last tap's input gradient crops the high edge), and
    # unpadded with input rows no tap reads
    ((2, 6, 8, 3), Geometry((3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)))),
    ((1, 8, 5, 2), Geometry((3, 2), (2, 3), (1, 1), ((0, 0), (0, 0)))),
])
def test_depthwise_weight_gradient_in_every_ad_mode(shape, geom):
    """channelwise (its weight tangent a primitive transposed to one variadic reduction,
    its input tangent to `input_gradient`) equals plain shift_sum in value, vjp, jvp,
    forward-over-reverse (hvp), vmap over the samples and over the weights, jitted (the jvp
    eagerly too), in float64."""
    r = np.random.default_rng(11)
    c, k = shape[-1], int(np.prod(geom.kernel))
    x, tx = (_normal(r, *shape).astype(np.float64) for _ in range(2))
    wk, twk = (_normal(r, k, c).astype(np.float64) for _ in range(2))
    fast = lambda u, k: channelwise(u, k, geom)  # noqa: E731
    plain = lambda u, k: shift_sum(u, k, geom)  # noqa: E731

    def derivatives(fn):
        y, vjp = jax.vjp(fn, x, wk)
        tangent = jax.jvp(fn, (x, wk), (tx, twk))[1]
        hvp = jax.jvp(jax.grad(lambda k: jnp.sum(fn(x, k) ** 2)), (wk,), (twk,))[1]
        per_sample = jax.vmap(jax.grad(lambda u, k: jnp.sum(jnp.sin(fn(u[None], k))),
                                       argnums=1), (0, None))(x, wk)
        per_weights = jax.vmap(jax.grad(lambda k: jnp.sum(jnp.sin(fn(x, k)))))(
            jnp.stack([wk, twk]))
        jacobian = jax.jacfwd(fn, argnums=1)(x, wk)  # the weight tangent mapped over twk
        mapped_x = jax.vmap(lambda u: jax.jvp(fn, (u, wk), (u, twk))[1])(jnp.stack([x, tx]))
        return (y, vjp(jnp.cos(y)), tangent, hvp, per_sample, per_weights, jacobian,
                mapped_x)

    with jax.enable_x64():
        x, tx, wk, twk = map(jnp.asarray, (x, tx, wk, twk))
        eager = lambda fn: jax.jvp(fn, (x, wk), (tx, twk))  # noqa: E731 (the primitive's impl)
        for run in (jax.jit(derivatives, static_argnums=0), eager):
            got, want = run(fast), run(plain)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        text = jax.jit(jax.grad(lambda k: jnp.sum(fast(x, k)))).lower(wk).as_text()
    assert f":{k} = stablehlo.reduce" in text  # one reduction for every tap


def test_depthwise_multiplier_mismatch_is_an_error():
    with pytest.raises(ValueError, match="depth_multiplier"):
        _run("DEPTHWISE_CONV_2D", [np.zeros((1, 4, 4, 2), np.float32),
                                   Const(np.zeros((1, 3, 3, 4), np.float32))],
             {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 3},
             shapes=[(1, 4, 4, 4)])


# ----------------------------------------------------------------------------- CONV_3D


@pytest.mark.parametrize("method, options, bias", [
    ("im2col", {"padding": "SAME", "stride_d": 1, "stride_h": 1, "stride_w": 1}, True),
    ("xla", {"padding": "VALID", "stride_d": 2, "stride_h": 1, "stride_w": 2,
             "fused_activation_function": "RELU"}, False),
    ("im2col", {"padding": "SAME", "stride_d": 1, "stride_h": 2, "stride_w": 1,
                "dilation_d_factor": 2, "dilation_h_factor": 1, "dilation_w_factor": 2,
                "fused_activation_function": "RELU6"}, True),
    ("kn2row", {"padding": "SAME", "stride_d": 1, "stride_h": 1, "stride_w": 1}, True),
])
def test_conv_3d(method, options, bias):
    r = np.random.default_rng(12)
    x, w = _normal(r, 2, 5, 6, 5, 3), _normal(r, 2, 3, 2, 3, 4)
    if bias:
        check_op("CONV_3D", [x, Const(w), Const(_normal(r, 4))], options, lowering=_lw(method))
    else:
        _check_without_bias("CONV_3D", x, w, options, _lw(method))


@pytest.mark.parametrize("method", ["im2col", "kn2row"])  # "xla" is lax's own gradient
def test_conv_3d_grads(method):
    r = np.random.default_rng(13)
    check_op_grads("CONV_3D", [_normal(r, 1, 3, 4, 3, 2), Const(_normal(r, 2, 2, 3, 2, 3)),
                               Const(_normal(r, 3))],
                   {"padding": "SAME", "stride_d": 1, "stride_h": 2, "stride_w": 1},
                   lowering=_lw(method))


# ----------------------------------------------------------------------------- TRANSPOSE_CONV

TC_ROWS = [  # (lowering, input HW, kernel, strides, padding, output HW, activation)
    ("col2im", (5, 4), (3, 3), (2, 2), "SAME", (10, 8), "NONE"),
    ("xla", (5, 4), (3, 3), (2, 2), "SAME", (10, 8), "NONE"),
    ("col2im", (5, 4), (3, 3), (2, 2), "VALID", (11, 9), "RELU"),
    ("xla", (5, 4), (3, 3), (2, 2), "VALID", (11, 9), "RELU"),
    ("col2im", (4, 4), (4, 4), (2, 2), "SAME", (8, 8), "RELU6"),
    ("xla", (4, 5), (2, 2), (2, 2), "VALID", (8, 10), "RELU_N1_TO_1"),
    ("col2im", (5, 5), (3, 2), (1, 2), "SAME", (5, 10), "NONE"),
    ("col2im", (5, 4), (3, 3), (2, 2), "SAME", (9, 7), "NONE"),  # SAME from the output size
    ("xla", (5, 4), (3, 3), (2, 2), "SAME", (9, 7), "NONE"),
    ("col2im", (5, 4), (3, 3), (2, 1), "VALID", (12, 6), "NONE"),  # a row more: bias only
    ("xla", (5, 4), (3, 3), (2, 1), "VALID", (12, 6), "NONE"),
    (None, (3, 3), (1, 1), (1, 1), "VALID", (3, 3), "TANH"),  # TANH: no-op in LiteRT
]


@pytest.mark.parametrize("method, in_hw, kernel, strides, padding, out_hw, act", TC_ROWS)
def test_transpose_conv(method, in_hw, kernel, strides, padding, out_hw, act):
    r = np.random.default_rng(14)
    x, w, b = _normal(r, 2, *in_hw, 3), _normal(r, 4, *kernel, 3), _normal(r, 4)
    shape = Const(np.array([2, *out_hw, 4], np.int32))
    options = {"padding": padding, "stride_h": strides[0], "stride_w": strides[1],
               "fused_activation_function": act}
    check_op("TRANSPOSE_CONV", [shape, Const(w), x, Const(b) if act != "NONE" else None],
             options, lowering=_lw(method))


@pytest.mark.parametrize("method", ["xla", "col2im"])
def test_transpose_conv_grads(method):
    r = np.random.default_rng(15)
    shape = Const(np.array([1, 9, 8, 3], np.int32))
    check_op_grads("TRANSPOSE_CONV", [shape, Const(_normal(r, 3, 3, 4, 2)),
                                      _normal(r, 1, 5, 4, 2), Const(_normal(r, 3))],
                   {"padding": "SAME", "stride_h": 2, "stride_w": 2}, lowering=_lw(method))


def test_transpose_conv_batch_comes_from_the_input():
    """output_shape says batch 1; a batch of 3 gives each sample's batch-1 result."""
    r = np.random.default_rng(16)
    x, w = _normal(r, 3, 4, 4, 2), _normal(r, 3, 3, 3, 2)
    b = Builder()
    xi = b.input("x", (1, 4, 4, 2))
    shape = b.constant("shape", np.array([1, 8, 8, 3], np.int32))
    b.output(b.op("TRANSPOSE_CONV", [shape, b.constant("w", w), xi, -1],
                  {"padding": "SAME", "stride_h": 2, "stride_w": 2}))
    model = cj.load(b.to_bytes("circle"))
    batched = np.asarray(model(x)[0])
    assert batched.shape == (3, 8, 8, 3)
    for i in range(3):
        np.testing.assert_allclose(batched[i:i + 1], model(x[i:i + 1])[0], rtol=1e-6)


def test_real_model_transpose_conv_with_bias():
    data = Path(shared_model("aeq_single_conv2d_transpose_bias.tflite")).read_bytes()
    x = _normal(np.random.default_rng(17), 1, 16, 16, 1)
    want = run_litert(data, [x])[0]
    model = cj.load(data)
    np.testing.assert_allclose(jax.jit(model.apply)(model.params, x)[0], want, rtol=1e-5,
                               atol=1e-5)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x)[0] ** 2)))(model.params)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.values())


def test_real_model_batch_matmul():
    data = Path(shared_model("aeq_bmm.tflite")).read_bytes()
    r = np.random.default_rng(18)
    feeds = [_normal(r, 2, 4, 16), _normal(r, 2, 16, 8)]
    want = run_litert(data, feeds)[0]
    model = cj.load(data)
    np.testing.assert_allclose(jax.jit(model.apply)(model.params, *feeds)[0], want,
                               rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- MediaPipe op


def _transpose_conv_reference(x, w, b, strides, padding_same):
    """numpy scatter form of MediaPipe's Convolution2DTransposeBias."""
    n, h, wd, _ = x.shape
    c_out, kh, kw, _ = w.shape
    trims = [max(0, k - (i - 1) % s - 1) if padding_same else 0
             for i, k, s in zip((h, wd), (kh, kw), strides, strict=True)]
    out_h, out_w = (s * (i - 1) + k - t for i, k, s, t in
                    zip((h, wd), (kh, kw), strides, trims, strict=True))
    out = np.tile(b.astype(np.float64), (n, out_h, out_w, 1))
    for iy in range(h):
        for ix in range(wd):
            for fy in range(kh):
                for fx in range(kw):
                    oy = iy * strides[0] - trims[0] // 2 + fy
                    ox = ix * strides[1] - trims[1] // 2 + fx
                    if 0 <= oy < out_h and 0 <= ox < out_w:
                        out[:, oy, ox] += x[:, iy, ix].astype(np.float64) @ w[:, fy, fx].T
    return out.astype(np.float32)


def _tcb_options(padding: int, stride_w: int, stride_h: int) -> bytes:
    return struct.pack("<3i", padding, stride_w, stride_h)


@pytest.mark.parametrize("method, in_hw, kernel, strides, same", [
    ("col2im", (4, 5), (4, 4), (2, 2), True),
    ("xla", (4, 5), (4, 4), (2, 2), True),
    ("col2im", (4, 5), (3, 3), (2, 2), True),
    ("xla", (5, 4), (2, 2), (2, 2), False),
    ("col2im", (5, 4), (3, 2), (1, 2), True),
    ("col2im", (3, 4), (3, 3), (3, 1), False),
    ("xla", (3, 4), (3, 3), (3, 1), False),
])
def test_convolution_2d_transpose_bias(method, in_hw, kernel, strides, same):
    """LiteRT has no kernel for this MediaPipe op: numpy reference, and LiteRT's
    TRANSPOSE_CONV + bias with the same output size (TFLite's SAME padding agrees)."""
    r = np.random.default_rng(19)
    x, w, b = _normal(r, 2, *in_hw, 3), _normal(r, 5, *kernel, 3), _normal(r, 5)
    opts = _tcb_options(1 if same else 2, strides[1], strides[0])
    want = _transpose_conv_reference(x, w, b, strides, same)
    inputs = [x, Const(w), Const(b)]
    kwargs = {"custom_code": "Convolution2DTransposeBias", "custom_options": opts}
    got = _run("CUSTOM", inputs, jit=method == "col2im", lowering=_lw(method), **kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    builtin = check_op("TRANSPOSE_CONV", [Const(np.array(want.shape, np.int32)), Const(w), x,
                                          Const(b)],
                       {"padding": "SAME" if same else "VALID", "stride_h": strides[0],
                        "stride_w": strides[1]})[0]
    np.testing.assert_allclose(want, builtin, rtol=1e-5, atol=1e-5)


def test_convolution_2d_transpose_bias_grads():
    r = np.random.default_rng(23)
    check_op_grads("CUSTOM", [_normal(r, 1, 3, 2, 2), Const(_normal(r, 2, 3, 3, 2)),
                              Const(_normal(r, 2))],
                   custom_code="Convolution2DTransposeBias", custom_options=_tcb_options(1, 2, 2))


@pytest.mark.parametrize("options, match", [
    (b"\x01\x00\x00\x00", "12 bytes"),
    (None, "12 bytes"),
    (_tcb_options(0, 2, 2), "padding 0"),
    (_tcb_options(1, 0, 2), "strides"),
])
def test_convolution_2d_transpose_bias_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        _run("CUSTOM", [np.zeros((1, 2, 2, 1), np.float32),
                        Const(np.zeros((1, 2, 2, 1), np.float32)),
                        Const(np.zeros(1, np.float32))],
             custom_code="Convolution2DTransposeBias", custom_options=options,
             shapes=[(1, 4, 4, 1)])


def test_transpose_conv_bias_options_layout_as_in_mediapipe_models():
    # The bytes converted MediaPipe models carry: SAME (TfLitePadding 1), stride 2 x 2.
    assert parse_transpose_conv_bias_options(bytes.fromhex("010000000200000002000000")) \
        == (1, 2, 2)


# ----------------------------------------------------------------------------- BATCH_MATMUL


@pytest.mark.parametrize("adj_x, adj_y, x_batch, y_batch", [
    (False, False, (2,), (2,)), (True, False, (2, 1), (3,)), (False, True, (), ()),
    (True, True, (1,), (2, 3)), (False, False, (2, 1), (1, 3)), (True, True, (2,), (2,)),
])
def test_batch_matmul(adj_x, adj_y, x_batch, y_batch):
    r = np.random.default_rng(20)
    x = _normal(r, *x_batch, *((4, 3) if adj_x else (3, 4)))
    y = _normal(r, *y_batch, *((5, 4) if adj_y else (4, 5)))
    check_op("BATCH_MATMUL", [x, y], {"adjoint_lhs": adj_x, "adjoint_rhs": adj_y})


def test_batch_matmul_grads_and_constant_rhs():
    r = np.random.default_rng(21)
    x, y = _normal(r, 2, 1, 3, 4), _normal(r, 3, 5, 4)
    check_op("BATCH_MATMUL", [x, Const(y)], {"adjoint_rhs": True})
    check_op_grads("BATCH_MATMUL", [x, Const(y)], {"adjoint_rhs": True})


@pytest.mark.parametrize("opts", [None, {"adj_x": True}, {"adj_y": True},
                                  {"adj_x": True, "adj_y": True, "T": 1}])
def test_custom_batch_matmul_v2(opts):
    """TF's BatchMatMulV2 (LiteRT has no kernel): numpy reference, FlexBuffer options."""
    r = np.random.default_rng(22)
    adj_x, adj_y = bool((opts or {}).get("adj_x")), bool((opts or {}).get("adj_y"))
    x = _normal(r, 2, 1, *((4, 3) if adj_x else (3, 4)))
    y = _normal(r, 3, *((5, 4) if adj_y else (4, 5)))
    raw = bytes(flexbuffers.Dumps(opts)) if opts is not None else None
    kwargs = {"custom_code": "BatchMatMulV2", "custom_options": raw}
    xr = np.swapaxes(x, -1, -2) if adj_x else x
    yr = np.swapaxes(y, -1, -2) if adj_y else y
    want = np.matmul(xr.astype(np.float64), yr.astype(np.float64))
    np.testing.assert_allclose(_run("CUSTOM", [x, y], jit=opts is not None, **kwargs), want,
                               rtol=1e-5, atol=1e-5)


def test_custom_batch_matmul_v2_bad_options():
    with pytest.raises(ValueError, match="FlexBuffer"):
        _run("CUSTOM", [np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32)],
             custom_code="BatchMatMulV2", custom_options=bytes(flexbuffers.Dumps([1, 2])),
             shapes=[(2, 2)])


# ----------------------------------------------------------------------------- dispatch


def test_dispatch_rule():
    choose = conv.choose_conv_lowering
    assert choose((3, 3), 32, 32, 32, 16 * 64 * 64) == "shift"  # depthwise, any size
    assert choose((3, 3), 32, 32, 4, 16 * 16 * 16) == "im2col"  # grouped
    assert choose((1, 1), 256, 64, 1, 16 * 32 * 32) == "im2col"  # 1x1: a plain matmul
    assert choose((3, 3), 8, 8, 1, 1 * 8 * 8, (1, 1)) == "kn2row"  # the example, tiny batches
    assert choose((3, 3), 8, 8, 1, 4 * 8 * 8, (1, 1)) == "kn2row"
    assert choose((3, 3), 8, 8, 1, 16 * 8 * 8, (1, 1)) == "im2col"  # batch 16: im2col
    assert choose((3, 3), 8, 16, 1, 1 * 8 * 8, (1, 1)) == "im2col"  # C_out > C_in
    assert choose((3, 3), 8, 8, 1, 1 * 8 * 8, (2, 2)) == "im2col"  # strided
    assert choose((3, 3), 64, 64, 1, 1 * 8 * 8, (1, 1)) == "xla"  # ResNet-8 8x8x64: not kn2row
    assert choose((3, 3), 64, 64, 1, 16 * 16 * 16) == "xla"
    assert choose((3, 3), 16, 16, 1, 16 * 64 * 64) == "xla"  # im2col matrix too large
    choose_t = transpose_conv.choose_transpose_conv_lowering
    assert choose_t((4, 4), 8, 16 * 16 * 16) == "col2im"
    assert choose_t((4, 4), 256, 16 * 128 * 128) == "xla"  # 1 GiB


def test_force_lowering_validates():
    with pytest.raises(ValueError, match="unknown lowering"):
        LoweringOptions(force="fft")
    with pytest.raises(ValueError, match="cannot compute"):
        _run("CONV_2D", [np.zeros((1, 4, 4, 2), np.float32),
                         Const(np.zeros((2, 3, 3, 2), np.float32))],
             {"padding": "SAME", "stride_h": 1, "stride_w": 1}, shapes=[(1, 4, 4, 2)],
             lowering=_lw("col2im"))


# ----------------------------------------------------------------------------- derivatives


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kernel", ["matmul_2d", "matmul_nt"])
def test_matmul_weight_gradient_of_one_row(rows, kernel):
    """The custom jvps of matmul_2d (a zero row appended for a single row) and matmul_nt
    (the weight gradient from the output gradient's barred transpose) give the gradients,
    jvp and Hessian-vector product of a plain matmul, in float64."""
    r = np.random.default_rng(22)
    with jax.enable_x64(True):
        x, w = jnp.asarray(r.standard_normal((rows, 5))), jnp.asarray(r.standard_normal((5, 3)))
        g = jnp.asarray(r.standard_normal((rows, 3)))
        if kernel == "matmul_2d":
            f, wt = matmul.matmul_2d, w
        else:  # [O, K] weights
            f, wt = matmul.matmul_nt, w.T
        got = jax.grad(lambda x, w: jnp.sum(f(x, w) * g), (0, 1))(x, wt)
        np.testing.assert_allclose(got[0], g @ w.T, rtol=1e-12)
        np.testing.assert_allclose(got[1], x.T @ g if kernel == "matmul_2d" else g.T @ x,
                                   rtol=1e-12)
        tx, tw = jnp.ones_like(x), jnp.asarray(r.standard_normal(wt.shape))
        want = tx @ w + x @ (tw if kernel == "matmul_2d" else tw.T)
        np.testing.assert_allclose(jax.jvp(f, (x, wt), (tx, tw))[1], want, rtol=1e-12)

        def hvp(f):
            return jax.jvp(jax.grad(lambda w: jnp.sum(jnp.tanh(f(x, w)))), (wt,), (tw,))[1]

        plain = jnp.matmul if kernel == "matmul_2d" else (lambda x, w: x @ w.T)
        np.testing.assert_allclose(hvp(f), hvp(plain), rtol=1e-10)
        # and under vmap (per-sample gradients), the jvp of the batched product
        xs = jnp.asarray(r.standard_normal((2, rows, 5)))
        per = jax.vmap(lambda x: jax.grad(lambda w: jnp.sum(jnp.tanh(f(x, w))))(wt))(xs)
        ref = jax.vmap(lambda x: jax.grad(lambda w: jnp.sum(jnp.tanh(plain(x, w))))(wt))(xs)
        np.testing.assert_allclose(per, ref, rtol=1e-12)


@pytest.mark.parametrize("rows", [4, 16])
def test_dense_weight_gradient_is_a_library_gemm(rows):
    """FULLY_CONNECTED's weight gradient [O, K] is a GEMM of the output gradient's
    materialized transpose and the inputs (lhs contracting its last axis), which XLA CPU
    hands to YNNPACK, not its own dot contracting both operands' first axis. (At batch 1
    XLA makes the product of one row an elementwise outer product.)"""
    r = np.random.default_rng(25)
    x = jnp.asarray(r.standard_normal((rows, 64)), jnp.float32)
    w = jnp.asarray(r.standard_normal((10, 64)), jnp.float32)
    step = jax.jit(jax.grad(lambda w: jnp.sum(jax.nn.softmax(matmul.matmul_nt(x, w)) ** 2)))
    hlo = step.lower(w).compile().as_text()
    producers = [line for line in hlo.splitlines()
                 if " = f32[10,64]" in line and (" dot(" in line or "__ynn" in line)]
    assert producers, hlo
    assert not any("lhs_contracting_dims={0}" in line for line in producers), producers


def test_one_row_weight_gradient_stays_a_matmul():
    """At batch 1 the dense layer's weight gradient is a dot in the compiled step, not an
    elementwise outer product fused with (and recomputing) its producers."""
    r = np.random.default_rng(23)
    x, w = jnp.asarray(r.standard_normal((1, 128)), jnp.float32), jnp.asarray(
        r.standard_normal((128, 10)), jnp.float32)
    step = jax.jit(jax.grad(lambda w: jnp.sum(jax.nn.softmax(matmul.matmul_2d(x, w)) ** 2)))
    hlo = step.lower(w).compile().as_text()
    producers = [line for line in hlo.splitlines()
                 if " = f32[128,10]" in line or " = f32[10,128]" in line]
    assert any(" dot(" in line or "__ynn" in line for line in producers), producers


@pytest.mark.parametrize("k, o", [(72, 8), (8, 72)])
def test_weight_gradient_rows_are_the_smaller_dimension(k, o):
    """The weight gradient of a tall product is the dot whose result has the smaller of
    K and O as rows, the operand order XLA CPU runs 1.3-3x faster (_matmul's docstring)."""
    r = np.random.default_rng(24)
    x, w = jnp.asarray(r.standard_normal((1024, k)), jnp.float32), jnp.asarray(
        r.standard_normal((k, o)), jnp.float32)
    step = jax.jit(jax.grad(lambda w: jnp.sum(jnp.tanh(matmul.matmul_2d(x, w)))))
    dots = [line for line in step.lower(w).compile().as_text().splitlines()
            if " dot(" in line or "__ynn" in line]
    small, large = min(k, o), max(k, o)
    assert any(f" = f32[{small},{large}]" in line for line in dots), dots
    assert not any(f" = f32[{large},{small}]" in line for line in dots), dots
