"""Training semantics of ``circle_jax.train`` and the ``circle-jax`` command line.

Trainable subsets (bit-identical frozen weights, no backward pass for them), the epoch loss
as the mean of pre-update batch losses, a batch-1 model trained at batch 8 through Reshape,
seeded shuffling, partial batches, the validation tail, divergence errors; then the CLI:
onert_train's output format (its losses checked against onert itself), one-line errors,
``info`` on every shared model, the bundled example, and the installed console script.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.errors import DataError, TrainingError
from circle_jax.formats.reader import read_model
from circle_jax.losses import get_loss
from circle_jax.train import Trainer, fit, select_trainable
from tests.paths import shared_model, shared_model_names
from tests.toy_models import branching, digits16, reshape_mlp, toy_data


def _as_np(params: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in params.items()}


# ----------------------------------------------------------------------------- trainable


@pytest.mark.parametrize("n_ops", [2, 6])
def test_last_n_operators_train_only_their_weights(n_ops: int) -> None:
    model = branching()  # conv1, conv2, add, pool, reshape, fc, softmax
    x, y = digits16()
    first = len(model.operators) - n_ops
    want = {name for name, ops in model.param_operators().items() if max(ops) >= first}
    assert want == ({"dense/weights", "dense/bias"} if n_ops == 2 else
                    {"dense/weights", "dense/bias", "conv2/filter", "conv2/bias"})
    r = fit(model, x, y, trainable=n_ops, epochs=1, batch_size=8, learning_rate=0.05,
            loss=2, optimizer=2)
    assert r.trainer.trainable == want
    before, after = _as_np(model.params), _as_np(r.params)
    for k in before:
        assert after[k].dtype == before[k].dtype
        if k in want:
            assert not np.array_equal(after[k], before[k]), f"{k} was not trained"
        else:
            assert after[k].tobytes() == before[k].tobytes(), f"frozen {k} changed"
    assert set(r.state.params) == want  # optimizer state exists only for trained weights


def test_trainable_as_weight_names() -> None:
    model = branching()
    x, y = digits16()
    names = {"conv2/filter", "dense/bias"}
    r = fit(model, x, y, trainable=names, epochs=1, batch_size=8, learning_rate=0.05,
            loss=2, optimizer=1)
    for k, v in _as_np(model.params).items():
        changed = not np.array_equal(np.asarray(r.params[k]), v)
        assert changed == (k in names), k
    with pytest.raises(ValueError, match=r"unknown weight name\(s\) \['conv3/filter'\].*"
                                         r"'conv1/bias'"):
        select_trainable(model, {"conv3/filter", "dense/bias"})
    assert select_trainable(model, 0) == select_trainable(model, "none") == frozenset()
    assert select_trainable(model, -1) == select_trainable(model, "all") == set(model.params)


def _contractions(fn, *args) -> int:
    """Matmul-like equations (dot_general, conv, the few-channel convolution's primitives,
    alone or as a clamped layer) in the jaxpr of ``fn``, nested ones too."""
    counts: collections.Counter = collections.Counter()

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            counts[eqn.primitive.name] += 1
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return sum(counts[name] for name in (
        "dot_general", "conv_general_dilated", "few_channels_conv",
        "few_channels_weight_gradient", "few_channels_clamped", "few_channels_masked_gradient"))


def test_frozen_weights_are_not_differentiated() -> None:
    """The step's backward pass holds only the contractions the trainable weights need."""
    model = branching()
    x, y = jnp.zeros((8, 8, 8, 1)), jnp.zeros((8, 10))
    forward = _contractions(model.apply, model.params, x)  # conv1, conv2, dense

    def step_contractions(spec) -> int:
        t = Trainer(model, trainable=spec, batch_size=8, learning_rate=0.1, loss=2,
                    optimizer=1)
        state, frozen = t.init()
        return _contractions(t.train_step, state, frozen, ((x,), y))

    assert forward == 3
    assert step_contractions(0) == forward  # nothing trainable: no backward at all
    assert step_contractions(2) == forward + 1  # dense weights' gradient only
    # conv1 frozen: + dense weights, dense input (to reach conv2), conv2 filter
    assert step_contractions(6) == forward + 3
    # everything: + conv2 input and conv1 filter
    assert step_contractions("all") == forward + 5


# ----------------------------------------------------------------------------- epoch loss


