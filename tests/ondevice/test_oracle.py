"""The oracle: an on-device file's own train step (TF's converter-made gradients, run by the
signature runner) against circle-jax's autodiff of its infer (`circle_jax.oracle.ondevice`).

The two are independent: the file's gradient graph was written by TF's converter, circle-jax
differentiates the forward with jax.grad (itself checked against float64 finite differences
in test_signatures.py). Gradients agree within 1e-5 relative (measured at most 8.2e-7 over
two steps); a file whose gradient of one variable is mutated, or a loss other than the
file's, is named at its first departing variable and step.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.formats import write_model
from circle_jax.graph import ir
from circle_jax.graph.variables import handles
from circle_jax.oracle.ondevice import compare_train_signature
from tests.paths import TESTS

DATA = os.path.join(TESTS, "data", "ondevice")
CASES = {
    "mlp_sgd": dict(learning_rate=0.1, loss="mse", optimizer="sgd"),
    "mlp_adam": dict(learning_rate=0.01, loss="cce", from_logits=True, optimizer="adam",
                     optimizer_kwargs={"eps": 1e-7}),
    "frozen_head": dict(learning_rate=0.5, loss="cce", from_logits=True, optimizer="sgd"),
    "tutorial_cnn": dict(learning_rate=0.1, loss="cce", from_logits=True, optimizer="sgd"),
    "tutorial_cnn_adam": dict(learning_rate=0.01, loss="cce", from_logits=True,
                              optimizer="adam", optimizer_kwargs={"eps": 1e-7}),
}


def path(name: str, ext: str = ".tflite") -> str:
    return os.path.join(DATA, f"{name}{ext}")


def recorded(name: str) -> dict[str, np.ndarray]:
    with np.load(path(name, ".npz")) as d:
        return dict(d)


def _compare(name: str, source=None, **changes):
    d = recorded(name)
    restore = path(name, ".init.ckpt") if name.startswith("tutorial") else None
    return compare_train_signature(source or path(name), [d["x"]], d["y"],
                                   cj.TrainConfig(**{**CASES[name], **changes}), steps=2,
                                   restore=restore)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_files_step_is_circle_jaxs_autodiff(name: str) -> None:
    report = _compare(name)
    assert report.agree, report.table()
    variables = [v.variable for v in report.steps[0].variables]
    if name == "frozen_head":
        assert variables == ["hw", "hb"]  # fw, fb: train does not assign them
    assert report.gradients_compared == (CASES[name]["optimizer"] == "sgd")
    for s in report.steps:
        np.testing.assert_allclose(s.loss_circle_jax, s.loss_file, rtol=1e-5)
        for v in s.variables:
            if v.gradient is not None:  # the raw difference, no rounding floor
                assert v.gradient <= 1e-5, (s.step, v)


def _mutated_mlp(variable: str, factor: float) -> bytes:
    """mlp_sgd.tflite whose train scales ``variable``'s update by ``factor``: its MUL by the
    learning rate reads a new constant (the other variables keep the shared one)."""
    model = cj.read_model(path("mlp_sgd"))
    sig = next(s for s in model.signature_defs if s.key == "train")
    sg = model.subgraphs[sig.subgraph_index]
    names, producer = handles(sg), {o: op for op in sg.operators for o in op.outputs}
    assign = next(op for op in sg.operators if op.type == "ASSIGN_VARIABLE"
                  and names[op.inputs[0]] == variable)
    mul = producer[producer[assign.inputs[1]].inputs[1]]
    assert mul.type == "MUL"
    lr = mul.inputs[1]
    data = np.array(sg.tensors[lr].data * factor, np.float32)
    data.flags.writeable = False
    new = replace(sg.tensors[lr], index=len(sg.tensors), name="mutated_lr", data=data,
                  buffer=ir.NEW_BUFFER, origin=None)
    ops = tuple(replace(op, inputs=(op.inputs[0], new.index)) if op is mul else op
                for op in sg.operators)
    sg = replace(sg, tensors=(*sg.tensors, new), operators=ops)
    return write_model(replace(model, subgraphs=tuple(
        sg if s.index == sg.index else s for s in model.subgraphs)), "tflite")


def test_a_mutated_gradient_is_named_at_its_variable() -> None:
    report = _compare("mlp_sgd", _mutated_mlp("w2", 1.001))
    assert report.first == (1, "w2", "gradient"), report.table()
    rows = {v.variable: v for v in report.steps[0].variables}
    assert rows["w2"].departs and not rows["w1"].departs
    np.testing.assert_allclose(rows["w2"].gradient, 0.001 / 1.001, rtol=1e-3)


def test_a_loss_other_than_the_files_departs_at_once() -> None:
    report = _compare("mlp_sgd", reduction="sum")  # the file takes the batch mean
    assert report.first == (1, "w1", "gradient")
    np.testing.assert_allclose(report.steps[0].variables[0].gradient, 3.0, rtol=1e-5)


def test_cli_compare_with_the_file(tmp_path, capsys) -> None:
    d = recorded("tutorial_cnn")
    files = []
    for k in ("x", "y"):
        files.append(str(tmp_path / f"{k}.npy"))
        np.save(files[-1], d[k])
    argv = ["compare", path("tutorial_cnn"), "--with", "file", "--restore",
            path("tutorial_cnn", ".init.ckpt"), "--load_input", files[0], "--load_expected",
            files[1], "--loss", "cce", "--from_logits", "--optimizer", "sgd", "--steps", "2",
            "--report", str(tmp_path / "r.json")]
    assert main([*argv, "--learning_rate", "0.1"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("agree") and "cnn/conv/kernel" in out
    assert main([*argv, "--learning_rate", "0.2"]) == 1  # not the file's learning rate
    assert "first departure: step 1, cnn/conv/kernel (gradient)" in capsys.readouterr().out
    assert main(["compare", path("mlp_sgd"), "--with", "file", "--signature", "train",
                 "--load_input", files[0], "--load_expected", files[1]]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("E: "), err
