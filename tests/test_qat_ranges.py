"""Quantization-aware training with moving activation ranges (``load(qat_ranges="ema")``).

TF's QAT (tfmot's MovingAverageQuantizer) moves every activation range toward each batch's
min/max, widened to hold 0, with decay 0.999: ``r = r * d + batch * (1 - d)``. Here: the
ranges move that way and stay the file's under ``qat_ranges="file"``; resuming from a
checkpoint is bit-exact; the export writes the moved ranges' scales and zero points and
LiteRT runs it, each operator within 1 step of its grid of the simulation's (fake-quant
with the moved ranges) value; bad values are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.lowering.interpreter import RANGES
from tests.passes.test_qat import _as_input, _litert, _producer, _real, forced

DATA = Path(__file__).parent / "data" / "quantized"


def _digits(model: cj.Model, n: int) -> tuple[np.ndarray, np.ndarray]:
    d = np.load(Path(cj.__file__).parent / "examples" / "digits.npz")
    x = (d["images"][:n].astype(np.float32) / 16.0).reshape(n, *model.inputs[0].shape[1:])
    return x, np.eye(10, dtype=np.float32)[d["labels"][:n]]


def _fit(model: cj.Model, n: int = 32, lr: float = 0.05, epochs: int = 1) -> cj.FitResult:
    x, y = _digits(model, n)
    return cj.fit(model, x, y, epochs=epochs, batch_size=8, learning_rate=lr,
                  optimizer="sgd", loss="categorical_crossentropy")


@pytest.mark.slow
def test_ema_ranges_move_toward_the_data_and_file_ranges_stay() -> None:
    """One step moves each range by exactly ``(1 - d)`` of the way to the batch's observed
    ``[min(0, lo), max(0, hi)]``; 8 steps take the input's range to the data's; with
    ``qat_ranges="file"`` the state holds no ranges and the export keeps the file's
    activation parameters."""
    model = cj.load(DATA / "full_int8_float_io.tflite", qat=True, qat_ranges="ema",
                    qat_range_decay=0.5)
    assert model.qat_forward == "fake_quant" and len(model.ranges) >= 5
    # the initial ranges (the file's) give back the file's scales and zero points
    assert model.export({**model.params, RANGES: model.ranges}) == model.export()
    x, _ = _digits(model, 8)
    start = {k: jnp.asarray(v) for k, v in model.ranges.items()}
    seen = jax.jit(model.observe)({**model.params, RANGES: start}, x)
    one = _fit(model, n=8, lr=0.0)  # one step, weights unchanged
    for k, r in one.params[RANGES].items():
        lo, hi = min(float(seen[k][0]), 0.0), max(float(seen[k][1]), 0.0)
        want = np.float32(0.5) * start[k] + np.float32(0.5) * np.float32([lo, hi])
        np.testing.assert_allclose(np.asarray(r), want, rtol=1e-6, err_msg=k)
    assert any(not np.array_equal(np.asarray(one.params[RANGES][k]), start[k]) for k in start)
    # 8 steps on half-bright digits (every batch spans [0, 0.5]): the input's range
    # [0, 1] becomes 0.5**8 * [0, 1] + (1 - 0.5**8) * [0, 0.5]
    x, y = _digits(model, 64)
    many = cj.fit(model, x * np.float32(0.5), y, epochs=1, batch_size=8, learning_rate=0.0,
                  optimizer="sgd", loss="categorical_crossentropy")
    (name,) = [k for k, members in model.fake_quant.moving.items()
               if members == (model.simulated.main.operators[0].outputs[0],)]
    np.testing.assert_allclose(np.asarray(many.params[RANGES][name]),
                               [0.0, 0.5 + 0.5 * 0.5**8], rtol=1e-6)
    fixed = cj.load(DATA / "full_int8_float_io.tflite", qat=True)
    trained = _fit(fixed)
    assert fixed.ranges == {} and trained.state.stats == {} and RANGES not in trained.params
    a, b = read_model(fixed.export()).main, read_model(fixed.export(trained.params)).main
    for t, u in zip(a.tensors, b.tensors):
        if t.data is None:
            assert t.quantization == u.quantization, t.name


@pytest.mark.parametrize("name", ["full_int8", "full_int8_float_io", "int16x8"])
@pytest.mark.slow
def test_ema_export_runs_in_litert_as_simulated(name: str) -> None:
    """After training with moving ranges, the export holds the moved ranges' parameters,
    and LiteRT computes every operator within 1 step of its grid of the simulation's
    value given the same integer inputs (LiteRT's int16 SOFTMAX: its table, 16 steps, as
    `test_fake_quant.test_fake_quant_forward_matches_the_export_per_operator`)."""
    model = cj.load(DATA / f"{name}.tflite", qat=True, qat_ranges="ema", qat_range_decay=0.9)
    params = _fit(model, epochs=2).params
    exported = model.export(params)
    sg, out = model.simulated.main, read_model(exported).main
    moved = [i for members in model.fake_quant.moving.values() for i in members
             if out.tensors[i].quantization != sg.tensors[i].quantization]
    assert len(moved) >= 5, name
    xi = np.load(DATA / "inputs.npz")["x"][:1]
    lite = _litert(exported, _as_input(model, xi))
    want = {t.index: _real(out.tensors[t.index], lite[t.name]) for t in sg.tensors
            if t.data is None and t.quantization is not None and t.name in lite}
    own = forced(jax.jit(model.tensors), params, xi, want, len(sg.operators))
    worst = {}
    for i, got in own.items():
        t = out.tensors[i]
        steps = float(np.abs(got - want[i]).max() / t.quantization.scale[0])
        bound = 16 if t.dtype == "int16" and _producer(sg, i) == "SOFTMAX" else 1
        assert steps <= bound + 0.01, (name, t.name, steps)
        worst[t.name] = steps
    assert len(own) >= 10
    print(name, "worst per-operator steps", max(worst.values()))


@pytest.mark.slow
def test_resume_with_moving_ranges_is_bit_identical(tmp_path: Path) -> None:
    """2 epochs == 1 epoch + checkpoint (ranges beside it) + resume 1 epoch: losses,
    weights and ranges bit for bit; without the sidecar the resume is refused in one line."""
    from circle_jax.checkpoints import checkpoint_params, fit_checkpointed
    from circle_jax.checkpoints.ranges import ranges_path
    from circle_jax.train import Trainer

    model = cj.load(DATA / "full_int8_float_io.tflite", qat=True, qat_ranges="ema",
                    qat_range_decay=0.9)
    x, y = _digits(model, 32)
    config = {"batch_size": 8, "learning_rate": 0.05, "optimizer": "adam",
              "loss": "categorical_crossentropy", "shuffle": False}
    whole = cj.fit(model, x, y, epochs=2, **config)
    trainer = Trainer(model, epochs=1, **config)
    path = tmp_path / "run.ckpt"
    first = fit_checkpointed(model, x, y, trainer=trainer, save=path)
    assert ranges_path(path).is_file()
    second = fit_checkpointed(model, x, y, trainer=trainer, resume=path)
    assert first.history.loss + second.history.loss == whole.history.loss
    for k, v in whole.params.items():
        if k != RANGES:
            assert np.asarray(v).tobytes() == np.asarray(second.params[k]).tobytes(), k
    got, want = second.params[RANGES], whole.params[RANGES]
    assert got.keys() == want.keys()
    assert all(np.asarray(got[k]).tobytes() == np.asarray(want[k]).tobytes() for k in want)
    assert any(not np.array_equal(np.asarray(want[k]), v) for k, v in model.ranges.items())
    # export from the checkpoint (`circle-jax export --checkpoint`) writes the saved ranges
    assert model.export(checkpoint_params(path, model)) == model.export(first.params)
    ranges_path(path).unlink()
    with pytest.raises(cj.DataError, match="ranges.json is missing") as e:
        fit_checkpointed(model, x, y, trainer=trainer, resume=path)
    assert "\n" not in str(e.value)


def test_bad_range_options_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    from circle_jax.cli import build_parser, main
    from circle_jax.cli.config import load_options

    path = DATA / "full_int8_float_io.tflite"
    for kwargs, match in (({"qat_ranges": "minmax"}, "qat_ranges 'minmax'"),
                          ({"qat_ranges": "ema", "qat_forward": "integer"}, "integer forward"),
                          ({"qat_ranges": "ema", "qat_range_decay": 1.0}, "qat_range_decay"),
                          ({"qat_ranges": "ema", "qat_range_decay": float("nan")},
                           "qat_range_decay")):
        with pytest.raises(ValueError, match=match) as e:
            cj.load(path, qat=True, **kwargs)
        assert "\n" not in str(e.value)
    ns = build_parser().parse_args(["train", "m.circle", "--qat_ranges", "ema",
                                    "--qat_range_decay", "0.99"])
    assert load_options(ns)["qat_ranges"] == "ema" and load_options(ns)["qat_range_decay"] == 0.99
    x = np.load(DATA / "inputs.npz")["x"].astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.eye(10, dtype=np.float32)[np.arange(len(x)) % 10])
    base = ["train", str(path), "--load_input", str(tmp_path / "x.npy"), "--load_expected",
            str(tmp_path / "y.npy"), "--loss", "cce", "--epoch", "1", "--batch_size", "4"]
    out = tmp_path / "ema.tflite"
    assert main([*base, "--qat_ranges", "ema", "--qat_range_decay", "0.5",
                 "--export_tflite", str(out)]) == 0
    assert "- qat                  = forward fake_quant, ranges ema\n" in \
        capsys.readouterr().out  # the parameter block says how QAT runs
    a, b = read_model(path).main, read_model(out.read_bytes()).main
    assert any(t.quantization != u.quantization for t, u in zip(a.tensors, b.tensors)
               if t.data is None)
    _litert(out.read_bytes(), x[:1])  # LiteRT runs it
    for flags in (["--qat_ranges", "minmax"], ["--qat_ranges", "ema", "--qat_forward", "integer"],
                  ["--qat_ranges", "ema", "--qat_range_decay", "2"]):
        try:
            status = main([*base, *flags])
        except SystemExit as e:  # argparse's refusal
            status = e.code
        assert status not in (0, None), flags
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) <= 2, err


def test_micro_batches_observe_the_whole_batch() -> None:
    """With in-step gradient accumulation the step's observed range is the min and max
    over its micro-batches: the same ranges as one batch (weights unchanged, lr 0), all
    but the logits' bit for bit."""
    model = cj.load(DATA / "full_int8_float_io.tflite", qat=True, qat_ranges="ema",
                    qat_range_decay=0.5)
    x, y = _digits(model, 8)
    config = {"epochs": 1, "batch_size": 8, "learning_rate": 0.0, "optimizer": "sgd",
              "loss": "categorical_crossentropy"}
    whole = cj.fit(model, x, y, **config).params[RANGES]
    split = cj.fit(model, x, y, accumulate=2, accumulate_mode="in_step", **config)
    for k, v in whole.items():
        # the logits' range within an ulp: XLA's float sums differ between batch shapes
        np.testing.assert_allclose(np.asarray(split.params[RANGES][k]), np.asarray(v),
                                   rtol=3e-7, err_msg=k)
