""".wof weights of a model: export, load back bit-exactly, refuse files of other models."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.checkpoints import load_wof, save_wof, wof_bytes
from circle_jax.cli import main
from circle_jax.errors import CircleFormatError
from circle_jax.examples import branching_cnn
from circle_jax.formats import decode_wof, encode_wof
from tests.paths import shared_model

MNIST = "onert_micro_simple_mnist_model.circle"


def _model() -> cj.Model:
    return cj.load(shared_model(MNIST))


def _random_params(model: cj.Model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in model.params.items()}


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model = _model()
    params = _random_params(model)
    path = tmp_path / "w.wof"
    save_wof(path, model, params)
    got = load_wof(path, model)
    assert got.keys() == params.keys()
    for k, v in params.items():
        assert np.asarray(got[k]).dtype == v.dtype
        assert np.asarray(got[k]).tobytes() == v.tobytes(), k
    assert load_wof(path.read_bytes(), model).keys() == params.keys()  # bytes work too


def test_layout_one_buffer_per_tensor_only_trainable_filled() -> None:
    model = _model()
    sg = model.ir.main
    params = _random_params(model)
    data = wof_bytes(model, params, trainable=["arith.constant"])  # the last FC's weight
    magic, schema, _, n = struct.unpack_from("<HBBI", data)
    assert (magic, schema, n) == (429, 1, len(sg.tensors)) == (429, 1, 12)
    buffers = decode_wof(data, num_tensors=12)
    filled = [k for k, b in enumerate(buffers) if b is not None]
    assert filled == [1]  # tensor 1: arith.constant, float32[2, 4]
    assert buffers[1].tobytes() == params["arith.constant"].tobytes()
    every = decode_wof(wof_bytes(model), num_tensors=12)
    # the four float weights; not the int32 Reshape shape (3) nor activations
    assert [k for k, b in enumerate(every) if b is not None] == [1, 2, 4, 5]
    # loading a partial file changes only what it holds
    got = load_wof(data, model)
    for k, v in model.params.items():
        want = params[k] if k == "arith.constant" else v
        assert np.asarray(got[k]).tobytes() == np.asarray(want).tobytes()


def test_foreign_truncated_and_mismatched_files_are_refused(tmp_path: Path) -> None:
    model = _model()
    good = wof_bytes(model)
    other = wof_bytes(cj.load(branching_cnn().to_bytes("circle")))
    sizes = [None] * 12
    sizes[2] = np.zeros(99, np.float32)  # tensor 2 is float32[4, 100]: 1600 bytes
    shape = [None] * 12
    shape[3] = np.array([7, 7], np.int32)  # tensor 3 is the int32 Reshape shape [1, 100]
    cases = {
        good[:6]: r"wof file is truncated: 6 bytes, the header alone needs 8",
        good[:20]: r"wof file is truncated: 12 offsets need 56 bytes of header, file has 20",
        b"CIR0" + good[4:]: r"not a wof file: magic number is \d+, expected 429",
        other: r"expected 12 tensors \(the model's subgraph 0\), file has 15",
        encode_wof(sizes): r"buffer 2 has 396 bytes, expected 1600 for tensor 2 "
                           r"'arith.constant1' float32\[4, 100\]",
        encode_wof(shape): r"buffer 3 has 8 bytes of data, but tensor 3 'arith.constant2' "
                           r"int32\[2\] is not a float weight",
    }
    for data, message in cases.items():
        path = tmp_path / "bad.wof"
        path.write_bytes(data)
        with pytest.raises(CircleFormatError, match=message) as info:
            load_wof(path, model)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
    same = [None] * 12
    same[3] = model.ir.main.tensors[3].data  # a repeat of a constant's own bytes is fine
    load_wof(encode_wof(same), model)


def test_cli_export_and_load_wof(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    """``export --wof``, ``export --load_wof --circle``: weights through files, bit-exact."""
    monkeypatch.chdir(tmp_path)
    model = _model()
    params = _random_params(model, seed=1)
    save_wof("in.wof", model, params)
    assert main(["export", shared_model(MNIST), "--load_wof", "in.wof", "--circle", "a.circle",
                 "--wof", "out.wof"]) == 0
    assert Path("out.wof").read_bytes() == Path("in.wof").read_bytes()
    back = cj.load("a.circle")
    for k, v in params.items():
        assert np.asarray(back.params[k]).tobytes() == v.tobytes()
    capsys.readouterr()
    assert main(["export", shared_model(MNIST), "--load_wof", "a.circle", "--wof", "x.wof"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("E: a.circle: not a wof file: magic number is") and err.count("\n") == 1
    assert not Path("x.wof").exists()


def test_cli_train_export_wof(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train --export_wof`` holds the trained weights of the trainable operators only."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.save("x.npy", rng.random((16, 11, 11, 1), dtype=np.float32))
    np.save("y.npy", np.eye(2, dtype=np.float32)[rng.integers(0, 2, 16)])
    assert main(["train", shared_model(MNIST), "--load_input", "x.npy", "--load_expected",
                 "y.npy", "--epoch", "1", "--batch_size", "4", "--learning_rate", "0.1",
                 "--num_of_trainable_ops", "2", "--export_wof", "t.wof",
                 "--export_circle", "t.circle"]) == 0
    model = _model()
    buffers = decode_wof(Path("t.wof").read_bytes(), num_tensors=12)
    assert [k for k, b in enumerate(buffers) if b is not None] == [1]  # the last FC only
    trained = cj.load("t.circle").params
    assert buffers[1].tobytes() == np.asarray(trained["arith.constant"]).tobytes()
    assert buffers[1].tobytes() != np.asarray(model.params["arith.constant"]).tobytes()
    got = load_wof("t.wof", model)
    for k in model.params:
        assert np.asarray(got[k]).tobytes() == np.asarray(trained[k]).tobytes(), k
