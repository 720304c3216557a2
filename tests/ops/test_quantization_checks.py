"""Bad quantization is refused at load, in one line naming the tensor and what was expected:
missing parameters on an integer tensor an integer kernel needs, scales that are not
finite and positive, zero points outside the type's range, per-channel counts that do not
match the quantized dimension, unsupported layouts (int4 or quantized int64 activations), and
hybrid (int8 weights, float activations) or kernel-less quantized operators. Every problem
of a model is listed in the one error."""

from __future__ import annotations

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.packed import pack_values
from circle_jax.formats.reader import unpack
from circle_jax.formats.schema import schema
from circle_jax.formats.writer import pack
from tests.conformance import refused_at_load, run_litert


def _conv(w_q=((0.01, 0.02), (0, 0), 0), x_q=(0.05, 3), y_q=(0.1, -2), bias_dtype="int32",
          x_dtype="int8") -> bytes:
    """A quantized CONV_2D: x [1, 4, 4, 3], w [2, 1, 1, 3], bias [2]."""
    b = cj.Builder()
    x = b.input("x", (1, 4, 4, 3), x_dtype, quantization=x_q)
    w = b.constant("w", np.ones((2, 1, 1, 3), np.int8), quantization=w_q)
    bias = b.constant("bias", np.zeros(2, bias_dtype), quantization=((0.0005, 0.001), (0, 0)))
    y = b.op("CONV_2D", [x, w, bias], {"padding": "VALID", "stride_h": 1, "stride_w": 1},
             shapes=[(1, 4, 4, 2)], dtypes=[x_dtype], quantization=[y_q])
    b.output(y)
    return b.to_bytes("circle")


def _edit_tensor(data: bytes, name: str, edit) -> bytes:
    m = unpack(data)
    for t in m.subgraphs[0].tensors:
        if (t.name.decode() if isinstance(t.name, bytes) else t.name) == name:
            edit(t)
    return pack(m, "circle")


def test_the_valid_model_loads_and_runs() -> None:
    m = cj.load(_conv())
    y = m.apply(m.params, np.full((1, 4, 4, 3), 5, np.int8))[0]
    assert y.dtype == np.int8 and y.shape == (1, 4, 4, 2)


def test_missing_parameters_name_the_tensor() -> None:
    def drop(t):
        t.quantization = None
    msg = refused_at_load(_edit_tensor(_conv(), "conv_2d_0", drop))
    assert "output 0 'conv_2d_0' (int8) has no quantization parameters" in msg


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf")])
def test_scale_must_be_finite_and_positive(scale: float) -> None:
    msg = refused_at_load(_conv(x_q=(scale, 0)))
    assert "tensor 0 'x' (int8): quantization scale" in msg
    assert "expected finite and > 0" in msg


@pytest.mark.parametrize("dtype, zero_point", [("int8", 128), ("int8", -129),
                                               ("int16", 40000)])
def test_zero_point_inside_the_type(dtype: str, zero_point: int) -> None:
    msg = refused_at_load(_conv(x_q=(0.05, zero_point), y_q=(0.1, 0), x_dtype=dtype,
                         bias_dtype="int64" if dtype == "int16" else "int32"))
    assert f"zero point {zero_point} is outside {dtype}'s range" in msg


def test_per_channel_counts_match_the_dimension() -> None:
    msg = refused_at_load(_conv(w_q=((0.01, 0.02, 0.03), (0, 0, 0), 0)))
    assert "3 per-channel scales for dimension 0 of size 2" in msg


def test_quantized_dimension_in_range() -> None:
    msg = refused_at_load(_conv(w_q=((0.01, 0.02), (0, 0), 7)))
    assert "quantized_dimension 7 is outside the tensor's 4 dimensions" in msg


def test_one_zero_point_per_scale() -> None:
    def edit(t):
        t.quantization.zeroPoint = [0]
    msg = refused_at_load(_edit_tensor(_conv(), "w", edit))
    assert "2 scales but 1 zero points" in msg


def test_every_problem_in_one_line() -> None:
    msg = refused_at_load(_conv(x_q=(-1.0, 300), w_q=((0.01, 0.02, 0.03), (0, 0, 0), 0)))
    assert "scale -1.0" in msg and "zero point 300" in msg and "per-channel scales" in msg


def _int4_weights(t, buffers) -> None:
    """Tensor ``t`` (int8 weights) as random int4 weights (the whole range), packed."""
    values = np.random.default_rng(1).integers(-8, 8, size=6)
    t.type = schema.TensorType.TensorType.INT4
    buffers[t.buffer].data = pack_values(values, "int4")


