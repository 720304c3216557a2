"""`make_train_step`'s pure step, and the work a repeated ``fit`` call does (counted, not
timed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from circle_jax.train import data as data_module
from circle_jax.train import fit, make_train_step, programs
from circle_jax.train import trainer as trainer_module
from tests.toy_models import reshape_mlp, toy_data


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_pure_step_scanned_is_fits_epoch(optimizer):
    """``step`` jitted and scanned over an epoch's batches gives ``fit``'s params and
    per-batch losses for one unshuffled epoch (the same step, in a program of another
    shape: float32 rounding at most)."""
    model = reshape_mlp()
    x, y = toy_data(32)
    kw = {"batch_size": 8, "loss": "cce", "optimizer": optimizer, "learning_rate": 0.05}
    init, step, definition = make_train_step(model, **kw)
    state = jax.jit(init)(None)

    def epoch(s, batches):
        return jax.lax.scan(lambda c, b: step(c, ((b[0],), b[1])), s, batches)

    batches = (jnp.reshape(x, (4, 8, *x.shape[1:])), jnp.reshape(y, (4, 8, *y.shape[1:])))
    state, metrics = jax.jit(epoch)(state, batches)
    ours = definition.merge(state.train, state.frozen)
    theirs = fit(model, x, y, epochs=1, **kw)
    assert set(ours) == set(theirs.params)
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs.params[k], rtol=1e-6, atol=1e-7, err_msg=k)
    np.testing.assert_allclose(float(jnp.mean(metrics.loss)), theirs.history.loss[0],
                               rtol=1e-6)
    assert int(state.train.step) == 4
    moved = [k for k in ours if not np.array_equal(ours[k], model.params[k])]
    assert moved, "the step changed no weight"


def test_the_step_is_defined_without_a_trainer():
    """`make_train_step` builds the step alone (no compiled epochs, no program cache: a
    `TrainingStep`, not a `Trainer`), and a `Trainer` of the same configuration steps the
    same values: it is that step, driven."""
    from circle_jax.train import Trainer, TrainingStep

    model = reshape_mlp()
    x, y = toy_data(8)
    kw = {"batch_size": 8, "loss": "cce", "optimizer": "adam"}
    init, step, definition = make_train_step(model, **kw)
    assert type(definition) is TrainingStep and not isinstance(definition, Trainer)
    ours, _ = jax.jit(step)(init(), ((x,), y))
    trainer = Trainer(model, **kw)
    state, frozen = trainer.init()
    theirs, _ = jax.jit(trainer.train_step)(state, frozen, ((x,), y))
    jax.tree.map(np.testing.assert_array_equal, ours.train.params, theirs.params)


def test_pure_step_is_pure():
    """The same state and batch give the same new state, and the input state is left as it
    was (nothing kept between calls)."""
    model = reshape_mlp()
    x, y = toy_data(8)
    init, step, _ = make_train_step(model, batch_size=8, loss="cce", optimizer="adam")
    state = init()
    before = jax.tree.map(np.asarray, state)
    a, _ = jax.jit(step)(state, ((x,), y))
    b, _ = jax.jit(step)(state, ((x,), y))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    jax.tree.map(np.testing.assert_array_equal, state, before)


def test_repeated_fit_does_no_fixed_work(monkeypatch):
    """A second ``fit`` on the same trainer, params and device-array samples compiles
    nothing, checks and moves neither the samples nor the params again, makes no fresh
    state and packs nothing on the host: its only work is the epochs' calls and the
    reads of their summaries (the logging points)."""
    model = reshape_mlp()
    x, y = jax.device_put(toy_data(64))
    kw = {"batch_size": 8, "loss": "cce", "optimizer": "sgd", "learning_rate": 0.05}
    first = fit(model, x, y, epochs=2, **kw)
    counts = {"compiled": 0, "checked": 0, "fresh": 0, "packed": 0, "device_put": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(programs, "compile_for", counted("compiled", programs.compile_for))
    monkeypatch.setattr(data_module, "check_training_data",
                        counted("checked", data_module.check_training_data))
    monkeypatch.setattr(trainer_module.Trainer, "fresh_state",
                        counted("fresh", trainer_module.Trainer.fresh_state))
    monkeypatch.setattr(trainer_module.Packed, "pack",
                        counted("packed", trainer_module.Packed.pack))
    monkeypatch.setattr(jax, "device_put", counted("device_put", jax.device_put))
    again = fit(model, x, y, trainer=first.trainer, epochs=2)
    assert counts == dict.fromkeys(counts, 0), counts
    # the same results as the first call: nothing kept changed what the step computes
    jax.tree.map(np.testing.assert_array_equal, again.params, first.params)
    assert again.history.loss == first.history.loss


def test_repeated_fit_on_host_samples_checks_them_again(monkeypatch):
    """Host (numpy) samples may have changed in place since the last call: each ``fit``
    checks and moves them again (a NaN put in between is found)."""
    model = reshape_mlp()
    x, y = toy_data(16)
    first = fit(model, x, y, epochs=1, batch_size=8, loss="cce")
    x[3, 0] = np.nan
    with pytest.raises(Exception, match="sample 3 holds NaN"):
        fit(model, x, y, trainer=first.trainer, epochs=1)


def test_composed_step_transforms():
    """`compose.training_step` on a toy loss: SGD on packed params gives the by-name
    update (the packed layout is only a layout; 1 ulp: XLA contracts ``w - lr * g`` into a
    fused multiply-add in one program's kernels and not the other's, measured 1.2e-7 of
    1.96); with a dynamic loss scale an
    overflowed batch keeps the params and optimizer state, counts one skipped step and
    halves the scale; a finite one moves them."""
    import optax

    from circle_jax.optim import DynamicLossScale, NoLossScale
    from circle_jax.optim.flat import Packed
    from circle_jax.train.compose import training_step
    from circle_jax.train.state import TrainState

    def loss(params, frozen, batch, squares=None):
        x, y = batch
        out = sum(jnp.sum(v) for v in params.values()) * x[0]
        return jnp.mean((out - y) ** 2), (None, {})

    tx = optax.sgd(0.1)
    step = jax.jit(training_step(loss, lambda: tx, row_squares=frozenset(), range_decay=0.9,
                                 branch=True, test_unscaled=False))
    params = {f"b{i}": jnp.full((3,), 0.1 * i, jnp.float32) for i in range(9)}
    batch = ((jnp.ones((4,)),), jnp.zeros((4,)))

    def state(p, scale):
        return TrainState(p, tx.init(p), scale, jnp.zeros([], jnp.int32))

    by_name, _ = step(state(params, NoLossScale()), {}, batch)
    packed, _ = step(state(Packed.pack(params), NoLossScale()), {}, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-7),
                 packed.params.unpack(), by_name.params)
    assert not np.array_equal(by_name.params["b1"], params["b1"])
    new, m = step(state(params, DynamicLossScale(2.0 ** 4)), {},
                  ((jnp.full((4,), jnp.inf),), jnp.zeros((4,))))
    jax.tree.map(np.testing.assert_array_equal, new.params, params)
    assert int(m.skipped) == 1 and float(new.loss_scale.loss_scale) == 8.0
    assert int(new.step) == 1
    new, m = step(state(params, DynamicLossScale(2.0 ** 4)), {}, batch)
    assert int(m.skipped) == 0  # a power-of-two scale: the unscaled step's gradients
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-7),
                 new.params, by_name.params)
