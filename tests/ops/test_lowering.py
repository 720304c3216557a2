"""Every fast kernel of ``circle_jax.lowering`` against its reference in ``circle_jax.ops``:
values and derivatives in float64, in every AD mode the kernel supports (reverse, forward),
jitted; the default lowering against ``lowering="reference"`` on every
shared model (outputs here; float64 gradients in tests/test_sweep.py, at batch 2 against the
reference's per-sample sums); load-time checks gathering every refusal into one error.

Tolerances: float64 kernels differ from their reference only by summation order, so 1e-9
relative (they agree to ~1e-14; 1e-9 leaves room for other BLAS builds). Whole float32
models: 1e-4 relative / 1e-4 absolute on outputs, a few float32 roundings per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.lowering import LoweringOptions, as_options, conv, matmul, pooling, resize
from circle_jax.lowering.depthwise import channelwise
from circle_jax.lowering.transpose_conv import transpose_conv_nd
from circle_jax.ops import conv as ref_conv
from circle_jax.ops import pooling as ref_pool
from circle_jax.ops import resize as ref_resize
from circle_jax.ops.common import padding_pairs
from tests.paths import shared_model, shared_model_names
from tests.test_sweep import REFUSED

RTOL = 1e-9


def _same(fast: Callable, ref: Callable, args: Sequence[np.ndarray], forward: bool = True
          ) -> None:
    """``fast`` equals ``ref`` in value, vjp and (``forward``) jvp, both jitted, in float64.

    Not eagerly too: a kernel without control flow on concrete values runs the same
    primitives eagerly, one compile per primitive (the eager pass cost a third of this
    module's time); the eager forward of every operator is checked by
    `tests.conformance.check_op`."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        xs = [jnp.asarray(a, jnp.float64) for a in args]
        ts = [jnp.asarray(rng.standard_normal(a.shape)) for a in xs]
        ref, fast = jax.jit(ref), jax.jit(fast)
        y_ref, vjp_ref = jax.vjp(ref, *xs)
        ct = jnp.asarray(rng.standard_normal(y_ref.shape))
        want = (y_ref, vjp_ref(ct), jax.jvp(ref, xs, ts)[1] if forward else None)
        y, vjp = jax.vjp(fast, *xs)
        got = (y, vjp(ct), jax.jvp(fast, xs, ts)[1] if forward else None)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL)


def _normal(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


# ----------------------------------------------------------------------------- convolutions

CONVS = [  # x shape, filter [*K, C_in/groups, C_out], strides, dilations, padding, methods
    ((2, 7, 6, 3), (3, 3, 3, 5), (1, 1), (1, 1), 0, ("im2col", "kn2row", "xla")),
    ((2, 7, 6, 3), (3, 2, 3, 4), (2, 1), (1, 2), 0, ("im2col", "kn2row", "xla")),
    ((1, 6, 6, 4), (1, 1, 4, 6), (2, 2), (1, 1), 1, ("im2col", "kn2row", "xla")),
    ((2, 6, 5, 6), (3, 3, 2, 9), (2, 1), (1, 2), 0, ("im2col", "xla")),  # 3 groups
    ((2, 6, 5, 4), (3, 3, 1, 8), (1, 2), (1, 1), 0, ("shift", "im2col", "xla")),  # depthwise
    ((1, 3, 4, 3, 2), (2, 2, 3, 2, 3), (1, 2, 1), (1, 1, 1), 0, ("im2col", "kn2row", "xla")),
]


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("x_shape, w_shape, strides, dilations, padding, methods", CONVS)
def test_conv_methods_match_reference(monkeypatch, x_shape, w_shape, strides, dilations,
                                      padding, methods, transposed):
    """Every lowering equals the reference (float64: value, vjp, jvp), with the weight
    gradient from a materialized transpose (these small products) and without (the GEMM
    operand order of large ones, `matmul.TRANSPOSED_OPERAND_ELEMENTS` set to 0)."""
    if not transposed:
        monkeypatch.setattr(conv, "TRANSPOSED_OPERAND_ELEMENTS", 0)
        monkeypatch.setattr(matmul, "TRANSPOSED_OPERAND_ELEMENTS", 0)
        jax.clear_caches()  # _conv_impl's traces were made with the default
    nd = len(strides)
    pads = padding_pairs(padding, x_shape[1:-1], w_shape[:nd], strides, dilations)
    g = ref_conv.Geometry(w_shape[:nd], strides, dilations, tuple(tuple(p) for p in pads))
    x, w = _normal(*x_shape), _normal(*w_shape, seed=2)
    for method in methods:
        _same(lambda a, b, m=method: conv.conv_nd(a, b, g, m),
              lambda a, b: ref_conv.conv(a, b, g), [x, w])


@pytest.mark.parametrize("method", ["im2col", "kn2row"])
def test_small_conv_weight_gradient_is_a_library_gemm(method):
    """A small convolution's weight gradient is a GEMM contracting the lhs's last axis
    (XLA CPU's library GEMM), not XLA's own dot contracting both operands' first axis."""
    g = ref_conv.Geometry((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)))
    x = jnp.asarray(_normal(1, 8, 8, 4), jnp.float32)
    w = jnp.asarray(_normal(3, 3, 4, 4, seed=2), jnp.float32)
    step = jax.jit(jax.grad(lambda w: jnp.sum(jnp.tanh(conv.conv_nd(x, w, g, method)))))
    dots = [line for line in step.lower(w).compile().as_text().splitlines()
            if " dot(" in line]
    assert not any("lhs_contracting_dims={0}" in line for line in dots), dots


