"""onert checkpoints from training states and back: bit-identical resume, onert in both directions.

Training runs use the shared onert-micro MNIST model (6 ops, fast to compile) on 40 seeded
random samples, batch 4 (10 steps per epoch), categorical cross-entropy and SGD or TF-style
Adam (the flags ``--loss 2 --optimizer 2`` select the same).
"""

from __future__ import annotations

import functools
import os
import re
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.checkpoints import (
    ASCENDING_MARK,
    checkpoint_bytes,
    checkpoint_order,
    checkpoint_params,
    constant_tensors,
    fit_checkpointed,
    load_checkpoint,
    make_checkpoint,
    onert_order,
    read_checkpoint,
    save_checkpoint,
)
from circle_jax.checkpoints import state as checkpoint_state
from circle_jax.cli import main
from circle_jax.errors import CircleFormatError, DataError, TrainingError
from circle_jax.examples import branching_cnn
from circle_jax.formats import Checkpoint, decode_checkpoint, encode_checkpoint
from circle_jax.interop import onert as onert_interop
from circle_jax.optim import AdamTFState
from circle_jax.train import Trainer, fit
from tests.onert_peer import open_session, train_batch
from tests.paths import shared_model

MNIST = "onert_micro_simple_mnist_model.circle"
CONFIG = {"adam": dict(batch_size=4, learning_rate=0.01, loss="cce", optimizer="adam"),
          "sgd": dict(batch_size=4, learning_rate=0.05, loss="cce", optimizer="sgd")}


