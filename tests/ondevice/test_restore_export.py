"""``load(signature="infer", restore=CHECKPOINT)`` and the export of an on-device file.

Restore against TF eager's numbers (the npz files: the variables TF saved in the checkpoints,
``infer`` before and after training). The export against LiteRT's own interpreter (its
builtin-only signatures) and circle_jax.Interpreter (the Flex ones): the exported file's
``infer`` is circle-jax's output at the trained params and its ``train`` goes on from them
(its first loss is the loss at those params, computed here in numpy).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.errors import ConfigError, DataError, VariableError
from circle_jax.formats.tf_checkpoint import read_checkpoint, write_checkpoint
from tests.paths import TESTS

DATA = os.path.join(TESTS, "data", "ondevice")


def path(name: str, ext: str = ".tflite") -> str:
    return os.path.join(DATA, f"{name}{ext}")


def recorded(name: str) -> dict[str, np.ndarray]:
    with np.load(path(name, ".npz")) as d:
        return dict(d)


CONFIGS = {
    "mlp_sgd": dict(learning_rate=0.1, loss="mse", optimizer="sgd"),
    "tutorial_cnn": dict(learning_rate=0.1, loss="cce", from_logits=True, optimizer="sgd"),
    "mlp_adam": dict(learning_rate=0.01, loss="cce", from_logits=True, optimizer="adam",
                     optimizer_kwargs={"eps": 1e-7}),
    "frozen_head": dict(learning_rate=0.5, loss="cce", from_logits=True, optimizer="sgd"),
}


def file_loss(name: str, logits: np.ndarray, y: np.ndarray) -> float:
    """The loss the file's train computes (float64): MSE, or softmax cross-entropy."""
    z = np.asarray(logits, np.float64)
    if name == "mlp_sgd":
        return float(np.mean((z - y) ** 2))
    z = z - z.max(axis=1, keepdims=True)
    return float(np.mean(-(y * (z - np.log(np.exp(z).sum(axis=1, keepdims=True)))).sum(1)))


@pytest.mark.parametrize("name, ckpt, want", [
    ("tutorial_cnn", "init", "infer_before"),      # the file initialises nothing
    ("tutorial_cnn", "trained", "infer_after"),
    ("mlp_sgd", "trained", "infer_after"),         # the checkpoint's over the initial values
])
def test_restore_gives_the_variables_the_checkpoints_values(name, ckpt, want) -> None:
    d = recorded(name)
    model = cj.load(path(name), signature="infer", restore=path(name, f".{ckpt}.ckpt"))
    saved = read_checkpoint(path(name, f".{ckpt}.ckpt"))
    for k in model.trainable_params:  # the variables infer reads, exactly TF's
        np.testing.assert_array_equal(model.params[k], saved[k])
    np.testing.assert_allclose(model(d["x"])[0], d[want], rtol=1e-5, atol=1e-6)
    assert any(r.name == "read_variables_as_constants" and "checkpoint" in " ".join(
        r.changes.values()) for r in model.passes)


def test_only_the_variables_the_files_train_assigns_train() -> None:
    cnn = cj.load(path("tutorial_cnn"), signature="infer", restore=path("tutorial_cnn",
                                                                        ".init.ckpt"))
    # the kernel reaches CONV_2D through a TRANSPOSE, the zero bias is a converter's constant
    assert cnn.trainable_params == {"cnn/conv/kernel", "cnn/conv/bias", "cnn/dense/kernel",
                                    "cnn/dense/bias"}
    assert len(cnn.params) == 5
    frozen = cj.load(path("frozen_head"), signature="infer")
    assert frozen.trainable_params == {"hw", "hb"}  # fw, fb: variables train never assigns


def _bad_checkpoint(tmp_path, change: str) -> str:
    tensors = read_checkpoint(path("tutorial_cnn", ".init.ckpt"))
    if change == "shape":
        tensors["cnn/dense/kernel"] = tensors["cnn/dense/kernel"].reshape(3, 64)
    elif change == "dtype":
        tensors["sgd/learning_rate"] = tensors["sgd/learning_rate"].astype(np.float64)
    else:
        del tensors["cnn/conv/bias"]
    out = str(tmp_path / f"{change}.ckpt")
    write_checkpoint(out, tensors)
    return out


