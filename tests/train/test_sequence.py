"""Sequence losses: per-token labels [N, T] (or one-hot [N, T, V]) against [N, T, V]
outputs, the mean over tokens with padding left out (``ignore_index``), for every numerics
profile; the toy transformer of ../shared/models trained on next-token prediction; the
command line's --ignore_index."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.train import Trainer
from tests.paths import shared_model
from tests.toy_models import token_model

PAD = -1


def _tokens(n: int, t: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sequences counting up (mod ``vocab``): the next token is this one plus 1. The last
    two labels of every other sample are padding."""
    start = np.random.default_rng(seed).integers(0, vocab, (n, 1))
    seq = (start + np.arange(t + 1)) % vocab
    x, y = seq[:, :t].astype(np.int32), seq[:, 1:].astype(np.int32)
    y[::2, -2:] = PAD
    return x, y


def _token_mean(logp: np.ndarray, y: np.ndarray) -> float:
    keep = y != PAD
    picked = np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
    return float(-(picked * keep).sum() / keep.sum())


@pytest.mark.parametrize("profile", ["onert", "keras", "onert-micro"])
def test_each_profile_computes_the_token_mean_as_numpy_does(profile: str) -> None:
    """The loss ``fit`` starts from, against a float64 numpy forward (embedding, dense,
    softmax) and each profile's CCE: onert and onert-micro ``log max(p, 1e-20)`` on the
    probabilities, keras ``log_softmax`` of the softmax's input. 1e-5 relative: float32."""
    model = token_model(numerics=profile)
    x, y = _tokens(6, 5, 11)
    p = {k: np.asarray(v, np.float64) for k, v in model.params.items()}
    z = p["embedding"][x] @ p["head/w"].T + p["head/b"]
    logsm = z - z.max(-1, keepdims=True)
    logsm -= np.log(np.exp(logsm).sum(-1, keepdims=True))
    logp = logsm if profile == "keras" else np.log(np.maximum(np.exp(logsm), 1e-20))
    trainer = Trainer(model, loss="sparse_cce", ignore_index=PAD, batch_size=6)
    loss, _ = trainer.evaluate(model.params, [x], y)
    assert loss == pytest.approx(_token_mean(logp, y), rel=1e-5)
    h = cj.fit(model, [x], y, loss="sparse_cce", ignore_index=PAD, batch_size=6, epochs=30,
               optimizer="adam", learning_rate=0.05).history
    assert h.loss[0] == pytest.approx(loss, rel=1e-5) and h.loss[-1] < 0.5 * h.loss[0]