def _data(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((n, 11, 11, 1), dtype=np.float32)
    y = np.eye(2, dtype=np.float32)[rng.integers(0, 2, n)]
    return x, y


def _model() -> cj.Model:
    return cj.load(shared_model(MNIST))


def _copy(params: dict) -> dict:
    return {k: jnp.array(v, copy=True) for k, v in params.items()}


@functools.cache
def _uninterrupted(opt: str) -> tuple[list[float], dict, dict[str, bytes]]:
    """Two epochs in one ``fit``: per-epoch losses, final params, its checkpoint bytes."""
    model = _model()
    x, y = _data()
    r = fit(model, x, y, epochs=2, params=_copy(model.params), **CONFIG[opt])
    files = {order: checkpoint_bytes(model, r.trainer, r.state, epoch=2, order=order)
             for order in ("ascending", "onert")}
    return r.history.loss, {k: np.asarray(v) for k, v in r.params.items()}, files


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes(), k


@pytest.mark.parametrize("opt,every", [("sgd", None), ("adam", 5)])
def test_resume_is_bit_identical(tmp_path: Path, opt: str, every: int | None) -> None:
    """2 epochs == 1 epoch + checkpoint + resume 1 epoch: losses, weights, m, v, step."""
    want_loss, want_params, want_ckpt = _uninterrupted(opt)
    model = _model()
    x, y = _data()
    trainer = Trainer(model, epochs=1, **CONFIG[opt])
    path = tmp_path / "run.ckpt"
    first = fit_checkpointed(model, x, y, trainer=trainer, save=path, every_steps=every)
    ckpt, order = read_checkpoint(path, model)
    assert (ckpt.step, ckpt.epoch, ckpt.is_adam) == (10, 1, opt == "adam")
    assert order == constant_tensors(model) and path.read_bytes()[3] == ASCENDING_MARK
    second = fit_checkpointed(model, x, y, trainer=trainer, resume=path, save=path)
    assert first.history.loss + second.history.loss == want_loss  # bit for bit
    _same(second.params, want_params)
    # weights, Adam m and v, step 20 and epoch 2
    assert path.read_bytes() == want_ckpt["ascending"]
    if opt == "adam":
        assert isinstance(second.state.opt_state, AdamTFState)
        assert int(second.state.opt_state.count) == 20


def test_written_entry_order_and_contents() -> None:
    """One entry per constant of subgraph 0, ascending; the int32 shape has no Adam state."""
    model = _model()
    sg = model.ir.main
    trainer = Trainer(model, **CONFIG["adam"], trainable=2)  # only the last FC trains
    state, frozen = trainer.init(_copy(model.params))
    ckpt = make_checkpoint(model, trainer, state, frozen)
    consts = constant_tensors(model)
    assert consts == tuple(t.index for t in sg.tensors if t.data is not None)
    assert len(ckpt.tensors) == len(consts) == 5
    for e, i in enumerate(consts):
        t = sg.tensors[i]
        assert ckpt.tensors[e].tobytes() == np.ascontiguousarray(t.data).tobytes()
        stateful = t.name in trainer.trainable
        assert ckpt.adam_m[e].size == ckpt.adam_v[e].size == (t.data.nbytes if stateful else 0)
    assert sum(m.size > 0 for m in ckpt.adam_m) == 1
    assert checkpoint_order(model, ckpt) == consts


def test_order_is_resolved_by_size_and_content() -> None:
    """Entries shuffled as onert does are matched back; identical originals stay in order."""
    model = cj.load(branching_cnn().to_bytes("circle"))  # conv biases: two zero [8] tensors
    trainer = Trainer(model, **CONFIG["adam"])
    rng = np.random.default_rng(3)
    params = {k: v + 0.01 * rng.standard_normal(v.shape).astype(np.float32)
              for k, v in model.params.items()}  # "after a few steps"
    state, frozen = trainer.init(params)
    ckpt = make_checkpoint(model, trainer, state, frozen)
    consts = constant_tensors(model)
    assert checkpoint_order(model, ckpt) == consts  # our own order, ties included
    perm = rng.permutation(len(consts))
    shuffled = Checkpoint([ckpt.tensors[p] for p in perm], [ckpt.adam_m[p] for p in perm],
                          [ckpt.adam_v[p] for p in perm], ckpt.step)
    order = checkpoint_order(model, shuffled)
    names = {i: n for n, (_, i) in model.param_keys.items()}
    tied = {"conv1/bias", "conv2/bias"}  # identical originals: content cannot split them
    for e, p in enumerate(perm):
        want = consts[p]
        if names.get(want) in tied:
            assert names[order[e]] in tied
        else:
            assert order[e] == want
    got = checkpoint_params(encode_checkpoint(shuffled), model)
    for k in set(params) - tied:
        assert np.asarray(got[k]).tobytes() == np.asarray(params[k]).tobytes()


def test_unstorable_states_are_refused() -> None:
    model = _model()
    trainer = Trainer(model, batch_size=4, optimizer="momentum")
    state, frozen = trainer.init(_copy(model.params))
    with pytest.raises(TrainingError, match=r"cannot hold; use --optimizer sgd or adam"):
        make_checkpoint(model, trainer, state, frozen)


def test_foreign_and_truncated_checkpoints_are_refused(tmp_path: Path) -> None:
    model = _model()
    trainer = Trainer(model, **CONFIG["adam"])
    state, frozen = trainer.init(_copy(model.params))
    good = encode_checkpoint(make_checkpoint(model, trainer, state, frozen))
    other = cj.load(branching_cnn().to_bytes("circle"))
    t2 = Trainer(other, **CONFIG["adam"])
    s2, f2 = t2.init(_copy(other.params))
    cases = {
        good[:-3]: r"truncated or corrupt: step/epoch",
        b"\x00\x01" + good[2:]: r"not an onert checkpoint: magic number is 256, expected 429",
        b"": r"truncated: 0 bytes, expected at least 28",
        encode_checkpoint(make_checkpoint(other, t2, s2, f2)):
            r"has 7 tensors, expected 5 \(one per constant tensor of the model's subgraph 0\)",
        encode_checkpoint(Checkpoint([b"\0" * 8] * 5)):
            r"entry 0 has 8 bytes, but the model has 1 constant tensor\(s\) of that size for 5 "
            r"such entries; expected entry sizes \[8, 16, 32, 64, 1600\]",
    }
    for data, message in cases.items():
        path = tmp_path / "bad.ckpt"
        path.write_bytes(data)
        with pytest.raises(CircleFormatError, match=message) as info:
            load_checkpoint(path, model, trainer)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
    fits_not = r"entry 0 has 32 bytes, expected 8 for tensor 3 'arith.constant2' int32\[2\]"
    with pytest.raises(CircleFormatError, match=fits_not):
        read_checkpoint(good, model, order=(3, 1, 2, 4, 5))  # an order that does not fit


# --------------------------------------------------------------------------- onert


def _onert_session(model: str, batch: int = 4):
    """onert with CONFIG["adam"]'s settings (onert codes: CCE, sum over batch size, Adam)."""
    return open_session(model, batch_size=batch, learning_rate=0.01, loss=2, reduction=1,
                        optimizer=2)


def _onert_step(s, x: np.ndarray, y: np.ndarray, update: bool = True) -> float:
    return train_batch(s, [np.ascontiguousarray(x)], [np.ascontiguousarray(y)], update)[0]


def _ambiguous_model(path: Path, zero_biases: bool = False) -> None:
    """Two same-shape FC layers, and a float [2] bias the size of the int32 [2] shape."""
    rng = np.random.default_rng(1)
    b = cj.Builder("same-size constants")
    x = b.input("x", (1, 4, 4, 1))
    h = b.op("RESHAPE", [x, b.constant("shape", np.array([1, 16], np.int32))])
    for k in range(2):
        w = b.constant(f"fc{k}/w", (rng.standard_normal((16, 16)) * 0.3).astype(np.float32))
        bias = np.zeros(16, np.float32) if zero_biases else rng.standard_normal(16) * 0.1
        c = b.constant(f"fc{k}/b", bias.astype(np.float32))
        h = b.op("FULLY_CONNECTED", [h, w, c], {"fused_activation_function": "RELU"})
    w = b.constant("out/w", (rng.standard_normal((2, 16)) * 0.3).astype(np.float32))
    h = b.op("FULLY_CONNECTED", [h, w, b.constant("out/b", np.array([0.05, -0.05], np.float32))])
    b.output(b.op("SOFTMAX", [h], {"beta": 1.0}))
    path.write_bytes(b.to_bytes("circle"))


@pytest.mark.parametrize("which", ["mnist", "ambiguous", "zero_biases"])
def test_onert_checkpoint_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                which: str) -> None:
    """onert trains and exports a checkpoint and a circle: the checkpoint-loaded params equal
    the exported circle's weights bit for bit; Adam m/v and the step come along.

    "ambiguous" has same-size weights and a float and an int32 constant of one size;
    "zero_biases" also two identical (zero) biases, which only onert's order can place.
    """

    monkeypatch.chdir(tmp_path)  # onert 0.1.0 garbles paths over 15 bytes: short names
    if which == "mnist":
        source, shape = shared_model(MNIST), (11, 11, 1)
    else:
        source, shape = str(tmp_path / "amb.circle"), (4, 4, 1)
        _ambiguous_model(Path(source), zero_biases=which == "zero_biases")
    model = cj.load(source)
    s = _onert_session(source, batch=2)
    rng = np.random.default_rng(0)
    for _ in range(2):
        _onert_step(s, rng.random((2, *shape), dtype=np.float32),
                    np.eye(2, dtype=np.float32)[[0, 1]])
    s.train_export_checkpoint("o.ckpt")
    s.train_export_circle("o.circle")
    ckpt, order = read_checkpoint("o.ckpt", model)
    assert order == onert_order(model)
    if which == "mnist":
        assert order == (4, 5, 2, 1, 3)  # conv filter, conv bias, FC1, FC2, reshape shape
    else:
        assert order != constant_tensors(model)  # not ours: the resolution matters
    trainer = Trainer(model, **CONFIG["adam"])
    state, frozen = load_checkpoint("o.ckpt", model, trainer)
    trained = cj.load("o.circle").params
    _same(trainer.merge(state, frozen), {k: np.asarray(v) for k, v in trained.items()})
    assert all(np.asarray(model.params[k]).tobytes() != np.asarray(trained[k]).tobytes()
               for k in trained)  # every weight trained: a swap would show
    assert int(state.step) == 2 and int(state.opt_state.count) == 2
    moments = trainer.per_weight_state(state)
    for name in trainer.trainable:
        nu = moments.nu[name]
        assert np.all(nu >= 0) and np.any(nu > 0), name
        assert np.any(moments.mu[name] != 0), name
    # content alone (no onert order to break the tie) still places every distinct tensor
    by_content = checkpoint_order(model, ckpt)
    tied = {i for i in constant_tensors(model)
            if which == "zero_biases" and model.ir.main.tensors[i].name in ("fc0/b", "fc1/b")}
    for c, o in zip(by_content, order):
        assert c in tied if o in tied else c == o