@pytest.mark.parametrize("change, match", [
    ("shape", r"tensor 'cnn/dense/kernel' is float32 \[3, 64\], expected float32 \[64, 3\] "
     r"\(restore reads it into variable 'cnn/dense/kernel', float32\[64, 3\]\)"),
    ("dtype", r"tensor 'sgd/learning_rate' is float64 \[\], expected float32 \[\]"),
    ("name", r"holds no tensor 'cnn/conv/bias' \(it holds 'cnn/conv/kernel', "),
])
def test_a_checkpoint_with_wrong_tensors_is_one_line(tmp_path, change, match) -> None:
    with pytest.raises(DataError, match=match) as e:
        cj.load(path("tutorial_cnn"), signature="infer", restore=_bad_checkpoint(tmp_path,
                                                                                   change))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("call, error, match", [
    (lambda: cj.load(path("tutorial_cnn"), signature="infer"), VariableError,
     r"'cnn/conv/kernel' .* has no initial value in the file .*restore=CHECKPOINT"),
    (lambda: cj.load(path("tutorial_cnn"), signature="infer", restore=path("mlp_sgd",
                                                                           ".init.ckpt")),
     DataError, r"holds no tensor 'cnn/conv/kernel'"),
    (lambda: cj.load(path("tutorial_cnn"), signature="infer", restore="/no/such.ckpt"),
     DataError, r"checkpoint '/no/such.ckpt' does not exist"),
    (lambda: cj.load(path("flex_ops"), signature="relu_grad", restore=path("mlp_sgd",
                                                                           ".init.ckpt")),
     ConfigError, r"has no resource variables to restore"),
])
def test_restore_refusals_are_one_line(call, error, match) -> None:
    with pytest.raises(error, match=match) as e:
        call()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["mlp_sgd", "mlp_adam", "frozen_head", "tutorial_cnn"])
