"""``circle-jax run`` and ``info`` on LiteRT's on-device training files."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from circle_jax.cli import main
from tests.paths import TESTS

DATA = os.path.join(TESTS, "data", "ondevice")
MLP = os.path.join(DATA, "mlp_sgd.tflite")
CNN = os.path.join(DATA, "tutorial_cnn.tflite")


@pytest.fixture()
def files(tmp_path) -> dict[str, str]:
    d = np.load(os.path.join(DATA, "mlp_sgd.npz"))
    out = {"dir": str(tmp_path)}
    for k in ("x", "y"):
        out[k] = str(tmp_path / f"{k}.npy")
        np.save(out[k], d[k])
    out["xy"] = str(tmp_path / "xy.npz")
    np.savez(out["xy"], x=d["x"], y=d["y"])
    c = np.load(os.path.join(DATA, "tutorial_cnn.npz"))
    out["cnn_x"] = str(tmp_path / "cx.npy")
    np.save(out["cnn_x"], c["x"])
    out["cnn_init"] = str(tmp_path / "cnn_init.npz")
    np.savez(out["cnn_init"], **{k[len("init/"):]: c[k] for k in c.files if k.startswith("init/")})
    return out


def test_run_trains_steps_and_saves_the_variables(files, capsys) -> None:
    d = np.load(os.path.join(DATA, "mlp_sgd.npz"))
    saved = os.path.join(files["dir"], "v.npz")
    assert main(["run", MLP, "--signature", "train", "--input", f"x={files['x']}",
                 "--input", f"y={files['y']}", "--steps", "20", "--save_variables", saved,
                 "--output_dir", files["dir"]]) == 0
    out = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"^step \d+: loss (\S+)$", out, re.M)]
    np.testing.assert_allclose(losses, d["losses"], rtol=1e-5)  # 7 digits printed
    with np.load(saved) as v:
        for k in ("w1", "b1", "w2", "b2"):
            np.testing.assert_allclose(v[k], d[f"final/{k}"], rtol=1e-5, atol=1e-6)
    # infer from the trained variables = TF's infer after training
    assert main(["run", MLP, "--signature", "infer", "--input", files["xy"].replace("xy", "x")
                 .replace(".npz", ".npy"), "--variables", saved,
                 "--output_dir", files["dir"]]) == 1  # a bare file: NAME=FILE needed
    assert main(["run", MLP, "--signature", "infer", "--input", f"x={files['x']}",
                 "--variables", saved, "--output_dir", files["dir"]]) == 0
    np.testing.assert_allclose(np.load(os.path.join(files["dir"], "output_0.npy")),
                               d["infer_after"], rtol=1e-5, atol=1e-6)


def test_run_takes_one_npz_named_by_the_signature(files, capsys) -> None:
    assert main(["run", MLP, "--signature", "train", "--input", files["xy"],
                 "--output_dir", files["dir"]]) == 0
    d = np.load(os.path.join(DATA, "mlp_sgd.npz"))
    np.testing.assert_allclose(np.load(os.path.join(files["dir"], "output_0.npy")),
                               d["losses"][0], rtol=1e-6)


def test_variables_let_a_file_without_initialisers_run(files, capsys) -> None:
    c = np.load(os.path.join(DATA, "tutorial_cnn.npz"))
    argv = ["run", CNN, "--signature", "infer", "--input", f"x={files['cnn_x']}",
            "--output_dir", files["dir"]]
    assert main(argv) == 1
    assert "variable 'cnn/conv/kernel' is read" in capsys.readouterr().err
    assert main([*argv, "--variables", files["cnn_init"]]) == 0
    np.testing.assert_allclose(np.load(os.path.join(files["dir"], "output_0.npy")),
                               c["infer_before"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--input", "x=X"], r"has 4 signatures; expected --signature KEY, one of 'infer', "
     r"'restore', 'save', 'train'"),
    (["--signature", "nope", "--input", "x=X"], r"no signature 'nope' \(signatures: "),
    (["--signature", "train", "--input", "x=X"], r"needs --input for 'y' \(its inputs: "),
    (["--signature", "train", "--input", "z=X"], r"has no input 'z' \(its inputs: 'x', 'y'\)"),
    (["--signature", "train", "--input", "x=Y", "--input", "y=Y"], r"shape \[4, 4\]"),
    (["--signature", "infer", "--input", "x=X", "--steps", "0"], r"--steps 0"),
    (["--signature", "infer", "--input", "x=X", "--variables", "X"], r"not a \.npz archive"),
    (["--signature", "infer", "--input", "x=X", "--variables", "CNN"],
     r"no variable 'cnn/conv/\w+' \(variables: 'w2', 'w1', 'b2', 'b1'\)"),
    (["--signature", "save", "--input", "checkpoint_path=/tmp/c"],
     r"signature 'save' runs 1 Flex operator\(s\) circle-jax has no kernel for: FlexSave"),
])
def test_bad_runs_are_one_error_line(files, argv, message, capsys) -> None:
    subst = {"X": files["x"], "Y": files["y"], "CNN": files["cnn_init"]}
    argv = [re.sub(r"\b(X|Y|CNN)$", lambda m: subst[m.group(1)], a) for a in argv]
    if "Flex" in message:
        from circle_jax.ops.registry import definition
        if definition("CUSTOM:FlexSave") is not None:  # the Flex kernels have landed
            return
    assert main(["run", MLP, *argv, "--output_dir", files["dir"]]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("E: "), err
    assert re.search(message, err), err


def test_signature_flags_need_a_file_with_variables(files, capsys) -> None:
    plain = os.path.join(TESTS, "data", "keras")
    model = next(os.path.join(plain, f) for f in sorted(os.listdir(plain))
                 if f.endswith(".tflite"))
    assert main(["run", model, "--input", files["x"], "--steps", "2"]) == 1
    assert "--steps applies to a file with resource variables" in capsys.readouterr().err


def test_info_lists_signatures_variables_and_flex_operators(capsys) -> None:
    assert main(["info", CNN]) == 0
    out = capsys.readouterr().out
    assert "  train(x: float32[4, 8, 8, 1], y: float32[4, 3]) -> loss: float32[]  " \
        "(subgraph 3)  [Flex: Conv2DBackpropFilter, MaxPoolGrad, ReluGrad" in out
    assert "variables (6; 0 initialised by init subgraph(s) none" in out
    assert re.search(r"^  cnn/conv/kernel +float32\[3, 3, 1, 4\] +not initialised$", out, re.M)
    assert re.search(r"^  sgd/iteration +int64\[\] +not initialised$", out, re.M)
    for op in ("Conv2DBackpropFilter", "MaxPoolGrad", "ReluGrad", "Restore", "Save"):
        assert re.search(rf"^  Flex{op} \(TF op {op}; ", out, re.M), op
    assert main(["info", MLP]) == 0
    out = capsys.readouterr().out
    assert "variables (4; 4 initialised by init subgraph(s) 4):" in out
    assert re.search(r"^  w1 +float32\[8, 16\] +initialised$", out, re.M)
    assert "  infer(x: float32[4, 8]) -> output: float32[4, 4]  (subgraph 0)\n" in out