def test_int4_weights_of_an_integer_convolution_run_as_litert() -> None:
    m = unpack(_conv())
    _int4_weights(next(t for t in m.subgraphs[0].tensors if t.name in (b"w", "w")), m.buffers)
    data = pack(m, "tflite")
    x = np.random.default_rng(0).integers(-128, 128, (1, 4, 4, 3)).astype(np.int8)
    loaded = cj.load(data)
    assert any(t.dtype == "int4" for t in loaded.ir.main.tensors)
    np.testing.assert_array_equal(np.asarray(loaded.apply(loaded.params, x)[0]),
                                  run_litert(data, [x])[0])


def test_an_int4_buffer_of_the_wrong_size_is_malformed() -> None:
    def to_int4(t):  # 6 values need 3 packed bytes; the int8 buffer holds 6
        t.type = schema.TensorType.TensorType.INT4
    msg = refused_at_load(_edit_tensor(_conv(), "w", to_int4))
    assert "int4 needs 3 bytes but its buffer" in msg


def test_int4_activations_are_unsupported() -> None:
    def to_int4(t):
        t.type = schema.TensorType.TensorType.INT4
    msg = refused_at_load(_edit_tensor(_conv(), "x", to_int4), cj.UnsupportedOperatorError)
    assert "quantized int4 activations are not supported" in msg


def test_quantized_int64_activations_are_unsupported() -> None:
    b = cj.Builder()
    x = b.input("x", (4,), "int64", quantization=(0.5, 0))
    y = b.op("RELU", [x], shapes=[(4,)], dtypes=["int64"])
    b.output(y)
    msg = refused_at_load(b.to_bytes("circle"), cj.UnsupportedOperatorError)
    assert "quantized int64 tensor 'x' is only supported as a bias" in msg


def test_int16_convolution_needs_an_int64_bias() -> None:
    msg = refused_at_load(_conv(x_q=(0.05, 0), y_q=(0.1, 0), x_dtype="int16"),
                   cj.UnsupportedOperatorError)
    assert "bias 'bias' is int32; int16 CONV_2D takes int64" in msg


def test_hybrid_operators_in_an_integer_model_are_refused_at_load() -> None:
    """int8 weights with float activations (dynamic-range quantization) must not run as if
    the weights were plain integers: a weight-only quantized model is dequantized at load
    (tests/test_weight_only_models.py); in a model that also has integer activations, the
    hybrid operator is refused and ``dequantize=True`` runs the model in float."""
    b = cj.Builder()
    q = b.input("q", (1, 4), "int8", quantization=(0.5, 0))
    x = b.op("DEQUANTIZE", [q], shapes=[(1, 4)])
    w = b.constant("w", np.ones((3, 4), np.int8), quantization=(0.02, 0))
    y = b.op("FULLY_CONNECTED", [x, w, -1], shapes=[(1, 3)])
    b.output(y)
    msg = refused_at_load(b.to_bytes("tflite"), cj.UnsupportedOperatorError)
    assert msg.startswith("1 unsupported operator(s): operator 1 (FULLY_CONNECTED) on "
                          "quantized int8 tensor 'w' is not supported (hybrid: float "
                          "activations; load with dequantize=True)"), msg
    model = cj.load(b.to_bytes("tflite"), dequantize=True)
    np.testing.assert_allclose(model(np.array([[1, 2, 3, 4]], np.float32))[0],
                               [[0.2] * 3], rtol=1e-6)


def test_quantized_operators_without_an_integer_kernel_arerefused_at_load() -> None:
    b = cj.Builder()
    x = b.input("x", (1, 4, 4, 2), "int8", quantization=(0.05, 0))
    size = b.constant("size", np.array([8, 8], np.int32))
    y = b.op("RESIZE_BILINEAR", [x, size], shapes=[(1, 8, 8, 2)], dtypes=["int8"])
    b.output(y)
    msg = refused_at_load(b.to_bytes("circle"), cj.UnsupportedOperatorError)
    assert "RESIZE_BILINEAR) on quantized int8 tensor 'x' is not supported (no integer " \
           "kernel)" in msg


def test_plain_integer_tensors_keep_their_generic_kernels() -> None:
    """int8 tensors without quantization parameters are plain integers."""
    b = cj.Builder()
    x = b.input("x", (4,), "int8")
    y = b.op("ADD", [x, x])
    b.output(y)
    m = cj.load(b.to_bytes("circle"))
    out = m.apply(m.params, np.array([1, 2, 3, -4], np.int8))[0]
    assert out.tolist() == [2, 4, 6, -8]