def test_onert_imports_ours_and_continues(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A circle-jax checkpoint imports into onert, which continues as circle-jax does."""

    monkeypatch.chdir(tmp_path)
    model = _model()
    x, y = _data()
    trainer = Trainer(model, epochs=1, **CONFIG["adam"])
    fit_checkpointed(model, x, y, trainer=trainer, save="cj.ckpt", order="onert")
    assert Path("cj.ckpt").read_bytes()[3] == 0  # onert's order, as onert writes it
    ours = fit_checkpointed(model, x, y, trainer=trainer, resume="cj.ckpt")

    s = _onert_session(shared_model(MNIST))
    s.train_import_checkpoint("cj.ckpt")  # our file in onert's order, cur_epoch 1
    losses = [_onert_step(s, x[i:i + 4], y[i:i + 4]) for i in range(0, 40, 4)]
    assert abs(np.mean(losses) - ours.history.loss[0]) < 1e-5  # measured: 5e-8
    s.train_export_checkpoint("o.ckpt")
    back, _ = read_checkpoint("o.ckpt", model)
    assert back.step == 20  # onert took our step count (10) and made 10 more
    got = checkpoint_params("o.ckpt", model)
    for k, v in ours.params.items():
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(v), atol=1e-5, err_msg=k)


def _cli_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``circle-jax train`` of the MNIST model at batch 4 on `_data`, saved as x.npy and
    y.npy in ``tmp_path``, which becomes the working directory."""
    monkeypatch.chdir(tmp_path)
    x, y = _data()
    np.save("x.npy", x)
    np.save("y.npy", y)
    return ["train", shared_model(MNIST), "--load_input", "x.npy", "--load_expected", "y.npy",
            "--batch_size", "4"]


def test_cli_export_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture) -> None:
    """--export_checkpoint (every 5 steps) then --checkpoint: the uninterrupted losses."""
    base = [*_cli_train(tmp_path, monkeypatch), "--epoch", "1", "--learning_rate", "0.01",
            "--loss", "cce", "--optimizer", "adam"]  # the names select CONFIG["adam"]'s numerics
    assert main(base + ["--export_checkpoint", "c.ckpt", "--checkpoint_every_steps", "5"]) == 0
    assert main(base + ["--checkpoint", "c.ckpt", "--export_checkpoint", "c.ckpt"]) == 0
    out = capsys.readouterr().out
    losses = [line.split("loss: [0] ")[1][:6] for line in out.splitlines()
              if line.startswith("Epoch ")]
    assert losses == [f"{v:.4f}" for v in _uninterrupted("adam")[0]]
    # --checkpoint_order auto: onert's order (the onert wheel is installed), bit-identical
    assert Path("c.ckpt").read_bytes() == _uninterrupted("adam")[2]["onert"]

    bad = [(["--checkpoint_every_steps", "3"], "needs --export_checkpoint FILE"),
           (["--checkpoint", "missing.ckpt"], "checkpoint file 'missing.ckpt' does not exist"),
           (["--checkpoint", "x.npy"], "not an onert checkpoint: magic number is"),
           (["--optimizer", "momentum", "--export_checkpoint", "m.ckpt"],
            "an onert checkpoint cannot hold")]
    for flags, message in bad:
        assert main(base + flags) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("E: ") and message in err and "\n" not in err, err
    assert not os.path.exists("m.ckpt")
    # an Adam checkpoint resumed with SGD: its moments are dropped, and the run says so
    assert main([*base[:-1], "sgd", "--checkpoint", "c.ckpt", "-v", "0"]) == 0
    err = capsys.readouterr().err
    assert err == ("W: the checkpoint holds Adam's moments, which optimizer 'sgd' keeps none "
                   "of: they are dropped (the weights and the update count resume)\n"), err