def test_depthwise_channelwise_matches_reference():
    g = ref_conv.Geometry((3, 3), (1, 2), (1, 1), ((1, 1), (1, 1)))
    x, wk = _normal(3, 4, 5, 2), _normal(9, 2, seed=2)
    _same(lambda a, b: channelwise(a, b, g),
          lambda a, b: ref_conv.conv(a, b.reshape(3, 3, 1, 2), g), [x, wk])


@pytest.mark.parametrize("in_hw, kernel, strides, before, out_hw", [
    ((5, 4), (3, 3), (2, 2), (1, 1), (10, 8)),
    ((3, 3), (4, 4), (2, 2), (1, 1), (6, 6)),
    ((4, 5), (2, 3), (1, 2), (0, 1), (5, 10)),
])
def test_col2im_matches_reference(in_hw, kernel, strides, before, out_hw):
    g = ref_conv.TransposeGeometry(out_hw, strides, before)
    x, w = _normal(2, *in_hw, 3), _normal(4, *kernel, 3, seed=2)
    _same(lambda a, b: transpose_conv_nd(a, b, g, "col2im"),
          lambda a, b: ref_conv.transpose_conv_2d(a, b, g), [x, w])


@pytest.mark.parametrize("rows, k, o", [(1, 5, 3), (3, 5, 3), (4, 3, 7), (1, 128, 10)])
@pytest.mark.parametrize("kernel", ["matmul_2d", "small_matmul"])
def test_matmul_matches_reference(rows, k, o, kernel):
    _same(getattr(matmul, kernel), jnp.matmul, [_normal(rows, k), _normal(k, o, seed=2)])


@pytest.mark.parametrize("rows, small", [(16, True), (256, False)])
def test_fully_connected_takes_the_small_product_by_size(rows, small):
    """A FULLY_CONNECTED of at most SMALL_MATMUL_MACS multiply-adds has no dot in its
    compiled step (forward and gradients); a larger one keeps its GEMMs. Both equal the
    reference."""
    b = Builder()
    x = b.input("x", (rows, 6))
    w = b.constant("w", _normal(8, 6).astype(np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, -1], {"fused_activation_function": 1}))
    assert (rows * 6 * 8 <= matmul.SMALL_MATMUL_MACS) == small
    data = b.to_bytes("circle")
    fast, ref = cj.load(data), cj.load(data, lowering="reference")
    xs = _normal(rows, 6).astype(np.float32)

    def grads(model):
        return jax.jit(jax.value_and_grad(lambda p: jnp.sum(model.apply(p, xs)[0] ** 2)))

    hlo = grads(fast).lower(fast.params).compile().as_text()
    assert (" dot(" not in hlo and "dot_general" not in hlo.split("ENTRY")[-1]) == small
    for got, want in zip(jax.tree.leaves(grads(fast)(fast.params)),
                         jax.tree.leaves(grads(ref)(ref.params)), strict=True):
        # float32, different summation orders: 1e-5 of the largest value
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))


