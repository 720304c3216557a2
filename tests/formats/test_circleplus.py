"""circle+ training metadata: written by ``train --export_circleplus`` and ``traininfo --set``,
read by onert's ``train_get_traininfo``, printed by ``traininfo``, used as training defaults."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.checkpoints import circleplus_metadata, traininfo_of
from circle_jax.cli import main
from circle_jax.examples import branching_cnn, digits
from circle_jax.formats import decode_traininfo
from circle_jax.train import TrainConfig, Trainer, fit
from tests.paths import shared_model

MNIST = "onert_micro_simple_mnist_model.circle"


def _onert_info(path: str) -> dict:
    from onert.native import libnnfw_api_pybind as lib

    s = lib.experimental.nnfw_session(path, "train")
    info = s.train_get_traininfo()
    return {"lr": info.learning_rate, "batch": info.batch_size, "loss": info.loss_info.loss.name,
            "reduction": info.loss_info.reduction_type.name, "opt": info.opt.name,
            "ops": info.num_of_trainable_ops}


def _mnist_data(n: int = 20) -> None:
    rng = np.random.default_rng(0)
    np.save("x.npy", rng.random((n, 11, 11, 1), dtype=np.float32))
    np.save("y.npy", np.eye(2, dtype=np.float32)[rng.integers(0, 2, n)])


def _params_printed(out: str) -> dict[str, str]:
    lines = out.split("== training parameter ==")[1].split("====")[0].strip().splitlines()
    return {k.strip("- ").strip(): v.strip() for k, v in (line.split("=", 1) for line in lines)}


def test_example_model_circleplus_reads_in_onert(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    Path("cnn.circle").write_bytes(branching_cnn().to_bytes("circle"))
    x, y = digits()
    np.save("x.npy", x[:64])
    np.save("y.npy", y[:64])
    assert main(["train", "cnn.circle", "--load_input", "x.npy", "--load_expected", "y.npy",
                 "--epoch", "1", "--batch_size", "16", "--optimizer", "adam", "--loss", "cce",
                 "--learning_rate", "0.005", "--export_circleplus", "p.circle"]) == 0
    assert _onert_info("p.circle") == {
        "lr": pytest.approx(0.005, rel=1e-7), "batch": 16, "loss": "CATEGORICAL_CROSSENTROPY",
        "reduction": "SUM_OVER_BATCH_SIZE", "opt": "ADAM", "ops": -1}
    plus = cj.load("p.circle")
    info = decode_traininfo(plus.ir.metadata["CIRCLE_TRAINING"])
    assert info.epochs == 1 and info.trainable_ops == tuple(range(7))
    before = cj.load("cnn.circle").params
    assert all(np.asarray(plus.params[k]).tobytes() != np.asarray(v).tobytes()
               for k, v in before.items())  # the trained weights went in
    capsys.readouterr()
    assert main(["traininfo", "p.circle"]) == 0
    out = capsys.readouterr().out
    assert "optimizer            = adam" in out and "batch_size           = 16" in out
    assert '"fineTuning": 0' in out


def test_traininfo_print_and_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    model = shared_model(MNIST)
    assert main(["traininfo", model]) == 0
    assert "no CIRCLE_TRAINING metadata" in capsys.readouterr().out
    hp = {"optimizer": {"type": "adam", "args": {"learningRate": 0.02}},
          "loss": {"type": "categorical crossentropy",
                   "args": {"fromLogits": False, "reduction": "sum"}},
          "batchSize": 8, "fineTuning": 2}
    Path("hp.json").write_text(json.dumps(hp))
    assert main(["traininfo", model, "--set", "hp.json", "-o", "plus.circle"]) == 0
    assert _onert_info("plus.circle") == {
        "lr": pytest.approx(0.02, rel=1e-7), "batch": 8, "loss": "CATEGORICAL_CROSSENTROPY",
        "reduction": "SUM", "opt": "ADAM", "ops": 2}
    capsys.readouterr()
    assert main(["traininfo", "plus.circle"]) == 0
    out = capsys.readouterr().out
    assert "learning_rate        = 0.02" in out and "trainable_ops        = (4, 5)" in out
    # the weights and everything else are untouched
    assert cj.load("plus.circle").ir.main.operators == cj.load(model).ir.main.operators

    Path("bad.json").write_text("{")
    Path("odd.json").write_text(json.dumps({**hp, "momentum": 1}))
    for argv, message in [
        (["--set", "hp.json"], "--set needs -o OUT"),
        (["--set", "hp.json", "-o", model], "it is the input file"),
        (["--set", "bad.json", "-o", "o.circle"], "bad.json: not valid JSON"),
        (["--set", "odd.json", "-o", "o.circle"], "unknown training JSON key(s) 'momentum'"),
    ]:
        assert main(["traininfo", model, *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("E: ") and message in err and err.count("\n") == 1, err
    assert not Path("o.circle").exists()


def _with_circleplus(path: str) -> None:
    hp = {"optimizer": {"type": "adam", "args": {"learningRate": 0.02}},
          "loss": {"type": "categorical crossentropy", "args": {"reduction": "sum"}},
          "batchSize": 8, "fineTuning": 2}
    Path("hp.json").write_text(json.dumps(hp))
    assert main(["traininfo", shared_model(MNIST), "--set", "hp.json", "-o", path]) == 0


def test_circleplus_values_are_training_defaults(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    """A circle+ model trains with its lr/batch/loss/reduction/optimizer/trainable ops."""
    monkeypatch.chdir(tmp_path)
    _with_circleplus("plus.circle")
    _mnist_data()
    model = cj.load("plus.circle")
    cfg = TrainConfig().with_defaults(model)
    assert (cfg.learning_rate, cfg.batch_size, cfg.loss, cfg.reduction, cfg.optimizer,
            cfg.trainable) == (pytest.approx(0.02), 8, "categorical_crossentropy", "sum",
                               "adam", 2)
    assert Trainer(model).trainable == {"arith.constant"}  # the last two ops: FC, softmax
    capsys.readouterr()
    assert main(["train", "plus.circle", "--load_input", "x.npy", "--load_expected", "y.npy",
                 "--epoch", "1", "--export_circle", "out.circle"]) == 0
    printed = _params_printed(capsys.readouterr().out)
    assert printed["learning_rate"] == "0.02" and printed["batch_size"] == "8"
    assert printed["loss_info"] == "{loss = categorical crossentropy, reduction = sum}"
    assert printed["optimizer"] == "adam" and printed["num_of_trainable_ops"] == "2"
    # the same run spelled out in full gives the same weights, bit for bit
    plain = cj.load(shared_model(MNIST))
    want = fit(plain, np.load("x.npy"), np.load("y.npy"), epochs=1, learning_rate=0.02,
               batch_size=8, loss="cce", reduction="sum", optimizer="adam", trainable=2)
    got = cj.load("out.circle").params
    for k, v in want.params.items():
        assert np.asarray(got[k]).tobytes() == np.asarray(v).tobytes(), k


def test_flags_override_circleplus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    """onert_train's flags win over circle+; --export_circleplus then stores the flags."""
    monkeypatch.chdir(tmp_path)
    _with_circleplus("plus.circle")
    _mnist_data()
    cfg = TrainConfig(learning_rate=0.05, batch_size=5, optimizer="sgd", loss="mse",
                      reduction=2, trainable=3).with_defaults(cj.load("plus.circle"))
    assert (cfg.learning_rate, cfg.batch_size, cfg.optimizer, cfg.loss, cfg.reduction,
            cfg.trainable) == (0.05, 5, "sgd", "mse", 2, 3)
    capsys.readouterr()
    assert main(["train", "plus.circle", "--load_input", "x.npy", "--load_expected", "y.npy",
                 "--epoch", "1", "--optimizer", "1", "--loss", "1", "--loss_reduction_type", "2",
                 "--num_of_trainable_ops", "3", "--batch_size", "5", "--learning_rate", "0.05",
                 "--export_circleplus", "flags.circle"]) == 0
    printed = _params_printed(capsys.readouterr().out)
    assert printed["learning_rate"] == "0.05" and printed["batch_size"] == "5"
    assert printed["loss_info"] == "{loss = mean squared error, reduction = sum}"
    assert printed["optimizer"] == "sgd" and printed["num_of_trainable_ops"] == "3"
    assert _onert_info("flags.circle") == {
        "lr": pytest.approx(0.05, rel=1e-7), "batch": 5, "loss": "MEAN_SQUARED_ERROR",
        "reduction": "SUM", "opt": "SGD", "ops": 3}


