"""The one training loop (`circle_jax.train.loop`): evaluation and validation score every
sample, callbacks run at the logging points, chunked epochs and epochs fused into one
compiled call equal whole ones, and ``circle-jax eval``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from circle_jax.cli import main
from circle_jax.errors import DataError
from circle_jax.train import TrainConfig, Trainer, fit
from tests.compile_events import compile_events, lowered
from tests.paths import REPO_ROOT
from tests.toy_models import branching, digits16, reshape_mlp, toy_data


def _direct(model, x, y, loss: str, reduction: str, batch: int) -> tuple[float, float]:
    """The numpy reference: per-sample losses from single-sample runs; a batch's loss is
    their mean ("sum_over_batch_size") or sum ("sum"); batches weighted by their size."""
    p = np.concatenate([np.asarray(model(x[i:i + 1])[0]) for i in range(len(x))], 0)
    if loss == "mse":
        per = np.mean((p - y) ** 2, axis=-1)
    else:
        per = -np.sum(y * np.log(np.clip(p, 1e-7, 1 - 1e-7)), axis=-1)
    total = per.sum() / len(x)
    value = total if reduction == "sum_over_batch_size" else total * batch
    return float(value), float(np.mean(p.argmax(-1) == y.argmax(-1)))


@pytest.mark.parametrize("loss", ["mse", "cce"])
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "sum"])
def test_evaluate_scores_every_sample(loss: str, reduction: str) -> None:
    model = reshape_mlp()
    x, y = toy_data(23)  # 5 batches of 4 and a partial batch of 3
    trainer = Trainer(model, batch_size=4, loss=loss, reduction=reduction)
    got = trainer.evaluate(model.params, x, y)
    want = _direct(model, x, y, loss, reduction, 4)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    # the same value whatever the batching (the trailing batch is not dropped)
    np.testing.assert_allclose(trainer.evaluate(model.params, x, y, batch_size=23)[0],
                               want[0] * (23 / 4 if reduction == "sum" else 1), rtol=2e-6)


def test_validation_scores_every_held_out_sample() -> None:
    model = reshape_mlp()
    x, y = toy_data(50)  # validation: the last 15 samples, not a multiple of the batch
    r = fit(model, x, y, epochs=2, batch_size=4, learning_rate=0.1, loss="cce",
            optimizer="adam", validation_split=0.3)
    trained = reshape_mlp()
    val = _direct(_with(trained, r.params), x[35:], y[35:], "cce", "sum_over_batch_size", 4)
    np.testing.assert_allclose((r.history.val_loss[-1], r.history.val_accuracy[-1]), val,
                               rtol=2e-6)


def _with(model, params):
    model.params = {k: np.asarray(v) for k, v in params.items()}
    return model


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_chunk_end(self, epoch, state, frozen) -> None:
        self.events.append(("chunk", epoch, int(state.step)))

    def on_epoch_end(self, epoch, history, state, frozen) -> None:
        self.events.append(("epoch", epoch, int(state.step), len(history.loss)))


@pytest.mark.parametrize("shuffle", [False, True])
def test_chunked_epochs_equal_whole_ones_and_call_back(shuffle: bool) -> None:
    model = reshape_mlp()
    x, y = toy_data(22)  # 5 steps of 4, a trailing 2 kept
    cfg = dict(epochs=2, batch_size=4, learning_rate=0.1, loss="cce", optimizer="adam",
               shuffle=shuffle, drop_remainder=False)
    whole = fit(model, x, y, **cfg)
    rec = Recorder()
    chunked = fit(model, x, y, every_steps=2, callbacks=[rec], **cfg)
    _same_run(whole, chunked)
    assert rec.events == [("chunk", 0, 2), ("chunk", 0, 4), ("chunk", 0, 5), ("epoch", 0, 6, 1),
                          ("chunk", 1, 8), ("chunk", 1, 10), ("chunk", 1, 11),
                          ("epoch", 1, 12, 2)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("samples, every_steps, validated",
                         [(3, None, 0), (22, 2, 0), (27, 2, 5)])
def test_every_training_program_compiles_before_on_start(samples: int, every_steps: int | None,
                                                          validated: int, shuffle: bool) -> None:
    """With the partial batch kept, fewer samples than a batch (the epoch is that one step)
    or chunks of ``every_steps`` (5 steps of 4 in chunks of 2, 2 and 1, then 2 samples),
    with or without validation: the steps, chunks, their cuts of the data, permutation,
    joined metrics, epoch summary and validation compile before ``on_start`` (the command
    line's PREPARE): no program at all while the epochs run."""
    model = reshape_mlp()
    x, y = toy_data(samples)
    started: list[int] = []  # how many events came before on_start
    with compile_events() as events:
        result = fit(model, x, y, epochs=2, batch_size=4, learning_rate=0.1, loss="cce",
                     drop_remainder=False, every_steps=every_steps, shuffle=shuffle,
                     validation_split=validated / samples,
                     on_start=lambda h: started.append(len(events)))
    later = lowered(events[started[0]:])
    assert not later, later
    assert "trailing step" in [name for name, *_ in result.trainer._compiled]
    assert result.history.steps == [(samples - validated) // 4 + 1] * 2
    assert len(result.history.val_loss) == (2 if validated else 0)


@pytest.mark.parametrize("which", ["mlp", "branching cnn"])
def test_a_trainer_passed_again_compiles_nothing_whatever_its_epochs(which: str) -> None:
    """A notebook trains 5 epochs, then 2 more, then 1 with a plot callback: every call
    after the first runs the trainer's one epochs program."""
    model, (x, y) = (reshape_mlp(), toy_data(31)) if which == "mlp" else (branching(),
                                                                           digits16())
    first = fit(model, x, y, epochs=5, batch_size=4, learning_rate=0.1, loss="cce",
                validation_split=0.1)
    with compile_events() as events:
        for kwargs in (dict(epochs=2), dict(epochs=1, on_epoch=lambda i, h: None),
                       dict(epochs=3, on_epoch=lambda i, h: None, overlap_epochs=False),
                       dict(epochs=7)):
            again = fit(model, x, y, trainer=first.trainer, **kwargs)
            assert len(again.history.loss) == kwargs["epochs"]
    programs = lowered(events)
    assert not [f for f in programs if "epoch" in f or "train_step" in f], programs


@pytest.mark.parametrize("shuffle", [False, True])
def test_epochs_in_one_compiled_call_equal_epoch_by_epoch(shuffle: bool) -> None:
    """With nothing to call back, ``fit`` runs all epochs in one compiled call; weights,
    losses, accuracies and validation are those of the epoch-by-epoch loop (an ``on_epoch``
    forces it: one compiled call per epoch) up to float32 rounding."""
    model = reshape_mlp()
    x, y = toy_data(31)  # 6 steps of 4 and a trailing 1 kept; validation: 3 more samples
    cfg = dict(epochs=3, batch_size=4, learning_rate=0.1, loss="cce", optimizer="adam",
               shuffle=shuffle, drop_remainder=False, validation_split=0.1)
    fused = fit(model, x, y, **cfg)
    seen: list[int] = []
    stepwise = fit(model, x, y, on_epoch=lambda i, h: seen.append(i), overlap_epochs=False,
                   **cfg)
    assert seen == [0, 1, 2]
    programs = [[name for name, *_ in r.trainer._compiled] for r in (fused, stepwise)]
    # the fresh state, then one program for all epochs in one call / one call per epoch
    assert programs == [["fresh", "epochs1024"], ["fresh", "epochs1024"]]
    _same_run(fused, stepwise)
    h, g = fused.history, stepwise.history
    assert (h.accuracy, h.steps, h.skipped) == (g.accuracy, g.steps, g.skipped)
    np.testing.assert_allclose(h.val_loss, g.val_loss, rtol=1e-6)
    assert h.val_accuracy == g.val_accuracy and len(h.val_loss) == 3


def _recorded_fit(model, x, y, events: list[str], fail_at: int | None = None,
                  epochs: int = 3, **kwargs):
    """``fit`` with an ``on_epoch``, recording the order of its compiled epoch calls
    ("run <first epoch> <epochs>") and its ``on_epoch`` calls ("epoch <i>")."""
    trainer = Trainer(model, epochs=epochs, batch_size=4, learning_rate=0.1, loss="cce",
                      optimizer="adam", validation_split=0.1)
    runner = trainer.epochs_runner

    def recording_runner(*args, **kw):
        run = runner(*args, **kw)

        def recorded(s, first_epoch, n, read=True):
            events.append(f"run {first_epoch} {n}")
            return run(s, first_epoch, n, read)
        return recorded

    trainer.epochs_runner = recording_runner

    def on_epoch(i, h):
        assert len(h.loss) == len(h.val_loss) == i + 1  # epoch i recorded, no later one
        events.append(f"epoch {i}")
        if i == fail_at:
            raise KeyboardInterrupt

    return fit(model, x, y, trainer=trainer, on_epoch=on_epoch, **kwargs)


@pytest.fixture
def asynchronous(monkeypatch):
    """`fit` as under asynchronous dispatch (JAX's default, a notebook's); a command-line
    test may have made this worker's CPU programs run inline, which changes only when a
    call returns, not the order of the calls."""
    import circle_jax.train.loop as loop

    monkeypatch.setattr(loop, "dispatches_async", lambda platform: True)
    return loop


def test_with_on_epoch_alone_epochs_are_queued_ahead_of_it(asynchronous, monkeypatch) -> None:
    """Under asynchronous dispatch ``fit`` queues each call of epochs before ``on_epoch``
    runs for the previous one's: the first two calls one epoch each, later ones as many as
    take about `QUEUED_CALL_SECONDS`; ``on_epoch(i)`` sees epoch i, not later ones; the
    results of one epoch at a time (``overlap_epochs=False``) up to float32 rounding; an
    ``on_epoch`` that raises still ends ``fit`` at that epoch."""
    import jax

    from circle_jax.train.dispatch import dispatches_async

    assert dispatches_async("gpu")
    assert dispatches_async("cpu") == jax.config.read("jax_cpu_enable_async_dispatch")
    model = reshape_mlp()
    x, y = toy_data(31)
    monkeypatch.setattr(asynchronous, "QUEUED_CALL_SECONDS", 1e9)  # calls as long as allowed
    queued: list[str] = []
    a = _recorded_fit(model, x, y, queued, epochs=6)
    assert queued == ["run 0 1", "run 1 1", "epoch 0", "run 2 4", "epoch 1", "epoch 2",
                      "epoch 3", "epoch 4", "epoch 5"]
    one_at_a_time: list[str] = []
    b = _recorded_fit(model, x, y, one_at_a_time, epochs=6, overlap_epochs=False)
    assert one_at_a_time == [e for i in range(6) for e in (f"run {i} 1", f"epoch {i}")]
    _same_run(a, b)
    assert len(a.history.ms_per_step) == 6 and min(a.history.ms_per_step) > 0
    monkeypatch.setattr(asynchronous, "QUEUED_CALL_SECONDS", 0.0)  # one epoch a call
    stopped: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _recorded_fit(model, x, y, stopped, fail_at=1)
    assert stopped == ["run 0 1", "run 1 1", "epoch 0", "run 2 1", "epoch 1"]


def test_inline_dispatch_runs_one_epoch_at_a_time(monkeypatch) -> None:
    """Where a call runs its program before returning (`inline_cpu_dispatch`), queuing
    would only delay ``on_epoch``: epochs run one at a time."""
    import circle_jax.train.loop as loop

    monkeypatch.setattr(loop, "dispatches_async", lambda platform: False)
    events: list[str] = []
    _recorded_fit(reshape_mlp(), *toy_data(31), events)
    assert events == ["run 0 1", "epoch 0", "run 1 1", "epoch 1", "run 2 1", "epoch 2"]


def _same_run(a, b) -> None:
    """The same training up to float32 rounding: each compiled program is deterministic, but
    XLA may round the tiny products' sums (`small_matmul`) differently in differently shaped
    programs (seen: 1 ulp, 6e-8, in a few weights). 1e-6 relative is ~8 ulp."""
    np.testing.assert_allclose(a.history.loss, b.history.loss, rtol=1e-6)
    for k in a.params:
        np.testing.assert_allclose(a.params[k], b.params[k], rtol=1e-6, atol=1e-7)


def test_resuming_inside_an_epoch_continues_the_run() -> None:
    """initial_epoch / initial_step: a run stopped after 3 steps of epoch 1 and continued
    from its state ends where the uninterrupted 3-epoch run ends (shuffled, so the epoch
    numbering must match too)."""
    model = reshape_mlp()
    x, y = toy_data(20)
    cfg = dict(batch_size=4, learning_rate=0.1, loss="cce", optimizer="adam", shuffle=True)
    full = fit(model, x, y, epochs=3, **cfg)
    trainer = Trainer(model, **cfg)
    resumed = fit(model, x, y, trainer=trainer, epochs=2, state=_after(trainer, x, y, 3),
                  initial_epoch=1, initial_step=3)
    for k in full.params:
        np.testing.assert_allclose(full.params[k], resumed.params[k], rtol=1e-6, atol=1e-7)
    assert resumed.history.steps == [2, 5]


def _after(trainer, x, y, steps_into_epoch_1):
    """The state after epoch 0 and ``steps_into_epoch_1`` steps of epoch 1."""
    state, frozen = trainer.init()
    state, _ = trainer.run_epoch(state, frozen, (x,), y, 0)
    kept = []
    state, _ = trainer.run_epoch(state, frozen, (x,), y, 1, every_steps=steps_into_epoch_1,
                                 after_chunk=lambda s: kept.append(s))
    return kept[0]


def test_eval_command(tmp_path, capsys) -> None:
    model = reshape_mlp()
    path = tmp_path / "m.circle"
    path.write_bytes(model.export(file_format="circle"))
    x, y = toy_data(23)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    assert main(["eval", str(path), "--load_input", str(tmp_path / "x.npy"), "--load_expected",
                 str(tmp_path / "y.npy"), "--batch_size", "4", "--loss", "2"]) == 0
    loss, acc = _direct(model, x, y, "cce", "sum_over_batch_size", 4)
    assert capsys.readouterr().out.strip() == (
        f"loss: {loss:.4f} - categorical_accuracy: {acc:.4f} (23 samples, batch 4)")
    assert main(["eval", str(path), "--load_input", str(tmp_path / "x.npy")]) == 1
    assert capsys.readouterr().err.startswith("E: data missing")
    for target, shown in ((y, True), (y * 0.9 + 0.01, False)):  # one-hot; regression
        np.save(tmp_path / "t.npy", target)
        assert main(["eval", str(path), "--load_input", str(tmp_path / "x.npy"),
                     "--load_expected", str(tmp_path / "t.npy"), "--loss", "1"]) == 0
        loss, _ = _direct(model, x, target, "mse", "sum_over_batch_size", 32)
        out = capsys.readouterr().out.strip()
        assert out.startswith(f"loss: {loss:.4f}") and ("categorical_accuracy" in out) == shown


def test_accuracy_of_image_shaped_and_sparse_targets() -> None:
    """Targets of several values per sample are compared by argmax over the flattened sample
    (a [N, 20, 20, 1] map too), targets of one value per sample as class indices."""
    from circle_jax.train.data import correct

    out = np.zeros((2, 20, 20, 1), np.float32)
    out[0, 3, 4, 0] = out[1, 0, 1, 0] = 1.0
    y = np.zeros_like(out)
    y[0, 3, 4, 0] = y[1, 5, 5, 0] = 1.0
    np.testing.assert_array_equal(correct(out, y), [1, 0])
    logits = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], np.float32)
    np.testing.assert_array_equal(correct(logits, np.array([1, 2])), [1, 0])
    np.testing.assert_array_equal(correct(logits, np.eye(3, dtype=np.float32)[[1, 0]]), [1, 1])


