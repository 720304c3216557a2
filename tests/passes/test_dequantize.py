"""The dequantize pass (`circle_jax.passes.dequantize`) on the converter-made models of
tests/data/quantized against LiteRT running the quantized files.

Tolerances (absolute, on the model's softmax output in [0, 1]; measured on the 8 recorded
digits, max over samples):
- full int8 (int8 or float I/O): the float model does not round its activations to int8,
  so it differs from LiteRT's integer model by the quantization error accumulated over the
  graph: measured 0.0235 = 6.0 output LSBs (scale 1/256); asserted 8 LSBs;
- 16x8: int16 activations, measured 3.0e-4; asserted 1e-3;
- dynamic range: LiteRT's hybrid FULLY_CONNECTED quantizes its input to int8 per batch
  row, the float model does not: measured 3.9e-3; asserted 1e-2;
- float16 weights: exact values in float32, measured 1.5e-7; asserted 1e-5.
The exported float model (written by `circle_jax.formats.write_model`) runs in LiteRT and
equals circle-jax's forward of the dequantized model within float32 rounding (1e-5;
measured 2.4e-7).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.cli import main
from circle_jax.formats.reader import read_model
from circle_jax.passes import dequantize_model
from circle_jax.passes.dequantize import is_quantized
from tests.conformance import run_litert
from tests.quantized import Q, full_range, quantized_model

DATA = Path(__file__).parent.parent / "data" / "quantized"
TOLERANCE = {"full_int8": 8 / 256, "full_int8_float_io": 8 / 256, "int16x8": 1e-3,
             "dynamic_range": 1e-2, "float16": 1e-5}


def _feeds(data: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
    """(LiteRT's input, its real value: the float model's input) for each recorded digit."""
    x = np.load(DATA / "inputs.npz")["x"]
    sg = read_model(data).main
    t = sg.tensors[sg.inputs[0]]
    if t.dtype != "int8":
        return [(x[i:i + 1], x[i:i + 1]) for i in range(len(x))]
    s, z = t.quantization.scale[0], t.quantization.zero_point[0]
    q = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
    real = ((q.astype(np.float32) - z) * np.float32(s)).astype(np.float32)
    return [(q[i:i + 1], real[i:i + 1]) for i in range(len(x))]


def _real(data: bytes, y: np.ndarray) -> np.ndarray:
    sg = read_model(data).main
    t = sg.tensors[sg.outputs[0]]
    if t.dtype != "int8":
        return y
    return (y.astype(np.float32) - t.quantization.zero_point[0]) * t.quantization.scale[0]


@pytest.mark.parametrize("name", list(TOLERANCE))
def test_dequantized_model_matches_litert_and_exports(name: str) -> None:
    data = (DATA / f"{name}.tflite").read_bytes()
    model = cj.load(data, dequantize=True)
    assert not any(is_quantized(t) or t.dtype == "float16" for t in model.ir.main.tensors)
    assert all(s.dtype == "float32" for s in (*model.inputs, *model.outputs))
    exported = model.export(file_format="tflite")
    assert not any(is_quantized(t) for t in read_model(exported).main.tensors)
    forward = jax.jit(model.apply)
    worst = 0.0
    for x, real in _feeds(data):
        got = np.asarray(forward(model.params, real)[0])
        worst = max(worst, float(np.abs(got - _real(data, run_litert(data, [x])[0])).max()))
        np.testing.assert_allclose(run_litert(exported, [real])[0], got, rtol=0, atol=1e-5)
    assert worst <= TOLERANCE[name], f"{name}: {worst}"


def test_record_and_identities() -> None:
    """QUANTIZE at the input and DEQUANTIZE at the output go; names of inputs and outputs
    stay; the record says what each tensor was."""
    before = read_model(DATA / "full_int8_float_io.tflite")
    after = dequantize_model(before)
    kinds = [op.type for op in after.main.operators]
    assert "QUANTIZE" not in kinds and "DEQUANTIZE" not in kinds
    assert len(after.main.operators) == len(before.main.operators) - 2
    for field in ("inputs", "outputs"):
        assert [after.main.tensors[i].name for i in getattr(after.main, field)] == \
            [before.main.tensors[i].name for i in getattr(before.main, field)]
    (rec,) = after.passes
    conv = next(op for op in before.main.operators if op.type == "CONV_2D")
    w = before.main.tensors[conv.inputs[1]]
    assert rec.changes[w.name] == f"int8 per-channel {w.shape[0]}@0"
    assert sum(v == "removed" for v in rec.changes.values()) == 2
    assert cj.load(before.source).ir.main.operators[0].type == "QUANTIZE"  # integer by default


def test_identity_between_input_and_output_is_kept() -> None:
    """A QUANTIZE from the graph input to the graph output has nothing to fold into: it
    stays, a float32 DEQUANTIZE (an identity)."""
    b = Builder()
    x = b.input("x", (2, 3))
    y = b.op("QUANTIZE", [x], quantization=[((0.5,), (3,))], dtypes=["int8"])
    b.output(y)
    model = cj.load(b.to_bytes("circle"), dequantize=True)
    (op,) = model.operators
    assert op.type == "DEQUANTIZE" and model.outputs[0].dtype == "float32"
    v = np.array([[0.2, -1.0, 7.5]] * 2, np.float32)
    np.testing.assert_array_equal(np.asarray(model(v)[0]), v)


def test_cli_info_shows_quantization_and_export_dequantizes(tmp_path, capsys) -> None:
    src = DATA / "full_int8.tflite"
    assert main(["info", str(src)]) == 0
    out = capsys.readouterr().out
    assert "quantized tensors (23; per-channel: N scales@axis):" in out
    assert "int8 per-channel 8@3" in out and "zp=-128" in out  # depthwise filter; input
    dst = tmp_path / "float.tflite"
    assert main(["export", str(src), "--dequantize", "--tflite", str(dst)]) == 0
    written = read_model(dst)
    assert {t.dtype for t in written.main.tensors} == {"float32", "int32"}  # int32: shapes
    x, real = _feeds(src.read_bytes())[0]
    want = np.asarray(cj.load(src, dequantize=True)(real)[0])
    np.testing.assert_allclose(run_litert(dst.read_bytes(), [real])[0], want, atol=1e-5)


# dtype -> (weight dtype, bias dtype, input / output zero point, weight zero point, steps
# per unit of the activations' scales)
ONE_OP = {"uint8": ("uint8", "int32", 128, 120, 1), "int16": ("int8", "int64", 0, 0, 256)}


@pytest.mark.parametrize("dtype", list(ONE_OP))
def test_one_quantized_operator_within_an_output_lsb(dtype: str) -> None:
    """A uint8 (ONE's quantizer) or 16x8 CONV_2D with per-tensor weights, dequantized: the
    float result is the integer kernel's before its final rounding, so within one output
    LSB of LiteRT's (outputs kept inside the type's range)."""
    w_dtype, bias_dtype, zero, w_zero, steps = ONE_OP[dtype]
    rng = np.random.default_rng(1)
    x_s, w_s, y_s = 0.02 / steps, 0.01, 0.4 / steps
    x = full_range(rng, (1, 5, 5, 3), dtype)
    w = full_range(rng, (4, 3, 3, 3), w_dtype)
    bias = rng.integers(-500, 500, 4).astype(bias_dtype)
    b, feeds = quantized_model(
        "CONV_2D", [Q(x, (x_s, zero)), Q(w, (w_s, w_zero), const=True),
                    Q(bias, (x_s * w_s, 0), const=True)],
        {"padding": "SAME", "stride_h": 1, "stride_w": 1}, (y_s, zero))
    data = b.to_bytes("tflite")
    want = (run_litert(data, feeds)[0].astype(np.float64) - zero) * y_s
    real = ((x.astype(np.float32) - zero) * np.float32(x_s)).astype(np.float32)
    got = np.asarray(cj.load(data, dequantize=True)(real)[0])
    assert np.abs(got - want).max() <= y_s * 1.0001
