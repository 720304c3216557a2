"""Data in the integer dtype a quantized file stores an input in, given to the model loaded
for float or quantization-aware training (``qat=False``, ``dequantize=True``, ``qat=True``):
those are the file's stored integers, dequantized with its scale and zero point
(`TensorSpec.stored`), never read as real values -128..127. Float data stays real values."""

from __future__ import annotations

import os

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.oracle import golden, read_h5
from circle_jax.oracle.golden import input_dtypes
from circle_jax.train.data import as_inputs
from tests.paths import TESTS

QUANTIZED = os.path.join(TESTS, "data", "quantized")
FULL_INT8 = os.path.join(QUANTIZED, "full_int8.tflite")  # int8 input: s = 1/255, zp = -128
LOADS = [dict(qat=False), dict(dequantize=True), dict(qat=True)]


def _ints(n: int = 8) -> np.ndarray:
    return np.random.default_rng(0).integers(-128, 128, (n, 8, 8, 1)).astype(np.int8)


@pytest.mark.parametrize("options", LOADS, ids=str)
def test_the_spec_records_the_files_integers(options: dict) -> None:
    model = cj.load(FULL_INT8, **options)
    (spec,) = model.inputs
    assert spec.dtype == "float32" and spec.stored is not None
    assert spec.stored.np_dtype == np.int8 and spec.stored.zp == -128
    assert spec.stored.s == pytest.approx(1 / 255)
    assert cj.load(FULL_INT8).inputs[0].stored is None  # the integer kernels take int8
    float_io = cj.load(os.path.join(QUANTIZED, "full_int8_float_io.tflite"), qat=False)
    assert float_io.inputs[0].stored is None  # the file takes real values itself


@pytest.mark.parametrize("options", LOADS, ids=str)
def test_fit_dequantizes_stored_integers(options: dict) -> None:
    model = cj.load(FULL_INT8, **options)
    q = _ints()
    (x,) = as_inputs(model, q)
    want = ((q.astype(np.float64) + 128) / 255).astype(np.float32)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=0)
    assert x.min() >= 0 and x.max() <= 1  # not -128..127
    real = np.linspace(0, 1, q.size, dtype=np.float32).reshape(q.shape)
    np.testing.assert_array_equal(as_inputs(model, real)[0], real)  # real values stay
    wide = q.astype(np.int16)  # another integer dtype: a lossless cast to real values
    np.testing.assert_array_equal(as_inputs(model, wide)[0], q.astype(np.float32))


@pytest.mark.parametrize("flags", [["--qat", "off"], []], ids=str)  # --dequantize: off's
@pytest.mark.slow
def test_cli_training_on_stored_integers_is_training_on_their_real_values(
        tmp_path, flags: list[str]) -> None:
    q = _ints(16)
    y = np.eye(10, dtype=np.float32)[np.arange(16) % 10]
    real = cj.load(FULL_INT8, qat=False).inputs[0].stored.real(q)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "r.npy", real)
    np.save(tmp_path / "y.npy", y)
    exported = []
    for x in ("q", "r"):
        out = tmp_path / f"{x}.tflite"
        assert main(["train", FULL_INT8, "--load_input", str(tmp_path / f"{x}.npy"),
                     "--load_expected", str(tmp_path / "y.npy"), "--epoch", "1",
                     "--batch_size", "4", "--loss", "2", "--learning_rate", "0.05",
                     "--export_circle", str(out), *flags]) == 0
        exported.append(out.read_bytes())
    assert exported[0] == exported[1]


def test_golden_of_a_dequantized_model_takes_stored_integers(tmp_path) -> None:
    model = cj.load(FULL_INT8, qat=False)
    assert input_dtypes(model) == [np.dtype(np.int8)]
    q = _ints(2)
    real = model.inputs[0].stored.real(q)
    np.testing.assert_array_equal(golden(model, [q]).outputs[0].value,
                                  golden(model, [real]).outputs[0].value)
    np.save(tmp_path / "q.npy", q)
    assert main(["golden", FULL_INT8, "--qat", "off", "--input", str(tmp_path / "q.npy"),
                 "-o", str(tmp_path / "g")]) == 0
    (x,), _ = read_h5(tmp_path / "g" / "input.h5")
    np.testing.assert_array_equal(x.value, real)  # the values the float model took