# ----------------------------------------------------------------------------- pooling


def _window(x_shape, kernel, strides, padding):
    pads = padding_pairs(padding, x_shape[1:3], kernel, strides)
    return kernel, strides, tuple(tuple(p) for p in pads)


POOLS = [((2, 8, 8, 3), (2, 2), (2, 2), 1), ((2, 7, 9, 3), (3, 3), (2, 2), 0),
         ((1, 6, 6, 2), (3, 3), (1, 1), 0), ((1, 11, 11, 2), (11, 11), (11, 11), 1),
         ((1, 7, 5, 2), (2, 2), (2, 2), 0), ((1, 10, 10, 2), (5, 5), (5, 5), 1)]


@pytest.mark.parametrize("x_shape, kernel, strides, padding", POOLS)
def test_pooling_matches_reference(x_shape, kernel, strides, padding):
    window = _window(x_shape, kernel, strides, padding)
    # values on a coarse grid: many ties, so the first-max gradient rule is exercised
    x = np.round(_normal(*x_shape) * 2) / 2
    _same(lambda a: pooling.window_max(a, window), lambda a: ref_pool.window_max(a, window),
          [x], forward=False)
    _same(lambda a: pooling.window_mean(a, window), lambda a: ref_pool.window_mean(a, window),
          [x])


# ----------------------------------------------------------------------------- resize


@pytest.mark.parametrize("bilinear", [True, False])
@pytest.mark.parametrize("n_in, n_out, align, half", [
    (4, 8, False, False), (5, 3, False, True), (3, 7, True, False), (4, 9, False, True)])
def test_resample_matches_reference(bilinear, n_in, n_out, align, half):
    spec = ref_resize.AxisResampling(bilinear, n_in, n_out, align, half)
    x = _normal(2, n_in, 3, 2)
    _same(lambda a: resize.resample(a, 1, spec), lambda a: ref_resize.resample(a, 1, spec), [x],
          forward=False)


# ----------------------------------------------------------------------------- options


def test_options():
    assert as_options(None) == LoweringOptions()
    assert as_options("reference").fast is False
    assert LoweringOptions(backend="gpu").fast is False  # the reference off CPU ...
    assert LoweringOptions(kind="fast", backend="gpu").fast is True  # ... unless told
    assert LoweringOptions(backend="cpu").fast is True
    assert LoweringOptions(force="im2col", backend="tpu").fast is True
    with pytest.raises(ValueError, match="lowering kind"):
        LoweringOptions(kind="quick")
    with pytest.raises(ValueError, match="lowering must be"):
        as_options("quick")


def test_in_loop_lowering_chooses_im2col():
    """A convolution too large for im2col in straight-line code takes it in a loop body."""
    b = Builder()
    x = b.input("x", (16, 64, 64, 16))
    w = b.constant("w", _normal(16, 3, 3, 16).astype(np.float32))
    b.output(b.op("CONV_2D", [x, w, -1], {"padding": "SAME", "stride_h": 1, "stride_w": 1}))
    model = cj.load(b.to_bytes("circle"))
    feed = jnp.zeros((16, 64, 64, 16), jnp.float32)

    def hlo(apply: Callable) -> str:
        return jax.jit(apply).lower(model.params, feed).as_text()

    assert "convolution" in hlo(model.apply)
    assert "convolution" not in hlo(model.lowered(in_loop=True))
    assert model.lowering.in_loop is False  # the model itself is unchanged


# ----------------------------------------------------------------------------- whole models