def test_epoch_loss_is_the_mean_of_pre_update_batch_losses() -> None:
    model = reshape_mlp()
    x, y = toy_data(16)
    cfg = dict(epochs=2, batch_size=4, learning_rate=0.5, loss=2, optimizer=1)
    r = fit(model, x, y, **cfg)

    trainer = Trainer(model, **cfg)
    state, frozen = trainer.init()
    step = jax.jit(trainer.train_step)
    loss_fn = get_loss(2)
    history = []
    for _ in range(2):
        losses = []
        for i in range(4):
            xb, yb = jnp.asarray(x[4 * i:4 * i + 4]), jnp.asarray(y[4 * i:4 * i + 4])
            pre = loss_fn(model.apply(trainer.merge(state, frozen), xb)[0], yb)
            state, m = step(state, frozen, ((xb,), yb))
            np.testing.assert_allclose(m.loss, pre, rtol=1e-6)  # the PRE-update loss
            losses.append(float(m.loss))
        history.append(np.mean(losses))
    np.testing.assert_allclose(r.history.loss, history, rtol=1e-6)
    assert r.history.steps == [4, 4]
    for k, v in trainer.merge(state, frozen).items():
        np.testing.assert_allclose(r.params[k], v, rtol=1e-5, atol=1e-7, err_msg=k)


def test_batch_one_model_trains_at_batch_eight_through_reshape() -> None:
    model = reshape_mlp()
    assert model.inputs[0].shape == (1, 4, 4, 2)
    x, y = toy_data(16)
    r = fit(model, x, y, epochs=1, batch_size=8, learning_rate=0.1, loss=2, optimizer=1)
    assert r.history.steps == [2]
    # the first step's loss is the mean of the 8 samples' losses, each run at batch 1
    per_sample = [float(get_loss(2)(model(x[i:i + 1])[0], y[i:i + 1])) for i in range(8)]
    first = np.mean(per_sample)
    trainer = Trainer(model, batch_size=8, learning_rate=0.1, loss=2, optimizer=1)
    state, frozen = trainer.init()
    _, m = jax.jit(trainer.train_step)(state, frozen, ((jnp.asarray(x[:8]),),
                                                       jnp.asarray(y[:8])))
    np.testing.assert_allclose(m.loss, first, rtol=1e-6)


# ----------------------------------------------------------------------------- data handling


def test_seeded_shuffle_is_reproducible_and_not_sequential() -> None:
    model = reshape_mlp()
    x, y = toy_data(16)
    cfg = dict(epochs=2, batch_size=4, learning_rate=0.5, loss=2, optimizer=1)
    a = fit(model, x, y, shuffle=True, seed=3, **cfg)
    b = fit(model, x, y, shuffle=True, seed=3, **cfg)
    seq = fit(model, x, y, **cfg)
    other = fit(model, x, y, shuffle=True, seed=4, **cfg)
    assert a.history.loss == b.history.loss
    for k in a.params:
        assert np.array_equal(a.params[k], b.params[k]), k
    assert a.history.loss != seq.history.loss
    assert a.history.loss != other.history.loss
    assert a.history.steps == seq.history.steps == [4, 4]


@pytest.mark.parametrize("keep_remainder", [False, True])
def test_shuffle_is_the_documented_permutation_drawn_on_device(keep_remainder: bool) -> None:
    """Epoch e visits the samples in the order permutation(fold_in(key(seed), e), n), drawn
    inside the compiled epoch: the same run as sequential batches of data permuted by hand
    (epoch by epoch), the trailing partial batch too."""
    model = reshape_mlp()
    x, y = toy_data(18)
    cfg = dict(batch_size=4, learning_rate=0.5, loss=2, optimizer=2,
               drop_remainder=not keep_remainder)
    shuffled = fit(model, x, y, epochs=2, shuffle=True, seed=5, **cfg)
    trainer = Trainer(model, **cfg, epochs=1)
    state, frozen = trainer.init()
    losses = []
    for epoch in range(2):
        perm = np.asarray(jax.random.permutation(
            jax.random.fold_in(jax.random.key(5), epoch), len(y)))
        state, m = trainer.run_epoch(state, frozen, (jnp.asarray(x[perm]),),
                                     jnp.asarray(y[perm]))
        losses.append(float(jnp.mean(m.loss)))
    np.testing.assert_allclose(shuffled.history.loss, losses, rtol=1e-6)
    for k, v in trainer.merge(state, frozen).items():
        np.testing.assert_allclose(shuffled.params[k], v, rtol=1e-6, atol=1e-7)


