"""``circle-jax export MODEL --training_graph functional``: the training step written with
onert_train's flags, refusals in one line before anything is written."""

from __future__ import annotations

import os

import numpy as np

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.cli import main
from circle_jax.formats.reader import read_model
from circle_jax.formats.wof import decode_wof
from circle_jax.ondevice import export_training_graph
from tests.paths import shared_model


def test_the_command_line_writes_the_step_and_its_state(tmp_path, capsys) -> None:
    path = shared_model("tfexamples_planestrike_mlp.tflite")
    out, wof = tmp_path / "step.tflite", tmp_path / "step.wof"
    assert main(["export", path, "--training_graph", "functional", "--loss", "2",
                 "--optimizer", "2", "--learning_rate", "0.01", "--batch_size", "16",
                 "--num_of_trainable_ops", "2", "--tflite", str(out), "--wof", str(wof)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    model = cj.load(path)
    same = export_training_graph(model, loss=2, optimizer=2, learning_rate=0.01,
                                 batch_size=16, trainable=2)
    assert out.read_bytes() == same.model and wof.read_bytes() == same.wof
    graph = read_model(same.model).main
    # the last 2 operators (FULLY_CONNECTED #3, SOFTMAX) train: op3's weights and bias
    readers = model.param_operators()
    trained = {n for n in model.trainable_params if 3 in readers[n]}
    weights = [n for n in same.state if n in model.params]
    assert set(weights) == trained
    assert graph.tensors[graph.inputs[0]].shape == (16, 8, 8)
    assert sum(b is not None for b in decode_wof(wof.read_bytes(), len(graph.tensors))) \
        == len(same.state)


def test_a_model_without_rules_on_the_path_is_refused_before_writing(tmp_path, capsys) -> None:
    b = Builder()
    x = b.input("x", (1, 4))
    y = b.op("FULLY_CONNECTED", [x, b.constant("w", np.ones((4, 4), np.float32)), -1])
    b.output(b.op("HARD_SWISH", [y]))
    model = tmp_path / "m.tflite"
    model.write_bytes(b.to_bytes("tflite"))
    out = tmp_path / "step.tflite"
    assert main(["export", str(model), "--training_graph", "functional", "--tflite",
                 str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HARD_SWISH #1" in err, err
    assert not os.path.exists(out)


def test_step_flags_need_the_training_graph(tmp_path, capsys) -> None:
    path = shared_model("tfexamples_planestrike_mlp.tflite")
    assert main(["export", path, "--optimizer", "2", "--tflite",
                 str(tmp_path / "m.tflite")]) != 0
    assert "--optimizer: training-step flag(s); give --training_graph functional" \
        in capsys.readouterr().err


def test_the_signatures_packaging_from_the_command_line(tmp_path, capsys) -> None:
    path = shared_model("tfexamples_planestrike_mlp.tflite")
    out = tmp_path / "train.tflite"
    assert main(["export", path, "--training_graph", "signatures", "--optimizer", "2",
                 "--batch_size", "4", "--tflite", str(out), "--wof",
                 str(tmp_path / "s.wof")]) != 0
    assert "--wof: the signatures packaging" in capsys.readouterr().err
    assert not out.exists()
    assert main(["export", path, "--training_graph", "signatures", "--optimizer", "2",
                 "--batch_size", "4", "--tflite", str(out)]) == 0
    sigs = {s.key for s in read_model(out.read_bytes()).signature_defs}
    assert sigs == {"train", "infer", "save", "restore"}


def test_a_new_head_with_momentum_from_the_command_line(tmp_path, capsys) -> None:
    """``--new_head K`` personalizes the model before its step is written (the head's params
    are the state); ``--optimizer momentum --momentum M`` adds one slot per weight."""
    path = shared_model("tfexamples_planestrike_mlp.tflite")
    out, wof = tmp_path / "step.tflite", tmp_path / "step.wof"
    assert main(["export", path, "--new_head", "3", "--seed", "7", "--training_graph",
                 "functional", "--optimizer", "momentum", "--momentum", "0.5",
                 "--batch_size", "4", "--tflite", str(out), "--wof", str(wof)]) == 0, \
        capsys.readouterr().err
    model = cj.load(path).personalize(new_head=3, seed=7)
    same = export_training_graph(model, optimizer="momentum", batch_size=4,
                                 optimizer_kwargs={"momentum": 0.5})
    assert out.read_bytes() == same.model and wof.read_bytes() == same.wof
    assert list(same.state) == ["head/weights", "head/bias", "head/weights/momentum",
                                "head/bias/momentum"]


def test_input_shapes_give_a_dynamic_input_its_shape(tmp_path, capsys) -> None:
    """openWakeWord's melspectrogram declares [1, 1] for a waveform of any length: without
    ``--input_shapes`` the export names the dynamic input, with it the step takes that shape;
    a shape of another batch or count is refused, nothing written."""
    path = shared_model("oww_melspectrogram.tflite")
    out = tmp_path / "step.tflite"
    base = ["export", path, "--training_graph", "functional", "--batch_size", "1",
            "--tflite", str(out)]
    for extra, message in (([], "'serving_default_input:0' declares [1, 1] for the dynamic "
                                "shape [-1, -1]: give its shape in the step"),
                           (["--input_shapes", "2x1760"], "each of batch 1"),
                           (["--input_shapes", "1x1760,1x3"], "one shape per input"),
                           (["--input_shapes", "1x-5"], "expected shapes such as 1x1760")):
        try:
            assert main(base + extra) != 0
        except SystemExit as e:  # argparse's usage error
            assert e.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert not out.exists()
    assert main(base + ["--input_shapes", "1x1760"]) == 0
    graph = read_model(out.read_bytes()).main
    assert graph.tensors[graph.inputs[0]].shape == (1, 1760)