# tests/test_sweep.py compares the two lowerings' float64 outputs (and gradients) on every
# model it does not refuse; this float32 comparison covers the shared models it refuses.
SHARED = shared_model_names(among=REFUSED)


INPUT_SHAPES = {"oww_melspectrogram.tflite": [(1, 1760)]}  # dynamic input: a concrete size


def _feeds(name: str, model: cj.Model) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    shapes = INPUT_SHAPES.get(name, [s.shape for s in model.inputs])
    return [rng.standard_normal(shape).astype(s.dtype) if "float" in s.dtype
            else np.zeros(shape, s.dtype) for s, shape in zip(model.inputs, shapes, strict=True)]


#: Models whose reference runs eagerly, and why (every other one runs jitted).
EAGER = {
    # XLA CPU (JAX 0.10.2) miscompiles the jitted reference: it fuses several plain grouped
    # convolutions and a reduce_window max into one loop fusion, and the pooled values come
    # out wrong by up to 5 (eager and the default lowering agree; benchmarks/README.md).
    "mediapipe_face_detection_short_range_fp16w.tflite",
    "one_vscode_while_000.circle",  # its WHILE needs concrete trip counts: eager only
}


@pytest.mark.parametrize("name", SHARED)
def test_reference_equals_default_on_shared_models(name):
    """Outputs of every shared model agree between the default and the reference lowering
    (float32, 1e-4)."""
    path = shared_model(name)
    fast, ref = cj.load(path), cj.load(path, lowering="reference")
    assert fast.lowering.fast and not ref.lowering.fast
    feeds = _feeds(name, fast)
    while_loop = name.startswith("one_vscode_while")
    got = (fast.apply if while_loop else jax.jit(fast.apply))(fast.params, *feeds)
    want = (ref.apply if name in EAGER else jax.jit(ref.apply))(ref.params, *feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- load checks


def test_load_gathers_every_refusal():
    """Bad options of several operators are all named in the one error ``load`` raises."""
    b = Builder()
    x = b.input("x", (1, 6, 6, 2))
    w = b.constant("w", np.ones((2, 3, 3, 2), np.float32))
    c = b.op("CONV_2D", [x, w, -1], {"padding": "SAME", "stride_h": -1, "stride_w": 1},
             shapes=[(1, 6, 6, 2)])
    p = b.op("MAX_POOL_2D", [c], {"padding": "VALID", "stride_h": 2, "stride_w": 2,
                                  "filter_height": 0, "filter_width": 2}, shapes=[(1, 3, 3, 2)])
    r = b.op("RESHAPE", [p, b.constant("s", np.array([1, 18], np.int32))], shapes=[(1, 18)])
    fc = b.op("FULLY_CONNECTED", [r, b.constant("fw", np.ones((4, 18), np.float32)), -1],
              {"weights_format": 1}, shapes=[(1, 4)])
    b.output(b.op("ADD", [fc, fc], {"fused_activation_function": 9}, shapes=[(1, 4)]))
    with pytest.raises(cj.UnsupportedOperatorError) as e:
        cj.load(b.to_bytes("circle"))
    text = str(e.value)
    assert "4 unsupported operator(s)" in text and "\n" not in text
    for what in ("CONV_2D", "stride_h=-1", "MAX_POOL_2D", "filter_height=0",
                 "FULLY_CONNECTED", "weights_format 1", "ADD", "fused activation code 9"):
        assert what in text, what


def test_invalid_options_are_a_format_error():
    """Refusals that are all invalid values (nothing unsupported) are a CircleFormatError."""
    b = Builder()
    x = b.input("x", (1, 4, 4, 1))
    p = b.op("AVERAGE_POOL_2D", [x], {"padding": 7, "stride_h": 1, "stride_w": 1,
                                      "filter_height": 2, "filter_width": 2},
             shapes=[(1, 4, 4, 1)])
    b.output(b.op("RELU", [p]))
    with pytest.raises(cj.CircleFormatError, match=r"1 invalid operator\(s\).*padding 7"):
        cj.load(b.to_bytes("circle"))