def test_keep_remainder_trains_the_partial_batch() -> None:
    model = reshape_mlp()
    x, y = toy_data(20)  # 2 batches of 8 and a partial batch of 4
    cfg = dict(epochs=1, batch_size=8, learning_rate=0.5, loss=2, optimizer=2)
    dropped = fit(model, x, y, **cfg)
    kept = fit(model, x, y, drop_remainder=False, **cfg)
    assert dropped.history.steps == [2] and kept.history.steps == [3]
    # keeping = dropping, then one more step on the last 4 samples
    trainer = dropped.trainer
    state, m = jax.jit(trainer.train_step)(dropped.state, trainer.init()[1],
                                           ((jnp.asarray(x[16:]),), jnp.asarray(y[16:])))
    for k, v in trainer.merge(state, {}).items():
        np.testing.assert_allclose(kept.params[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    want = (2 * dropped.history.loss[0] + float(m.loss)) / 3
    np.testing.assert_allclose(kept.history.loss[0], want, rtol=1e-6)
    # accuracy counts the 20 samples seen, not 3 full batches
    assert abs(kept.history.accuracy[0] * 20 - round(kept.history.accuracy[0] * 20)) < 1e-9


def test_validation_split_uses_the_last_fraction() -> None:
    model = reshape_mlp()
    x, y = toy_data(16)
    cfg = dict(epochs=2, batch_size=4, learning_rate=0.5, loss=2, optimizer=1)
    r = fit(model, x, y, validation_split=0.25, **cfg)
    head = fit(model, x[:12], y[:12], **cfg)  # the first 75% train
    assert r.history.loss == head.history.loss and r.history.steps == [3, 3]
    val_loss, val_acc = r.trainer.evaluate(r.params, x[12:], y[12:])
    np.testing.assert_allclose(r.history.val_loss[-1], val_loss, rtol=1e-6)
    assert r.history.val_accuracy[-1] == val_acc
    assert abs(r.trainer.evaluate(r.params, x[:4], y[:4])[0] - val_loss) > 1e-4


@pytest.mark.parametrize("n, lr, epochs, message", [
    (16, 1e12, 3, r"epoch 1: the loss is (nan|inf) \(not finite\)"),
    (4, 1e20, 3, r"epoch 2: the loss is (nan|inf) \(not finite\)"),
    (4, 1e37, 1, r"epoch 1: the weights are no longer finite \(loss \d"),
])
def test_non_finite_loss_raises_one_line_training_error(n: int, lr: float, epochs: int,
                                                        message: str) -> None:
    """An absurd learning rate: linear outputs, MSE diverges to inf/NaN.

    (4, 1e20): one step per epoch; epoch 1 is finite and its update makes the weights huge,
    so epoch 2's loss is inf and its gradients are not finite (a step with such gradients
    was once skipped silently, and an epoch with skipped steps forgiven: no error at all).
    (4, 1e37): the only step's loss is finite but its update overflows the weights.
    """
    model = reshape_mlp(softmax=False)
    x, y = toy_data(n)
    y = y * 1000  # gradients of 1e2..1e3
    with pytest.raises(TrainingError, match=message) as e:
        fit(model, x, y, epochs=epochs, batch_size=4, learning_rate=lr, loss=1, optimizer=1)
    assert "\n" not in str(e.value)


def test_input_errors() -> None:
    model = reshape_mlp()
    x, y = toy_data(6)
    with pytest.raises(DataError, match="6 training samples are fewer than one batch of 8"):
        fit(model, x, y, batch_size=8)
    with pytest.raises(DataError, match=r"samples of shape \[4, 4, 3\], the model expects "
                                        r"\[4, 4, 2\]"):
        fit(model, np.zeros((6, 4, 4, 3), np.float32), y, batch_size=2)
    with pytest.raises(ValueError, match="needs 64-bit JAX"):
        Trainer(model, precision="float64")


# ----------------------------------------------------------------------------- CLI

EPOCH_LINE = re.compile(
    r"^Epoch (\d+)/2 - time: \d+\.\d{3}ms/step - loss: \[0\] (\d+\.\d{4})"
    r" - categorical_accuracy: \[0\] [01]\.\d{4} - val_loss: \[0\] \d+\.\d{4}"
    r" - val_categorical_accuracy: \[0\] [01]\.\d{4}$")
PARAMS_BLOCK = """\
== training parameter ==
- learning_rate        = 0.001
- batch_size           = 4
- loss_info            = {loss = categorical crossentropy, reduction = sum over batch size}
- optimizer            = adam
- num_of_trainable_ops = -1
"""


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The agreement tests' CNN as .circle, 16 digits as raw input/expected, and bad data."""
    from tests.toy_models import cnn

    d = tmp_path_factory.mktemp("cli")
    x, y = digits16()
    files = {"model": d / "cnn.circle", "x": d / "x.raw", "y": d / "y.raw", "bad": d / "b.raw"}
    cnn().save(files["model"])
    files["x"].write_bytes(x.astype("<f4").tobytes())
    files["y"].write_bytes(y.astype("<f4").tobytes())
    files["bad"].write_bytes(x.astype("<f4").tobytes()[:-100])
    return {k: str(v) for k, v in files.items()}


def _train_args(f: dict[str, str], x: str = "x") -> list[str]:
    return ["train", f["model"], "--load_input:raw", f[x], "--load_expected:raw", f["y"],
            "--epoch", "2", "--batch_size", "4", "--loss", "2", "--optimizer", "2",
            "--metric", "0", "--validation_split", "0.25"]


def test_cli_train_prints_onert_train_output(cli_files, capsys, onert) -> None:
    assert main(_train_args(cli_files)) == 0
    out = capsys.readouterr().out
    assert out.startswith(PARAMS_BLOCK)
    lines = out.splitlines()
    block_end = lines.index("========================")
    assert all(line.startswith("- ") for line in lines[6:block_end])  # extras, e.g. backend
    epochs = [EPOCH_LINE.match(line) for line in lines if line.startswith("Epoch")]
    assert len(epochs) == 2 and all(epochs), out
    assert [int(m.group(1)) for m in epochs] == [1, 2]
    summary = lines[lines.index("===================================") + 1:]
    assert re.fullmatch(r"MODEL_LOAD   takes \d+\.\d{4} ms", summary[0])
    assert re.fullmatch(r"PREPARE      takes \d+\.\d{4} ms", summary[1])
    assert re.fullmatch(r"EXECUTE      takes \d+\.\d{4} ms", summary[2])
    assert re.fullmatch(r"- Epoch 1      takes \d+\.\d{4} ms \(includes one-time work: the "
                        r"compiled epoch's first run\)", summary[3])
    assert re.fullmatch(r"- Epoch 2      takes \d+\.\d{4} ms", summary[4])
    assert summary[5] == "==================================="
    assert summary[6].startswith("(PREPARE: data + XLA compile of the training epoch "), summary
    # the printed losses are onert's: the first 12 samples train, the last 4 validate
    x, y = digits16()
    want = onert.onert_fit(cli_files["model"], x[:12], y[:12], epochs=2, batch_size=4,
                           learning_rate=0.001, loss=2, optimizer=2).loss
    got = [float(m.group(2)) for m in epochs]
    np.testing.assert_allclose(got, want, rtol=0, atol=6e-5)  # 4 decimals, + 1e-5


def test_cli_wrong_raw_size_is_one_error_line(cli_files, capsys) -> None:
    assert main(_train_args(cli_files, x="bad")) != 0
    err = capsys.readouterr().err.strip()
    size = 16 * 64 * 4 - 100
    assert "\n" not in err and err.startswith("E: ")
    assert f"has {size} bytes" in err and "256 bytes per sample" in err, err


def test_cli_bad_flag_exits_2(cli_files, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([*_train_args(cli_files), "--loss", "7"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("E: ") and "invalid loss '7'" in err, err


SHARED = shared_model_names()


@pytest.mark.parametrize("name", SHARED)
def test_cli_info_on_every_shared_model(name: str, capsys) -> None:
    path = shared_model(name)
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    m = read_model(path)
    tables = [i for i, line in enumerate(out.splitlines())
              if re.fullmatch(r"\s+#  operator\s+inputs -> outputs", line)]
    assert len(tables) == len(m.subgraphs), out
    for sg in m.subgraphs:
        for op in sg.operators:
            assert re.search(rf"^\s+{op.index}  {re.escape(op.key)}\s.* -> ", out, re.M), \
                (name, sg.index, op.index)


def test_cli_example_trains(capsys) -> None:
    assert main(["train", "--example", "--epoch", "2"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^Epoch [12]/2 - time: .* - val_categorical_accuracy: \[0\] ",
                          out, re.M)) == 2, out
    assert re.search(r"^held-out accuracy \(last 20% of the digits\): [01]\.\d{4}$", out, re.M)


def test_console_script_entry_point(cli_files) -> None:
    exe = shutil.which("circle-jax", path=os.path.dirname(sys.executable)) or \
        shutil.which("circle-jax")
    assert exe, "the circle-jax console script is not installed (pip install -e .)"
    args = _train_args(cli_files)
    args[args.index("--epoch") + 1] = "1"
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert re.search(r"^Epoch 1/1 - time: \d+\.\d{3}ms/step - loss: \[0\] \d+\.\d{4}",
                     p.stdout, re.M), p.stdout


def test_compiler_options_chosen_by_the_models_operators() -> None:
    """XLA's classic fusion emitters for a model with a convolution or pooling, XLA's
    defaults for a dense one (on CPU; every other platform compiles with its defaults)."""
    from circle_jax.train import CLASSIC_EMITTERS, cpu_compiler_options

    assert cpu_compiler_options(["FULLY_CONNECTED", "RELU", "SOFTMAX"]) == {}
    for spatial in ("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "MAX_POOL_2D",
                    "AVERAGE_POOL_2D"):
        assert cpu_compiler_options(["FULLY_CONNECTED", spatial]) == CLASSIC_EMITTERS
    on_cpu = jax.default_backend() == "cpu"
    assert Trainer(branching()).compiler_options == (CLASSIC_EMITTERS if on_cpu else {})
    assert Trainer(reshape_mlp()).compiler_options == {}


def test_large_convolutional_models_compile_at_llvm_level_2() -> None:
    """LLVM at level 2 for convolutional models of at least LLVM_O2_MIN_OPERATORS operators
    (MobileNet 0.25/128: 31), XLA's level 3 for smaller or dense ones."""
    from circle_jax.train.programs import (
        CLASSIC_EMITTERS,
        LLVM_O2,
        LLVM_O2_MIN_OPERATORS,
        cpu_compiler_options,
    )

    n = LLVM_O2_MIN_OPERATORS
    assert cpu_compiler_options(["CONV_2D"] * n) == {**CLASSIC_EMITTERS, **LLVM_O2}
    assert cpu_compiler_options(["CONV_2D"] * (n - 1)) == CLASSIC_EMITTERS
    assert cpu_compiler_options(["FULLY_CONNECTED"] * 2 * n) == {}
    if jax.default_backend() == "cpu":
        mobilenet = cj.load(shared_model("mobilenet_v1_0.25_128_float.tflite"))
        assert Trainer(mobilenet).compiler_options == {**CLASSIC_EMITTERS, **LLVM_O2}


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_epochs_compile_with_the_trainers_options_and_without_unknown_ones(
        monkeypatch, model: str) -> None:
    """The epochs (and the fresh state) are compiled with the trainer's compiler options; an
    XLA that lacks an option compiles with its defaults and trains the same (to 1e-6: the
    emitters may order a sum differently)."""
    seen = []
    original = jax.stages.Lowered.compile

    def recording(self, compiler_options=None, **kw):
        seen.append(compiler_options)
        return original(self, compiler_options=compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", recording)
    if model == "dense":
        net, (x, y) = reshape_mlp(), toy_data(16)
    else:
        net, (x, y) = branching(), digits16()
    cfg = dict(epochs=2, batch_size=4, learning_rate=0.5 if model == "dense" else 0.01,
               loss=2, optimizer=1)
    reference = fit(net, x, y, **cfg)
    options = reference.trainer.compiler_options
    assert seen == [options or None] * 2
    trainer = Trainer(net, **{k: v for k, v in cfg.items() if k != "epochs"})
    trainer.compiler_options = {"xla_cpu_no_such_option": True}
    again = fit(net, x, y, trainer=trainer, epochs=2)
    # refused, then XLA's defaults (the fresh state, then the epochs)
    assert seen[2:] == [{"xla_cpu_no_such_option": True}, None] * 2
    np.testing.assert_allclose(again.history.loss, reference.history.loss, rtol=1e-6)