def test_the_entry_order_is_asked_once_before_training(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    """``--checkpoint_order auto`` asks the onert wheel for its entry order (about a second
    in a fresh process): once, before training, so it counts in PREPARE, and checkpoints
    written every 2 steps reuse it. (Every write serialized the model again to look the
    answer up, and the asking was counted in epoch 1.)"""
    asked = []
    ask = checkpoint_state.onert_order

    def slow(model: cj.Model) -> tuple[int, ...]:
        asked.append(model)
        time.sleep(1.0)
        return ask(model)

    monkeypatch.setattr(checkpoint_state, "onert_order", slow)
    assert main([*_cli_train(tmp_path, monkeypatch), "--epoch", "2", "--export_checkpoint",
                 "c.ckpt", "--checkpoint_every_steps", "2"]) == 0
    out = capsys.readouterr().out
    prepare = float(re.search(r"^PREPARE +takes (\S+) ms$", out, re.M)[1])
    epoch_1 = float(re.search(r"^- Epoch 1 +takes (\S+) ms", out, re.M)[1])
    assert len(asked) == 1 and prepare > 1000 > epoch_1, out


def test_onert_orders_are_kept_in_the_compile_cache(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line keeps onert's entry orders beside its compiled programs: a second
    run (a new process: the in-memory answers cleared) asks onert nothing and writes the
    same checkpoint; a damaged kept answer is asked again; without the cache nothing is
    kept."""
    asked = []
    probe = onert_interop._probe

    def counted(source: bytes) -> tuple[int, ...]:
        asked.append(len(source))
        return probe(source)

    monkeypatch.setattr(onert_interop, "_probe", counted)
    base = [*_cli_train(tmp_path, monkeypatch), "--epoch", "1"]
    written = []
    for run, cache in enumerate(["off", "cache", "cache", "cache"]):
        onert_interop._cached_order.cache_clear()  # a new process
        if run == 3:
            for kept in Path("cache", "onert_orders").glob("*.json"):
                kept.write_text('{"order": [1, ')
        assert main([*base, "--compile_cache", cache, "--export_checkpoint", f"{run}.ckpt"]) == 0
        written.append(Path(f"{run}.ckpt").read_bytes())
    assert len(asked) == 3  # off, the first cached run, the damaged answer
    assert len(list(Path("cache", "onert_orders").glob("*.json"))) == 1
    assert written[1:] == written[:1] * 3
    assert onert_interop._answers is None  # the command line's setting ends with its run


def test_onert_refusals_are_kept_unless_it_was_too_slow(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model onert cannot train is refused again from the kept answer (asking costs
    0.4-0.5 s a run); a time-out is not kept: the next process asks again."""
    answers: list[Exception] = [DataError("onert could not train this model"),
                                onert_interop._TooSlow("onert took over 120 s")]
    asked = []

    def refuse(source: bytes) -> tuple[int, ...]:
        asked.append(source)
        raise answers[0] if source == b"model" else answers[1]

    monkeypatch.setattr(onert_interop, "_probe", refuse)
    with onert_interop.answers_kept_in(tmp_path):
        for _ in range(2):  # two processes
            onert_interop._cached_order.cache_clear()
            for source, message in ((b"model", "could not train"), (b"slow", "took over")):
                with pytest.raises(DataError, match=message):
                    onert_interop.onert_checkpoint_order(source)
    onert_interop._cached_order.cache_clear()
    assert asked == [b"model", b"slow", b"slow"]
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_onert_order_serializes_each_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """onert is asked about the model's bytes; writing them (0.1 s for the VWW MobileNet)
    happens once per model, however many checkpoints a run writes, its answer or its
    refusal kept with the model."""
    written = []
    write = checkpoint_state.write_model

    def counted(model_ir: object) -> bytes:
        written.append(model_ir)
        return write(model_ir)

    monkeypatch.setattr(checkpoint_state, "write_model", counted)
    answers = {}

    def ask(source: bytes) -> tuple[int, ...]:
        if answers["refuse"]:
            raise DataError("onert could not train this model")
        return constant_tensors(model)

    monkeypatch.setattr(checkpoint_state, "onert_checkpoint_order", ask)
    for refuse in (False, True):
        answers["refuse"] = refuse
        model = _model()
        for _ in range(3):
            if refuse:
                with pytest.raises(DataError, match="could not train"):
                    onert_order(model)
            else:
                assert onert_order(model) == constant_tensors(model)
    assert len(written) == 2  # one per model


def test_save_checkpoint_is_atomic_and_protects_inputs(tmp_path: Path) -> None:
    model = _model()
    trainer = Trainer(model, **CONFIG["sgd"])
    state, frozen = trainer.init(_copy(model.params))
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, model, trainer, state, frozen, protect=shared_model(MNIST))
    ckpt = decode_checkpoint(path.read_bytes())
    assert not ckpt.is_adam and ckpt.step == 0
    with pytest.raises(cj.DataError, match="it is the input file"):
        save_checkpoint(path, model, trainer, state, frozen, protect=path)
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt"]


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_mid_epoch_checkpoint_resumes_mid_epoch(opt: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint written 5 steps into epoch 2 (of 10 steps) resumes at step 5 of epoch 2:
    epoch 3's loss and the final weights equal the uninterrupted run's."""
    from circle_jax.checkpoints import driver

    model = _model()
    x, y = _data()
    written: list[bytes] = []
    real = driver.save_checkpoint

    def keep(path, *args, **kwargs):  # remember every checkpoint the run writes
        real(path, *args, **kwargs)
        written.append(Path(path).read_bytes())

    monkeypatch.setattr(driver, "save_checkpoint", keep)
    whole = fit_checkpointed(model, x, y, epochs=3, params=_copy(model.params),
                             save=tmp_path / "c.ckpt", every_steps=5, **CONFIG[opt])
    monkeypatch.setattr(driver, "save_checkpoint", real)
    # checkpoints: after 5 and 10 steps of each epoch, and after each epoch
    steps = [(decode_checkpoint(w).epoch, decode_checkpoint(w).step) for w in written]
    assert steps[:6] == [(0, 5), (0, 10), (1, 10), (1, 15), (1, 20), (2, 20)], steps
    mid = written[3]  # 5 steps into the second epoch
    (tmp_path / "mid.ckpt").write_bytes(mid)
    rest = fit_checkpointed(model, x, y, epochs=2, params=_copy(model.params),
                            resume=tmp_path / "mid.ckpt", **CONFIG[opt])
    assert rest.history.steps == [5, 10]
    assert rest.history.loss[1] == whole.history.loss[2]
    for k, v in whole.params.items():
        np.testing.assert_array_equal(np.asarray(rest.params[k]), np.asarray(v), err_msg=k)
    # the checkpoint of the epoch's last chunk (cur_epoch still 1) resumes at epoch 3
    (tmp_path / "end.ckpt").write_bytes(written[4])
    last = fit_checkpointed(model, x, y, epochs=1, params=_copy(model.params),
                            resume=tmp_path / "end.ckpt", **CONFIG[opt])
    assert last.history.loss == whole.history.loss[2:]
