"""A new classifier head (`circle_jax.passes.head`, ``load(new_head=N)``): its exports run in
LiteRT and onert, its weights are drawn as documented, it alone trains by default, and onert
trains it as circle-jax does. Tolerances as in `test_personalize` (the head and LoRA
together, and the refusals of both).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax import passes
from circle_jax.checkpoints import load_wof, save_wof
from circle_jax.formats.reader import read_model
from circle_jax.train import Trainer, fit
from tests.conformance import run_litert
from tests.passes.test_personalize import CFG, KERAS, MNIST, MOBILENET, _mnist_data, _moved, _onert
from tests.passes.test_pipeline import _assert_same, _feeds
from tests.paths import shared_model


@pytest.mark.parametrize("path", [
    shared_model(MOBILENET),
    shared_model("mlperftiny_vww_96_mobilenet_float.tflite"),
    shared_model("mlperftiny_resnet8_cifar10_float.tflite"),
    shared_model("tflite_support_audio_classifier_float.tflite"),  # FC then LOGISTIC
    str(KERAS / "conv1d_stack.tflite"),
])
def test_new_head_exports_run_in_litert_and_onert(path: str, tmp_path: Path) -> None:
    model = cj.load(path, new_head=5, seed=7)
    (spec,) = model.outputs[:1]
    assert spec.shape[-1] == 5 and model.personal_params == {"head/weights", "head/bias"}
    assert Trainer(model, **CFG).trainable == model.personal_params
    last = model.operators[-1].type
    original = read_model(path)
    had = {op.type for op in original.main.operators[-2:]} & {"SOFTMAX", "LOGISTIC"}
    assert (last in had) if had else last == "FULLY_CONNECTED"
    params = _moved(model, ["head/bias"])
    feeds = _feeds(model)
    ours = [np.asarray(o) for o in jax.jit(model.apply)(params, *feeds)]
    _assert_same(run_litert(model.export(params, file_format="tflite"), feeds), ours)
    got = _onert(model.export(params, file_format="circle"), feeds, tmp_path)
    assert got[0].shape == ours[0].shape
    _assert_same(got, ours)


def test_new_head_weights_are_glorot_uniform_and_seeded() -> None:
    a = passes.replace_head(read_model(shared_model(MOBILENET)), 10, seed=1)
    b = passes.replace_head(read_model(shared_model(MOBILENET)), 10, seed=1)
    c = passes.replace_head(read_model(shared_model(MOBILENET)), 10, seed=2)
    w = {m: next(t.data for t in m.main.tensors if t.name == "head/weights") for m in (a, b, c)}
    assert w[a].shape == (10, 256) and np.array_equal(w[a], w[b]) and not np.array_equal(
        w[a], w[c])
    limit = np.sqrt(6 / (256 + 10))
    assert np.abs(w[a]).max() <= limit and np.abs(w[a]).max() > 0.9 * limit
    assert abs(float(np.var(w[a])) - limit**2 / 3) < 0.1 * limit**2 / 3  # uniform's variance
    bias = next(t.data for t in a.main.tensors if t.name == "head/bias")
    assert bias.shape == (10,) and not bias.any()
    rec = a.passes[-1]
    assert rec.name == "replace_head" and rec.changes["SOFTMAX #30"] == "removed"
    # a negative seed, which training takes, draws too (modulo 2**64; before: numpy's
    # "expected non-negative integer")
    d = passes.replace_head(read_model(shared_model(MOBILENET)), 10, seed=-5)
    e = passes.replace_head(read_model(shared_model(MOBILENET)), 10, seed=2**64 - 5)
    assert np.array_equal(*(next(t.data for t in m.main.tensors if t.name == "head/weights")
                            for m in (d, e)))
    assert [op.type for op in a.main.operators[-2:]] == ["FULLY_CONNECTED", "SOFTMAX"]


def test_only_the_new_head_trains_by_default_and_wof_follows(tmp_path: Path) -> None:
    model = cj.load(shared_model(MNIST), new_head=3)
    x, y = _mnist_data(16, 3)
    result = fit(model, x, y, **CFG)
    changed = {n for n, v in result.params.items()
               if not np.array_equal(np.asarray(v), np.asarray(model.params[n]))}
    assert changed == {"head/weights", "head/bias"}
    wider = Trainer(model, **CFG, trainable=3)  # the last 3 operators: the FC before too
    assert wider.trainable == model.personal_params | {"arith.constant1"}  # FC #3 (no bias)
    save_wof(tmp_path / "h.wof", model, result.params, result.trainer.trainable)
    again = cj.load(shared_model(MNIST), new_head=3)
    loaded = load_wof(tmp_path / "h.wof", again)
    _assert_same(again.apply(loaded, x[:1]), [np.asarray(o) for o in
                                              model.apply(result.params, x[:1])])


def test_new_head_trains_in_onert_as_in_circle_jax(tmp_path: Path) -> None:
    """The exported new-head graph trained by onert (head only: its last 2 operators) gives
    circle-jax's per-epoch losses within 1e-3 (the agreement tests' tolerance: float32
    kernels of two runtimes over 8 Adam steps)."""
    from tests.onert_peer import onert_fit

    model = cj.load(shared_model(MNIST), new_head=3, seed=4)
    x, y = _mnist_data(16, 3)
    path = tmp_path / "head.circle"
    path.write_bytes(model.export(file_format="circle"))
    theirs = onert_fit(path, x, y, epochs=2, batch_size=4, learning_rate=0.01, loss=2,
                       optimizer=2, trainable_ops=2)
    ours = fit(model, x, y, epochs=2, batch_size=4, learning_rate=0.01, loss="cce",
               optimizer="adam")
    np.testing.assert_allclose(ours.history.loss, theirs.loss, atol=1e-3)