def test_fused_epochs_stop_for_an_interrupt_within_about_a_call() -> None:
    """A `fit` without callbacks runs its epochs fused, in calls of about
    `FUSED_CALL_SECONDS`: Ctrl-C (SIGINT) sent 1 s into a run of 10**6 epochs (minutes)
    raises KeyboardInterrupt within a few seconds. Before, the epochs were one call, which
    Python cannot interrupt (a notebook's stop button waited for the whole run)."""
    code = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal leaves it
        from circle_jax.train import fit
        from tests.toy_models import reshape_mlp, toy_data
        x, y = toy_data(64)
        try:
            fit(reshape_mlp(), x, y, epochs=10**6, batch_size=4,
                on_start=lambda h: print("started", flush=True))
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline() == "started\n"
        time.sleep(1)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    word, when = out.split()
    assert word == "interrupted" and float(when) - sent < 5, out


@pytest.mark.parametrize(("changes", "message"), [
    (dict(batch_size=0), "TrainConfig.batch_size must be an integer >= 1, got 0"),
    (dict(batch_size=4.0), "TrainConfig.batch_size must be an integer >= 1, got 4.0"),
    (dict(epochs=-1), "TrainConfig.epochs must be an integer >= 0, got -1"),
    (dict(epochs=1.5), "TrainConfig.epochs must be an integer >= 0, got 1.5"),
    (dict(accumulate=0), "TrainConfig.accumulate must be an integer >= 1, got 0"),
    (dict(seed=1 << 64), "TrainConfig.seed must be an integer in"),
    (dict(learning_rate="0.1"), "TrainConfig.learning_rate must be a number or an optax "
                                "schedule, got '0.1'"),
])
def test_a_configuration_that_cannot_train_is_refused_when_made(changes, message) -> None:
    """Before: a ZeroDivisionError (batch 0), a reshape's TypeError (batch -1), JAX's
    shape errors (floats), an empty history (epochs -1), an OverflowError (the seed)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**changes)
    model = reshape_mlp()
    x, y = toy_data(8)
    with pytest.raises(ValueError, match=re.escape(message)):
        fit(model, x, y, **{"batch_size": 4, "epochs": 1, **changes})
    if set(changes) == {"epochs"}:  # how many epochs a call with a trainer trains
        with pytest.raises(ValueError, match=re.escape(message)):
            fit(model, x, y, trainer=Trainer(model, batch_size=4), **changes)


def test_evaluate_checks_its_samples_as_fit_does() -> None:
    """Before, targets of 3 samples for inputs of 20 scored 3 of them, NaN targets gave a
    NaN loss and batch_size 0 one batch of all."""
    model = reshape_mlp()
    x, y = toy_data(20)
    trainer = Trainer(model, batch_size=4, loss="cce")
    with pytest.raises(DataError, match=r"inputs have \[20\] samples, targets have 3"):
        trainer.evaluate(model.params, x, y[:3])
    with pytest.raises(DataError, match="sample 2 holds NaN"):
        trainer.evaluate(model.params, x, np.where(np.arange(20)[:, None] == 2, np.nan, y))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        trainer.evaluate(model.params, x, y, batch_size=0)
    loss, accuracy = trainer.evaluate(model.params, x, y)
    assert np.isfinite(loss) and 0 <= accuracy <= 1


def test_apply_names_a_missing_param() -> None:
    model = reshape_mlp()
    x, _ = toy_data(2)
    partial = dict(list(model.params.items())[1:])
    with pytest.raises(KeyError, match="params lack 1 of the model's .* expected every param"):
        model.apply(partial, x)


def test_fit_refuses_params_and_positions_that_are_not_the_run_s() -> None:
    """Params with another shape (before: an operator's error about rows), NaN weights
    (before: a NaN loss after the epoch), unknown names; a first step outside the epoch
    (before: an internal TypeError) and non-integer counts."""
    model = reshape_mlp()
    x, y = toy_data(20)
    name = next(iter(model.params))
    cfg = dict(batch_size=4, epochs=1)
    cases = [
        (dict(params={**model.params, name: np.zeros((3, 3), np.float32)}),
         ValueError, rf"params\['{re.escape(name)}'\] has shape \[3, 3\], the model's is"),
        (dict(params={**model.params, name: np.full(np.shape(model.params[name]), np.nan,
                                                     np.float32)}),
         DataError, "holds NaN or infinity; expected finite weights"),
        (dict(params={**model.params, "typo": 1.0}), ValueError, "1 unknown, e.g. 'typo'"),
        (dict(initial_step=5), ValueError, "initial_step 5 is not inside an epoch of 5 steps"),
        (dict(initial_epoch=-1), ValueError, "initial_epoch must be an integer >= 0, got -1"),
        (dict(every_steps=2.5), ValueError, "every_steps must be an integer >= 1, got 2.5"),
    ]
    for changes, error, message in cases:
        with pytest.raises(error, match=message):
            fit(model, x, y, **cfg, **changes)
    assert len(fit(model, x, y, **cfg, initial_step=4).history.loss) == 1
