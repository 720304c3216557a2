"""Hybrid operators (float activations, int8/int4 weights with per-channel or per-tensor
scales) compute as LiteRT's hybrid kernels: equal to LiteRT's output (``array_equal``), on
random weights, inputs of varied scale and offset, and options; their gradients are the float
operator's (straight through the on-the-fly input quantization), checked against the float
model's autodiff."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from tests.conformance import refused_at_load, run_litert

SAME1 = {"padding": "SAME", "stride_w": 1, "stride_h": 1}
VALID2 = {"padding": "VALID", "stride_w": 2, "stride_h": 2}
# (operator, input shape, weight shape, output-channel axis, options, output shape)
CASES = {
    "fc": ("FULLY_CONNECTED", (4, 32), (16, 32), 0, {}, (4, 16)),
    "fc_relu6": ("FULLY_CONNECTED", (3, 20), (7, 20), 0, {"fused_activation_function": 3},
                 (3, 7)),
    "fc_asymmetric": ("FULLY_CONNECTED", (4, 32), (16, 32), 0,
                      {"asymmetric_quantize_inputs": True}, (4, 16)),
    "fc_keep_dims": ("FULLY_CONNECTED", (2, 3, 12), (5, 12), 0, {"keep_num_dims": True},
                     (2, 3, 5)),
    "conv": ("CONV_2D", (2, 6, 6, 3), (5, 3, 3, 3), 0, SAME1, (2, 6, 6, 5)),
    "conv_valid_stride2_relu": ("CONV_2D", (1, 9, 9, 4), (6, 3, 3, 4), 0,
                                {**VALID2, "fused_activation_function": 1}, (1, 4, 4, 6)),
    "depthwise": ("DEPTHWISE_CONV_2D", (2, 6, 6, 4), (1, 3, 3, 4), 3,
                  {**SAME1, "depth_multiplier": 1}, (2, 6, 6, 4)),
    "depthwise_multiplier2": ("DEPTHWISE_CONV_2D", (1, 7, 7, 3), (1, 3, 3, 6), 3,
                              {**VALID2, "depth_multiplier": 2}, (1, 3, 3, 6)),
}


def _model(case: str, rng: np.random.Generator, per_tensor: bool = False,
           bias: bool = True) -> tuple[bytes, tuple]:
    op, xshape, wshape, axis, options, oshape = CASES[case]
    w = rng.normal(size=wshape)
    other = tuple(d for d in range(w.ndim) if d != axis)
    scale = (np.abs(w).max() if per_tensor else np.abs(w).max(axis=other, keepdims=True)) / 127
    scale = np.asarray(scale, np.float32)
    b = Builder()
    x = b.input("x", xshape)
    q = (scale.reshape(-1), np.zeros(scale.size, int), axis)
    wq = b.constant("w", np.round(w / scale).astype(np.int8), quantization=q)
    inputs = [x, wq]
    if bias:
        inputs.append(b.constant("b", rng.normal(size=oshape[-1]).astype(np.float32)))
    b.output(b.op(op, inputs, options, shapes=[oshape]))
    return b.to_bytes("tflite"), xshape


def _inputs(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return (rng.normal(size=shape) * rng.uniform(0.1, 5) + rng.uniform(-2, 2)).astype(
        np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_hybrid_operator_equals_litert(case: str) -> None:
    rng = np.random.default_rng(len(case))
    for trial in range(4):
        per_tensor = trial == 1 and "depthwise" not in case  # LiteRT refuses those
        bias = trial != 2 or not case.startswith("fc")  # hybrid convolutions need one
        data, xshape = _model(case, rng, per_tensor=per_tensor, bias=bias)
        model = cj.load(data)
        assert model.params["w"].dtype == np.float32
        forward = jax.jit(model.apply)
        for _ in range(3):
            v = _inputs(rng, xshape)
            np.testing.assert_array_equal(np.asarray(forward(model.params, v)[0]),
                                          run_litert(data, [v])[0])


def test_a_row_of_zeros_quantizes_to_zeros() -> None:
    rng = np.random.default_rng(0)
    for case in ("fc", "fc_asymmetric", "conv"):
        data, xshape = _model(case, rng)
        v = _inputs(rng, xshape)
        v[0] = 0
        m = cj.load(data)
        np.testing.assert_array_equal(np.asarray(m(v)[0]), run_litert(data, [v])[0])


@pytest.mark.parametrize("case", ["fc", "conv", "depthwise"])
def test_gradients_are_the_float_operator_s(case: str) -> None:
    rng = np.random.default_rng(1)
    data, xshape = _model(case, rng)
    hybrid, plain = cj.load(data), cj.load(data, dequantize=True)
    v = _inputs(rng, xshape)

    def loss(m):
        return lambda p: (m.apply(p, v)[0] ** 2).sum() * 0 + (m.apply(p, v)[0]).sum()

    g_hybrid = jax.grad(loss(hybrid))(hybrid.params)
    g_plain = jax.grad(loss(plain))(plain.params)
    for k in g_plain:
        np.testing.assert_allclose(np.asarray(g_hybrid[k]), np.asarray(g_plain[k]),
                                   rtol=1e-5, atol=1e-5)


def test_a_per_tensor_hybrid_depthwise_is_refused_as_litert_refuses_it() -> None:
    data, _ = _model("depthwise", np.random.default_rng(0), per_tensor=True)
    with pytest.raises(RuntimeError, match="failed to prepare"):
        run_litert(data, [np.zeros((2, 6, 6, 4), np.float32)])
    msg = refused_at_load(data, cj.UnsupportedOperatorError)
    assert "LiteRT's hybrid kernel needs one per channel" in msg


@pytest.mark.parametrize("case", ["conv", "depthwise"])
def test_a_hybrid_convolution_without_bias_is_refused(case: str) -> None:
    data, _ = _model(case, np.random.default_rng(0), bias=False)
    msg = refused_at_load(data, cj.UnsupportedOperatorError)
    assert f"hybrid {CASES[case][0]} without a bias" in msg


def test_explicit_dequantize_computes_in_float() -> None:
    data, xshape = _model("fc", np.random.default_rng(2))
    v = _inputs(np.random.default_rng(5), xshape)
    plain = cj.load(data, dequantize=True)
    w = np.asarray(plain.params["w"])
    b = np.asarray(plain.params["b"])
    np.testing.assert_allclose(np.asarray(plain(v)[0]), v @ w.T + b, rtol=1e-5, atol=1e-5)
    assert plain.ir.main.tensors[1].quantization is None


# Hybrid BATCH_MATMUL: float left operand [..., M, K] (rows quantized one by one as
# FULLY_CONNECTED's), constant int8 right operand [..., K, N] per tensor or per column.
def _matmul_model(rng: np.random.Generator, xshape: tuple, wshape: tuple, adj_x: bool,
                  adj_y: bool, asymmetric: bool, per_column: bool) -> bytes:
    if adj_x:
        xshape = (*xshape[:-2], xshape[-1], xshape[-2])
    if adj_y:
        wshape = (*wshape[:-2], wshape[-1], wshape[-2])
    w = rng.normal(size=wshape)
    axis = len(wshape) - (2 if adj_y else 1)
    other = tuple(d for d in range(w.ndim) if d != axis)
    scale = np.asarray((np.abs(w).max(axis=other, keepdims=True) if per_column
                        else np.abs(w).max()) / 127, np.float32)
    b = Builder()
    x = b.input("x", xshape)
    wq = b.constant("w", np.round(w / scale).astype(np.int8),
                    quantization=(scale.reshape(-1), np.zeros(scale.size, int), axis))
    xm = np.zeros(xshape).swapaxes(-1, -2) if adj_x else np.zeros(xshape)
    wm = np.zeros(wshape).swapaxes(-1, -2) if adj_y else np.zeros(wshape)
    b.output(b.op("BATCH_MATMUL", [x, wq], {"adjoint_lhs": adj_x, "adjoint_rhs": adj_y,
                                            "asymmetric_quantize_inputs": asymmetric},
                  shapes=[np.matmul(xm, wm).shape]))
    return b.to_bytes("tflite")


def _random_matmul_shapes(rng: np.random.Generator) -> tuple[tuple, tuple]:
    m, k, n = (int(v) for v in rng.integers(1, 40, 3))
    rank_x, rank_w = int(rng.integers(2, 5)), int(rng.integers(2, 5))
    batch = [int(rng.integers(1, 4))] + [1]  # at most one batch dimension above 1
    rng.shuffle(batch)
    xb = batch[-(rank_x - 2):] if rank_x > 2 else []
    wb = [d if rng.random() < 0.5 else 1 for d in batch][-(rank_w - 2):] if rank_w > 2 else []
    return (*xb, m, k), (*wb, k, n)


def test_hybrid_batch_matmul_equals_litert() -> None:
    """Random shapes of ranks 2-4 (broadcast batch dimensions), adjoints, symmetric and
    asymmetric inputs, per-tensor and per-column weights: equal to LiteRT."""
    rng = np.random.default_rng(53)
    for trial in range(16):
        xshape, wshape = _random_matmul_shapes(rng)
        flags = [bool(v) for v in rng.integers(0, 2, 4)]
        data = _matmul_model(rng, xshape, wshape, *flags)
        model = cj.load(data)
        assert model.params["w"].dtype == np.float32
        v = _inputs(rng, read_shape(data))
        if trial == 0:
            v[..., 0, :] = 0  # a row of zeros (adjoint or not: some row or column of zeros)
        np.testing.assert_array_equal(np.asarray(model(v)[0]), run_litert(data, [v])[0],
                                      err_msg=f"{xshape} @ {wshape} {flags}")


def read_shape(data: bytes) -> tuple:
    from circle_jax.formats.reader import read_model

    main = read_model(data).main
    return main.tensors[main.inputs[0]].shape


def test_hybrid_batch_matmul_gradients_are_the_float_operator_s() -> None:
    rng = np.random.default_rng(4)
    data = _matmul_model(rng, (2, 3, 8), (8, 5), False, True, True, True)
    hybrid, plain = cj.load(data), cj.load(data, dequantize=True)
    v = _inputs(rng, read_shape(data))
    g_hybrid = jax.grad(lambda p: hybrid.apply(p, v)[0].sum())(hybrid.params)
    g_plain = jax.grad(lambda p: plain.apply(p, v)[0].sum())(plain.params)
    np.testing.assert_allclose(np.asarray(g_hybrid["w"]), np.asarray(g_plain["w"]),
                               rtol=1e-5, atol=1e-5)


def test_hybrid_batch_matmul_with_two_batch_dimensions_is_refused() -> None:
    """LiteRT's hybrid kernel steps its row scales by M per batch dimension, not by the
    flattened batch: measured, half the outputs of [2, 2, 3, 8] @ [8, 5] are wrong."""
    data = _matmul_model(np.random.default_rng(0), (2, 2, 3, 8), (8, 5), False, False,
                         False, False)
    msg = refused_at_load(data, cj.UnsupportedOperatorError)
    assert "two batch dimensions above 1" in msg


def _identity_fc(rows: int, depth: int) -> bytes:
    """A hybrid FULLY_CONNECTED with identity int8 weights (scale 1) and
    ``asymmetric_quantize_inputs``: its output is ``s * (q - z)``, the input's quantization
    laid bare."""
    b = Builder()
    x = b.input("x", (rows, depth))
    w = b.constant("w", np.eye(depth, dtype=np.int8),
                   quantization=(np.ones(depth, np.float32), np.zeros(depth, int), 0))
    bias = b.constant("b", np.zeros(depth, np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, bias], {"asymmetric_quantize_inputs": True},
                  shapes=[(rows, depth)]))
    return b.to_bytes("tflite")


def test_asymmetric_input_quantization_at_its_edges_equals_litert() -> None:
    """Where float32 arithmetic would part from LiteRT's: values whose ``x / s`` is a tie
    (LiteRT adds the zero point after rounding: ``z + round(x / s)``), and rows whose zero
    point lies within 2e-4 of a half-integer (LiteRT computes it in float64, from the
    minimum or the maximum, whichever errs less), 360 of a million random rows."""
    ties = np.zeros((2, 16), np.float32)
    ties[0, :2], ties[1, :2] = (-15.875, 16.0), (-7.875, 24.0)  # s = 1/8, z = -1 and -65
    ties[:, 2:11] = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 10.5, 11.5]) / 8
    rng = np.random.default_rng(11)
    x = (rng.normal(size=(1_000_000, 16)) * rng.uniform(0.01, 50, (1_000_000, 1))
         + rng.uniform(-5, 5, (1_000_000, 1))).astype(np.float32)
    lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
    z = np.float32(-128) - lo / ((hi - lo) / np.float32(255))  # float32's zero point
    near = x[np.abs(np.abs(z - np.trunc(z)) - 0.5) < 2e-4]
    assert len(near) > 300
    for rows in (ties, near):
        data = _identity_fc(*rows.shape)
        model = cj.load(data)
        np.testing.assert_array_equal(np.asarray(model.apply(model.params, rows)[0]),
                                      run_litert(data, [rows])[0])