def test_export_keeps_every_signature_and_its_train_goes_on(name: str) -> None:
    """fit on infer (TF's train-signature losses, 1e-4), export: LiteRT's and circle-jax's
    infer on the export = circle-jax's output at the trained params (1e-5; measured 4.8e-7),
    the export's train starts at the loss of those params (1e-5 relative: float32 sums)
    and goes down (LiteRT's own train too on the builtin-only files). frozen_head trains
    hw, hb alone by default (what its train assigns). The tutorial's file had no
    initialisers: the export gains an init subgraph that LiteRT runs."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    d = recorded(name)
    restore = path(name, ".init.ckpt") if name == "tutorial_cnn" else None
    model = cj.load(path(name), signature="infer", restore=restore)
    result = cj.fit(model, d["x"], d["y"], cj.TrainConfig(epochs=20, batch_size=4,
                                                          **CONFIGS[name]))
    np.testing.assert_allclose(result.history.loss, d["losses"], rtol=1e-4)
    exported = model.export(result.params, "tflite")
    ours = np.asarray(model.apply(result.params, d["x"])[0])
    original = cj.Interpreter(model_path=path(name)).get_signature_list()
    litert = LiteRT(model_content=exported)
    litert.allocate_tensors()
    assert litert.get_signature_list() == original
    np.testing.assert_allclose(litert.get_signature_runner("infer")(x=d["x"])["output"], ours,
                               rtol=1e-5, atol=1e-6)
    it = cj.Interpreter(model_content=exported)
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"], ours,
                               rtol=1e-5, atol=1e-6)
    train = it.get_signature_runner("train")
    first = float(train(x=d["x"], y=d["y"])["loss"])
    np.testing.assert_allclose(first, file_loss(name, ours, d["y"]), rtol=1e-5)
    assert float(train(x=d["x"], y=d["y"])["loss"]) < first
    if name != "tutorial_cnn":  # builtin-only: LiteRT's own train goes on from there too
        np.testing.assert_allclose(
            litert.get_signature_runner("train")(x=d["x"], y=d["y"])["loss"], first, rtol=1e-5)


def test_the_export_restores_and_saves_as_the_file_does(tmp_path) -> None:
    d = recorded("tutorial_cnn")
    model = cj.load(path("tutorial_cnn"), signature="infer",
                    restore=path("tutorial_cnn", ".trained.ckpt"))
    it = cj.Interpreter(model_content=model.export())
    out = tmp_path / "saved.ckpt"
    it.get_signature_runner("save")(checkpoint_path=np.array(str(out)))
    saved, trained = read_checkpoint(out), read_checkpoint(path("tutorial_cnn",
                                                                ".trained.ckpt"))
    assert sorted(saved) == sorted(trained)  # the optimizer's variables came along
    for k, v in trained.items():
        np.testing.assert_array_equal(saved[k], v, err_msg=k)
    it.get_signature_runner("restore")(checkpoint_path=np.array(path("tutorial_cnn",
                                                                     ".init.ckpt")))
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"],
                               d["infer_before"], rtol=1e-5, atol=1e-6)


def test_a_trained_constant_that_is_no_variable_is_refused_at_export() -> None:
    model = cj.load(path("tutorial_cnn"), signature="infer",
                    restore=path("tutorial_cnn", ".init.ckpt"))
    (constant,) = set(model.params) - model.trainable_params
    params = {**model.params, constant: np.ones_like(model.params[constant])}
    with pytest.raises(ConfigError, match=rf"param {re.escape(repr(constant))} is a constant "
                       "of the file, no variable"):
        model.export(params)


def test_cli_restore_on_run_and_export(tmp_path, capsys) -> None:
    d = recorded("tutorial_cnn")
    x = str(tmp_path / "x.npy")
    np.save(x, d["x"])
    ckpt = path("tutorial_cnn", ".init.ckpt")
    assert main(["run", path("tutorial_cnn"), "--signature", "infer", "--input", f"x={x}",
                 "--restore", ckpt, "--output_dir", str(tmp_path)]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), d["infer_before"],
                               rtol=1e-5, atol=1e-6)
    out = str(tmp_path / "out.tflite")
    assert main(["export", path("tutorial_cnn"), "--signature", "infer", "--restore", ckpt,
                 "--tflite", out]) == 0
    it = cj.Interpreter(model_path=out)
    assert list(it.get_signature_list()) == ["infer", "restore", "save", "train"]
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"],
                               d["infer_before"], rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    bad = _bad_checkpoint(tmp_path, "shape")
    assert main(["run", path("tutorial_cnn"), "--signature", "infer", "--input", f"x={x}",
                 "--restore", bad, "--output_dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensor 'cnn/dense/kernel' is float32 [3, 64]" in err


def test_cli_train_with_restore_reaches_tensorflows_weights(tmp_path) -> None:
    """``circle-jax train --signature infer --restore``: 20 epochs of the tutorial's step
    (SGD 0.1, cross-entropy from logits), exported: the export's infer = TF's after its
    20 steps (1e-5; fit = TF's losses within 5.4e-7 relative)."""
    d = recorded("tutorial_cnn")
    files = {}
    for k in ("x", "y"):
        files[k] = str(tmp_path / f"{k}.npy")
        np.save(files[k], d[k])
    out = str(tmp_path / "trained.tflite")
    assert main(["train", path("tutorial_cnn"), "--signature", "infer", "--restore",
                 path("tutorial_cnn", ".init.ckpt"), "--load_input", files["x"],
                 "--load_expected", files["y"], "--epoch", "20", "--batch_size", "4",
                 "--learning_rate", "0.1", "--loss", "cce", "--from_logits", "--optimizer",
                 "sgd", "--export_tflite", out]) == 0
    it = cj.Interpreter(model_path=out)
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"],
                               d["infer_after"], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- int64 without x64

def test_int64_variables_are_exact_or_refused_in_one_line(tmp_path) -> None:
    """Keras's step counter is int64; JAX (no x64) computes it in int32: a value that fits
    is exact (2**31 - 1 restores and reads back as int64), one that does not is refused in
    one line, from a checkpoint or set by hand."""
    import jax

    if jax.config.jax_enable_x64:
        pytest.skip("64-bit mode computes int64 exactly")
    d = recorded("tutorial_cnn")
    tensors = read_checkpoint(path("tutorial_cnn", ".init.ckpt"))
    tensors["sgd/iteration"] = np.array(2**31 - 1, np.int64)
    edge = str(tmp_path / "edge.ckpt")
    write_checkpoint(edge, tensors)
    it = cj.Interpreter(model_path=path("tutorial_cnn"))
    it.get_signature_runner("restore")(checkpoint_path=np.array(edge))
    assert it.variables["sgd/iteration"].dtype == np.int64
    assert int(it.variables["sgd/iteration"]) == 2**31 - 1
    tensors["sgd/iteration"] = np.array(2**33, np.int64)
    big = str(tmp_path / "big.ckpt")
    write_checkpoint(big, tensors)
    with pytest.raises(DataError, match=r"tensor 'sgd/iteration' \(int64\) holds 8589934592, "
                       "which JAX computes as int32 without 64-bit mode") as e:
        cj.load(path("tutorial_cnn"), signature="infer", restore=big)
    assert "\n" not in str(e.value)
    it.set_variables({"sgd/iteration": np.array(-2**40, np.int64)})
    with pytest.raises(VariableError, match=r"variable 'sgd/iteration' \(int64\) holds "
                       r"-1099511627776"):
        it.get_signature_runner("train")(x=d["x"], y=d["y"])


def test_initial_values_change_only_the_variables_named() -> None:
    """mlp_adam's init subgraph: new values for m_w1 and step leave every other variable's
    initial value as the file had it; bad values are one line."""
    from circle_jax.formats import write_model
    from circle_jax.signatures import Program
    from circle_jax.signatures.initialisers import with_initial_values

    model = cj.read_model(path("mlp_adam"))
    before = Program(model).initial_variables()
    out = with_initial_values(model, {"m_w1": np.ones((8, 16), np.float32),
                                      "step": np.float32(3)})
    after = Program(write_model(out, "tflite")).initial_variables()
    assert sorted(after) == sorted(before)
    np.testing.assert_array_equal(after["m_w1"], np.ones((8, 16), np.float32))
    assert float(after["step"]) == 3.0
    for k in set(before) - {"m_w1", "step"}:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    for values, match in [({"w9": 0}, r"no variable 'w9'"),
                          ({"w1": np.zeros((16, 8))}, r"variable 'w1' is float32\[8, 16\]; "
                           r"its value has shape \[16, 8\]"),
                          ({"b1": np.full(16, np.nan)}, r"variable 'b1' holds NaN")]:
        with pytest.raises(DataError, match=match):
            with_initial_values(model, values)
