"""`circle-jax golden` on fully quantized models (the converter-made files of
tests/data/quantized): input.h5 holds the file's input exactly as given (an int8 input's data
is its stored integers, float data is refused as `run` refuses it), forward-only golden runs
the file's integer kernels (no QAT loading, so constants QAT's integer forward cannot
re-quantize are fine), and its overlay gives every operator a number."""

from __future__ import annotations

import os

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.oracle import golden, read_h5
from circle_jax.oracle.golden import input_dtypes
from tests.paths import TESTS

QUANTIZED = os.path.join(TESTS, "data", "quantized")
FULL_INT8 = os.path.join(QUANTIZED, "full_int8.tflite")
#: stored integers a real-valued reading would clamp (s = 1/255, zp = -128)
INTS = np.array([-128, -100, 0, 50, 127, 3, 4, 5], np.int8)


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("E: ") and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("golden_quantized")
    np.save(d / "q.npy", np.tile(INTS, 8).reshape(1, 8, 8, 1))
    np.save(d / "f.npy", np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 8, 8, 1))
    np.save(d / "y.npy", np.eye(10, dtype=np.float32)[:1])
    return {k: str(d / f"{k}.npy") for k in ("q", "f", "y")} | {"dir": str(d)}


@pytest.mark.parametrize("extra", [[], ["--qat_forward", "fake_quant"],
                                   ["--expected", "y", "--loss", "cce"],
                                   ["--expected", "y", "--loss", "cce", "--qat_forward",
                                    "fake_quant"]])
@pytest.mark.slow
def test_int8_data_is_the_stored_integers(data, tmp_path, extra) -> None:
    """input.h5 holds the int8 data given, and the tensors are LiteRT's for those integers
    (the integer kernels of a plain load, which `run` uses too)."""
    argv = ["golden", FULL_INT8, "--input", data["q"], "-o", str(tmp_path / "g"),
            *[data[a] if a in data else a for a in extra]]
    assert main(argv) == 0
    (x,), _ = read_h5(tmp_path / "g" / "input.h5")
    assert x.value.dtype == np.int8 and np.array_equal(x.value, np.load(data["q"]))
    assert x.attrs["zero_point"].tolist() == [-128]
    plain = cj.load(FULL_INT8)
    (out,), _ = read_h5(tmp_path / "g" / "expected.h5")
    assert np.array_equal(out.value, np.asarray(plain.apply(plain.params,
                                                            np.load(data["q"]))[0]))


def test_float_data_for_an_int8_input_is_refused_as_run_refuses_it(data, tmp_path,
                                                                   capsys) -> None:
    for argv in (["golden", FULL_INT8, "--input", data["f"], "-o", str(tmp_path / "g")],
                 ["golden", FULL_INT8, "--input", data["f"], "--expected", data["y"],
                  "-o", str(tmp_path / "g")],
                 ["run", FULL_INT8, "--input", data["f"], "--output_dir", str(tmp_path)]):
        assert main(argv) == 1
        assert "has dtype float32, expected int8" in _one_error(capsys)
    assert not os.path.exists(tmp_path / "g")


def test_the_library_takes_stored_integers_or_real_values() -> None:
    """golden(qat model, [int8]) keeps the integers; real values are quantized with the
    file's parameters (round half away, clamped); another integer dtype is refused."""
    qat = cj.load(FULL_INT8, qat=True)
    assert input_dtypes(qat) == [np.dtype(np.int8)]
    q = np.tile(INTS, 8).reshape(1, 8, 8, 1)
    assert np.array_equal(golden(qat, [q]).inputs[0].value, q)
    real = (q.astype(np.float32) + 128) / 255
    assert np.array_equal(golden(qat, [real]).inputs[0].value, q)
    with pytest.raises(ValueError, match="is int32, expected int8"):
        golden(qat, [q.astype(np.int32)])


@pytest.mark.parametrize("name, dtype", [("ops_full_int8", np.int8),
                                         ("ops_int16x8", np.float32)])
@pytest.mark.slow
def test_forward_only_golden_needs_no_qat_load(data, tmp_path, name, dtype) -> None:
    """A MUL reading a quantized constant, which the integer QAT forward cannot re-quantize,
    is no obstacle to forward-only golden (--qat on given or not): every tensor is the plain
    load's (the integer kernels, LiteRT's)."""
    path = os.path.join(QUANTIZED, f"{name}.tflite")
    q = np.load(data["q"])
    x = q if dtype == np.int8 else q.astype(dtype) / 128
    np.save(tmp_path / "x.npy", x)
    for extra in ([], ["--qat", "on"]):
        assert main(["golden", path, "--input", str(tmp_path / "x.npy"), "-o",
                     str(tmp_path / "g"), *extra]) == 0
    plain = cj.load(path)
    env = plain.tensors(plain.params, x)[1]
    tensors = {int(e.key): e.value for e in read_h5(tmp_path / "g" / "tensors.h5")[0]}
    assert all(np.array_equal(tensors[i], np.asarray(v)) for i, v in env.items())
