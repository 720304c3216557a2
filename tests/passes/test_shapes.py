"""fill_conversion_shapes: the shapeless QUANTIZE/DEQUANTIZE outputs of a QDQ file (tfmot's
QAT model converted without optimizations, tests/data/qdq/, scripts/make_qdq_models.py)
take their inputs' shapes, so the file loads and runs as LiteRT runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.passes import fill_conversion_shapes
from tests.conformance import run_litert

QDQ = Path(__file__).parents[1] / "data" / "qdq"


def test_shapeless_conversion_outputs_take_their_inputs_shapes() -> None:
    model = read_model(QDQ / "qat_cnn_qdq.tflite")
    before = [t for t in model.main.tensors if t.shape == ()]
    assert before  # the converter's weight QUANTIZE/DEQUANTIZE pair of the Dense layer
    filled = fill_conversion_shapes(model)
    assert filled.passes[-1].name == "fill_conversion_shapes"
    assert all(filled.main.tensors[t.index].shape == (10, 512) for t in before)
    plain = read_model(Path(__file__).parents[1] / "data" / "torch" / "mlp.tflite")
    assert fill_conversion_shapes(plain) is plain  # nothing to fill: no record


def test_the_qdq_file_runs_as_litert() -> None:
    """Float operators between QUANTIZE/DEQUANTIZE pairs: LiteRT's output within 1e-5 of
    its largest value (float32 sums in another order; a tie of QUANTIZE's rounding, which
    LiteRT's vectorized kernel breaks to even, would move one value by a quantization step;
    measured 1.7e-7 of 0.093), and TF's Keras QAT model in inference mode likewise."""
    data = (QDQ / "qat_cnn_qdq.tflite").read_bytes()
    d = np.load(QDQ / "qat_cnn_qdq.npz")
    model = cj.load(data)
    ours = np.stack([np.asarray(model(v[None])[0])[0] for v in d["x"]])
    want = np.stack([run_litert(data, [v[None]])[0][0] for v in d["x"]])
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(ours, d["y"], rtol=0, atol=1e-5 * scale)
