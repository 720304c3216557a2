"""Quantization-aware training learns as TF's does (tensorflow-model-optimization).

The reference: ``scripts/qat_tfmot_reference.py`` (run by hand) trained one seeded,
untrained Keras CNN with tfmot's ``quantize_model`` for 10 epochs (digits 0-1535 in order,
batch 32; SGD lr 0.01 and Adam lr 0.001) and recorded its per-epoch losses and test accuracy
(digits 1536-1796) in ``qat_reference.json``; ``qat_cnn_tfmot.tflite`` is that QAT model
before training converted to full int8 (tfmot's initial ranges, ``[-6, 6]``, and the weights
of the initialization), ``qat_cnn_ptq.tflite`` the float model converted with a
representative dataset.

circle-jax's QAT of ``qat_cnn_tfmot.tflite`` with tfmot's range rule (``qat_ranges="ema"``,
decay 0.999) follows tfmot's per-epoch losses within :data:`LOSS_TOLERANCE` and ends within
:data:`ACCURACY_TOLERANCE` of its test accuracy. They cannot be equal: the file's weights are
the initialization rounded to int8 (tfmot trains float masters of the unrounded ones), the
converter puts the rounding in other places than tfmot's wrappers (the SOFTMAX's output, the
MEAN's and a requantized pool input are rounded in the file; tfmot rounds none of them and
re-quantizes no bias), and the ranges move after the step's forward in tfmot, before it here.
The start alone accounts for most of the gap: float training of the file (``qat=False``)
differs from Keras's float training of the unrounded model by up to 0.027 (Adam, epoch 10;
measured, see benchmarks/README.md, "QAT").
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.numerics import PROFILES
from circle_jax.train.numerics import softmax_input

DATA = Path(__file__).parent / "data" / "quantized"
REFERENCE = json.loads((DATA / "qat_reference.json").read_text())
#: |circle-jax - tfmot| per epoch loss, absolute: about twice the float-vs-float gap of the
#: rounded start (0.027); the losses run from 2.30 to 0.75 (Adam) and 2.20 (SGD).
LOSS_TOLERANCE = 0.06
#: |circle-jax - tfmot| test accuracy after 10 epochs (261 digits: 0.05 is 13 of them).
ACCURACY_TOLERANCE = 0.05


def _digits() -> tuple[np.ndarray, np.ndarray]:
    d = np.load(Path(cj.__file__).parent / "examples" / "digits.npz")
    x = d["images"].astype(np.float32).reshape(-1, 8, 8, 1) / 16.0
    return x, d["labels"].astype(np.int64)


def _train(model: cj.Model, optimizer: str) -> tuple[list[float], float]:
    """Per-epoch losses and test accuracy of ``model`` trained as the reference was."""
    x, labels = _digits()
    n, ref = REFERENCE["train"], REFERENCE["optimizers"][optimizer]
    run = cj.fit(model, x[:n], np.eye(10, dtype=np.float32)[labels[:n]],
                 epochs=REFERENCE["epochs"], batch_size=REFERENCE["batch_size"], loss="cce",
                 optimizer=optimizer, learning_rate=ref["learning_rate"])
    probs = np.asarray(jax.jit(model.apply)(run.params, x[n:]))
    return [float(v) for v in run.history.loss], float(np.mean(probs.argmax(-1) == labels[n:]))


@pytest.mark.slow
def test_qat_cross_entropy_reads_the_integer_logits() -> None:
    """A QAT model's CCE on its SOFTMAX output is the cross-entropy of the softmax of the
    integer model's logits (the SOFTMAX's input), not of its output's probabilities, which
    int8 rounds to steps of 1/256 (on this untrained model, whose probabilities are near
    0.1, they differ by about 1%); a profile given as a Numerics is used as it is."""
    model = cj.load(DATA / "qat_cnn_ptq.tflite", qat=True, qat_forward="fake_quant")
    x, labels = _digits()
    x, y = x[:32], np.eye(10, dtype=np.float32)[labels[:32]]
    run = cj.fit(model, x, y, epochs=1, batch_size=32, loss="cce", optimizer="sgd",
                 learning_rate=0.0)
    index, _ = softmax_input(model)
    probs, tensors = jax.jit(model.tensors)(model.params, x)
    logits = np.asarray(tensors[index], np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    want = -np.mean(np.sum(y * log_softmax, -1))
    rounded = -np.mean(np.sum(y * np.log(np.maximum(np.asarray(probs[0]), 1e-20)), -1))
    assert abs(rounded - want) > 1e-3  # the two readings differ here
    assert run.history.loss[0] == pytest.approx(want, abs=1e-5)
    given = cj.load(DATA / "qat_cnn_ptq.tflite", qat=True, qat_forward="fake_quant",
                    numerics=PROFILES["onert"])
    assert given.numerics.softmax_cce == "clip"


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.slow
def test_qat_follows_tfmot(optimizer: str) -> None:
    """QAT of tfmot's start file with tfmot's moving ranges: per-epoch losses within
    LOSS_TOLERANCE of tfmot's, test accuracy within ACCURACY_TOLERANCE (module docstring)."""
    model = cj.load(DATA / "qat_cnn_tfmot.tflite", qat=True, qat_ranges="ema")
    losses, accuracy = _train(model, optimizer)
    tfmot = REFERENCE[optimizer]["tfmot_qat"]
    np.testing.assert_allclose(losses, tfmot["loss"], atol=LOSS_TOLERANCE, rtol=0)
    assert abs(accuracy - tfmot["test_accuracy"]) <= ACCURACY_TOLERANCE


@pytest.mark.slow
def test_integer_qat_with_the_files_ranges_follows_tfmot() -> None:
    """The default QAT (integer forward, the file's ranges: tfmot's initial [-6, 6], which
    hold this model's activations) follows tfmot's Adam run within the same tolerances."""
    losses, accuracy = _train(cj.load(DATA / "qat_cnn_tfmot.tflite", qat=True), "adam")
    tfmot = REFERENCE["adam"]["tfmot_qat"]
    np.testing.assert_allclose(losses, tfmot["loss"], atol=LOSS_TOLERANCE, rtol=0)
    assert abs(accuracy - tfmot["test_accuracy"]) <= ACCURACY_TOLERANCE