def test_what_circleplus_cannot_hold_is_refused(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    model = cj.load(branching_cnn().to_bytes("circle"))
    with pytest.raises(ValueError, match="optimizer 'rmsprop' cannot be written"):
        traininfo_of(Trainer(model, optimizer="rmsprop"))
    with pytest.raises(ValueError, match="1 trainable weights .* not the weights of the last N"):
        traininfo_of(Trainer(model, trainable=["conv1/filter"]))
    # names that are exactly the last N operators' weights are fine
    info = traininfo_of(Trainer(model, trainable=["dense/weights", "dense/bias"]))
    assert info.trainable_ops == (5, 6)
    meta = circleplus_metadata(Trainer(model, optimizer="adam", learning_rate=0.5,
                                       optimizer_kwargs={"b1": 0.8}))
    back = decode_traininfo(meta["CIRCLE_TRAINING"])
    assert (back.optimizer, back.learning_rate, back.beta_1) == ("adam", 0.5,
                                                                 pytest.approx(0.8))
    _mnist_data()
    capsys.readouterr()
    assert main(["train", shared_model(MNIST), "--load_input", "x.npy", "--load_expected",
                 "y.npy", "--optimizer", "rmsprop", "--export_circleplus", "r.circle"]) == 1
    err = capsys.readouterr()
    assert err.err.startswith("E: circle+ stores only plain sgd or adam")
    assert "Epoch" not in err.out and not Path("r.circle").exists()  # refused before training