def test_the_toy_transformer_learns_next_tokens() -> None:
    """The KV-cache decoder block (logits [1, 100, 400] beside two caches) trained on
    next-token prediction: sparse CCE from logits on output ``StatefulPartitionedCall:0``,
    the last 10 positions padding. Its first loss (one batch of 4) is numpy's token mean
    of the model's logits (1e-5 relative); ten Adam steps cut it by a third (measured:
    5.99 -> 3.73, lr 0.005)."""
    model = cj.load(shared_model("aeq_toy_transformer_kv_cache_2sig.tflite"))
    n, t = 4, 100
    x, y = _tokens(n, t, 50)
    y[:, -10:] = PAD
    caches = np.zeros((n, 100, 4, 4), np.float32)
    xs = [caches, caches, x, np.tile(np.arange(t, dtype=np.int32), (n, 1))]
    logits = np.asarray(jax.jit(model.apply)(model.params, *xs)[1], np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    h = cj.fit(model, xs, y, loss="sparse_cce", from_logits=True, ignore_index=PAD,
               loss_output="StatefulPartitionedCall:0", optimizer="adam", learning_rate=0.005,
               batch_size=n, epochs=10).history
    assert h.loss[0] == pytest.approx(_token_mean(logp, y), rel=1e-5)
    assert h.loss[-1] < 0.67 * h.loss[0], h.loss


def test_labels_must_be_classes_or_the_ignore_index() -> None:
    model = token_model()
    x, y = _tokens(4, 5, 11)
    with pytest.raises(cj.DataError, match=r"sample 0 has label\(s\) \[-1\] outside the 11 "
                                           r"classes \[0, 11\); padding\? set ignore_index"):
        cj.fit(model, [x], y, loss="sparse_cce", batch_size=2, epochs=1)
    with pytest.raises(ValueError, match="ignore_index applies to sparse_categorical_cross"):
        Trainer(model, loss="cce", ignore_index=PAD)
    y[3] = PAD  # a sample of padding only would score as right and add a loss of 0
    for run in (lambda: cj.fit(model, [x], y, loss="sparse_cce", ignore_index=PAD,
                               batch_size=2, epochs=1),
                lambda: Trainer(model, loss="sparse_cce", ignore_index=PAD).evaluate(
                    model.params, [x], y)):
        with pytest.raises(cj.DataError, match=r"sample 3 is padding only \(every label -1, "
                                               r"the ignore_index\)"):
            run()


def test_command_line_ignore_index_and_what_it_shows(tmp_path, capsys) -> None:
    """--ignore_index and --loss_output in the parameter block; -v 1 names every file
    written, the checkpoint included."""
    path = tmp_path / "tokens.circle"
    path.write_bytes(token_model().export(file_format="circle"))
    x, y = _tokens(8, 5, 11)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y.astype(np.int64))  # cast exactly to int32, told at -v 1
    ckpt, out = tmp_path / "c.ckpt", tmp_path / "o.circle"
    assert main(["train", str(path), "--load_input", str(tmp_path / "x.npy"),
                 "--load_expected", str(tmp_path / "y.npy"), "--loss", "sparse_cce",
                 "--ignore_index", str(PAD), "--loss_output", "probs", "--batch_size", "4",
                 "--epoch", "2", "--export_checkpoint", str(ckpt), "--export_circle",
                 str(out), "-v", "1"]) == 0
    o, e = capsys.readouterr()
    assert "- loss_output          = 0 (probs)" in o and "- ignore_index         = -1" in o
    assert f"wrote {out}" in e and f"wrote {ckpt} (the checkpoint" in e
    assert "cast from int64 to int32 (every value converts exactly)" in e
    assert ckpt.stat().st_size > 0 and out.stat().st_size > 0


def test_a_sequence_is_right_when_every_counted_token_is() -> None:
    from circle_jax.train.data import correct

    out = np.eye(4, dtype=np.float32)[np.array([[0, 1, 2], [3, 3, 3], [1, 2, 0]])]
    y = np.array([[0, 1, 2], [3, 3, 0], [1, 2, PAD]], np.float32)  # labels arrive as floats
    assert np.asarray(correct(out, y)).tolist() == [1, 0, 0]
    assert np.asarray(correct(out, y, PAD)).tolist() == [1, 0, 1]


def test_a_checkpoint_path_that_cannot_be_written_fails_before_training() -> None:
    from circle_jax.checkpoints import fit_checkpointed

    x, y = _tokens(4, 5, 11)
    epochs: list[int] = []
    with pytest.raises(cj.DataError, match=r"cannot write '/proc/x.ckpt': cannot create a "
                       r"file in '/proc'"):
        fit_checkpointed(token_model(), [x], y, save="/proc/x.ckpt", loss="sparse_cce",
                         ignore_index=PAD, batch_size=2, epochs=1,
                         on_epoch=lambda i, h: epochs.append(i))
    assert epochs == []


def test_no_training_samples_is_one_line_also_keeping_the_remainder() -> None:
    with pytest.raises(cj.DataError, match="no samples"):
        cj.fit(token_model(), [np.zeros((0, 5), np.int32)], np.zeros((0, 5), np.int32),
               loss="sparse_cce", drop_remainder=False, epochs=1)
