"""Exporting models: untrained exports are the input model again; trained exports run in
LiteRT and onert; writes are atomic, never touch their inputs, and bad files are refused."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.formats import atomic_write, export_model, read_model
from circle_jax.graph import ir
from circle_jax.lowering.interpreter import param_table
from tests.conformance import run_litert
from tests.paths import shared_model, shared_model_names

MNIST = "onert_micro_simple_mnist_model.circle"
INPUT_SHAPES = {"oww_melspectrogram.tflite": [(1, 1760)]}  # dynamic input: a concrete size
# Models Model.export is checked on (they lower today; the IR-level test covers all models)
LOADED = ["aeq_toy_transformer_kv_cache_2sig.tflite",
          "mediapipe_face_detection_short_range_fp16w.tflite",
          "mobilenet_v1_0.25_128_float.tflite", "one_vscode_test_onnx.circle",
          "one_vscode_while_000.circle", MNIST]


def _all_models() -> list[str]:
    return shared_model_names()


def _inputs(m: ir.Model, name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    sg = m.main
    shapes = INPUT_SHAPES.get(name, [sg.tensors[i].shape for i in sg.inputs])
    out = []
    for i, shape in zip(sg.inputs, shapes):
        dtype = ir.as_numpy_dtype(sg.tensors[i].dtype)
        if np.issubdtype(dtype, np.integer):
            out.append(rng.integers(0, 100, shape).astype(dtype))
        else:
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
    return out


def assert_same_model(a: ir.Model, b: ir.Model, same_format: bool = True) -> None:
    """Same operators, tensors (names, shapes, dtypes, data, quantization), subgraphs,
    metadata and signature defs. Buffer indices may differ (the writer unshares buffers)."""
    if same_format:
        assert (a.file_identifier, a.version) == (b.file_identifier, b.version)
    assert a.description == b.description
    assert dict(a.metadata) == dict(b.metadata)
    assert a.signature_defs == b.signature_defs
    assert len(a.subgraphs) == len(b.subgraphs)
    for sa, sb in zip(a.subgraphs, b.subgraphs):
        assert (sa.name, sa.inputs, sa.outputs) == (sb.name, sb.inputs, sb.outputs)
        assert sa.operators == sb.operators
        assert len(sa.tensors) == len(sb.tensors)
        for ta, tb in zip(sa.tensors, sb.tensors):
            fields = ("index", "name", "shape", "dtype", "quantization", "shape_signature",
                      "is_variable")
            assert [getattr(ta, f) for f in fields] == [getattr(tb, f) for f in fields]
            assert (ta.data is None) == (tb.data is None), ta.name
            if ta.data is not None:
                assert ta.data.dtype == tb.data.dtype and ta.data.tobytes() == tb.data.tobytes()


@pytest.mark.parametrize("name", _all_models())
def test_untrained_export_is_the_input_model(name: str) -> None:
    """Every weight written back: the same model, and bit-identical outputs."""
    path = shared_model(name)
    m = read_model(path)
    weights = {key: m.subgraphs[key[0]].tensors[key[1]].data
               for key in param_table(m).values()}
    data = export_model(m, weights)
    again = read_model(data)
    assert_same_model(m, again)
    assert data[4:8] == m.source[4:8]
    if m.format == "tflite":
        feeds = _inputs(m, name)
        for got, want in zip(run_litert(data, feeds), run_litert(m.source, feeds), strict=True):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    else:  # LiteRT reads no CIR0: compare circle-jax's outputs of both files
        feeds = _inputs(m, name)
        before, after = cj.Model(m), cj.Model(again)
        for got, want in zip(after(*feeds), before(*feeds), strict=True):
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    # the other format: same model, LiteRT's identifier and version where it reads it
    other = read_model(export_model(m, file_format="circle" if m.format == "tflite"
                                    else "tflite"))
    assert_same_model(m, other, same_format=False)
    assert other.file_identifier == ("CIR0" if m.format == "tflite" else "TFL3")


@pytest.mark.parametrize("name", LOADED)
def test_model_export_keeps_everything(name: str) -> None:
    """``Model.export()`` of an untrained model: the input model again, weights in their
    dtypes (also where loading untied shared constants: untrained copies write the input's
    layout)."""
    model = cj.load(shared_model(name))
    original = read_model(shared_model(name))
    for fmt in ("circle", "tflite"):
        data = model.export(file_format=fmt)
        assert_same_model(original, read_model(data), same_format=model.ir.format == fmt)


def test_trained_exports_run_in_litert_and_onert(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``--export_circle`` and ``--export_tflite``: LiteRT runs the .tflite, onert loads
    both, and all agree with circle-jax on the trained weights."""
    from onert.infer import session

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    x = rng.random((16, 11, 11, 1), dtype=np.float32)
    np.save("x.npy", x)
    np.save("y.npy", np.eye(2, dtype=np.float32)[rng.integers(0, 2, 16)])
    assert main(["train", shared_model(MNIST), "--load_input", "x.npy", "--load_expected",
                 "y.npy", "--epoch", "1", "--batch_size", "4", "--learning_rate", "0.1",
                 "--export_circle", "t.circle", "--export_tflite", "t.tflite"]) == 0
    assert Path("t.circle").read_bytes()[4:8] == b"CIR0"
    assert Path("t.tflite").read_bytes()[4:8] == b"TFL3"
    trained = cj.load("t.circle")
    assert_same_model(trained.ir, read_model("t.tflite"), same_format=False)
    assert any(np.asarray(v).tobytes() != np.asarray(cj.load(shared_model(MNIST)).params[k])
               .tobytes() for k, v in trained.params.items())
    feed = x[:1]
    want = np.asarray(jax.jit(trained.apply)(trained.params, feed)[0])
    np.testing.assert_allclose(run_litert(Path("t.tflite").read_bytes(), [feed])[0], want,
                               rtol=1e-5, atol=1e-6)
    for f in ("t.circle", "t.tflite"):
        np.testing.assert_allclose(session(f).infer([feed])[0], want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- safety


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.startswith("E: ") and err.count("\n") == 1, err
    return err


def test_refuses_to_overwrite_its_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.circle").write_bytes(Path(shared_model(MNIST)).read_bytes())
    before = Path("m.circle").read_bytes()
    stamp = os.stat("m.circle").st_mtime_ns
    np.save("x.npy", np.zeros((4, 11, 11, 1), np.float32))
    np.save("y.npy", np.zeros((4, 2), np.float32))
    train = ["train", "m.circle", "--load_input", "x.npy", "--load_expected", "y.npy"]
    os.symlink("m.circle", "link.circle")
    for argv in (train + ["--export_circle", "m.circle"],
                 train + ["--export_tflite", "./link.circle"],
                 train + ["--export_wof", "x.npy"],
                 train + ["--export_checkpoint", "m.circle"],
                 ["export", "m.circle", "--circle", str(tmp_path / "m.circle")],
                 ["traininfo", "m.circle", "--set", "x.npy", "-o", "m.circle"]):
        capsys.readouterr()
        assert main(argv) == 1, argv
        assert "it is the input file" in _err(capsys)
        capsys.readouterr()
    assert Path("m.circle").read_bytes() == before and os.stat("m.circle").st_mtime_ns == stamp
    for argv, message in (
        (train + ["--export_circle", "a.circle", "--export_tflite", "a.circle"],
         "--export_circle and --export_tflite both write 'a.circle'"),
        (train + ["--export_circle", "no/such/dir/a.circle"], "does not exist"),
        (train + ["--export_circle", "."], "it is a directory"),
        (["export", "m.circle"], "nothing to write"),
    ):
        capsys.readouterr()
        assert main(argv) == 1
        assert message in _err(capsys)
    assert sorted(os.listdir(".")) == ["link.circle", "m.circle", "x.npy", "y.npy"]


def test_a_failing_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", broken_fsync)
        assert main(["export", shared_model(MNIST), "--circle", "a.circle"]) == 1
    assert "No space left on device" in _err(capsys)
    assert os.listdir(".") == []  # neither the target nor a temporary file

    Path("old.circle").write_bytes(b"old")

    def half(f) -> None:
        f.write(b"partial")
        raise OSError(5, "I/O error")

    with pytest.raises(OSError, match="I/O error"):
        atomic_write("old.circle", half)
    assert Path("old.circle").read_bytes() == b"old" and os.listdir(".") == ["old.circle"]


def test_truncated_and_foreign_models_are_refused(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    data = Path(shared_model(MNIST)).read_bytes()
    Path("cut.circle").write_bytes(data[:len(data) // 2])
    Path("tiny.circle").write_bytes(data[:6])
    np.save("x.npy", np.zeros(3, np.float32))
    for name, message in (("cut.circle", "truncated"),
                          ("tiny.circle", "6 bytes is too short for a Circle/TFLite model"),
                          ("x.npy", "is neither b'CIR0' (Circle) nor b'TFL3' (TFLite)"),
                          ("none.circle", "does not exist")):
        assert main(["export", name, "--circle", "out.circle"]) == 1
        assert message in _err(capsys), name
    assert not Path("out.circle").exists()


def test_cli_export_keeps_shared_buffers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``export`` writes only changed weights: buffers shared by two signatures stay shared."""
    monkeypatch.chdir(tmp_path)
    name = "aeq_toy_transformer_kv_cache_2sig.tflite"
    assert main(["export", shared_model(name), "--tflite", "o.tflite", "--circle", "o.circle"]) == 0
    original = read_model(shared_model(name))
    for f in ("o.tflite", "o.circle"):
        data = Path(f).read_bytes()
        assert len(data) < len(original.source) + 1024  # not one copy per sharing tensor
        assert_same_model(original, read_model(data), same_format=f.endswith(".tflite"))
