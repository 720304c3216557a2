"""Epochs that precompute their steps' data-only work (``circle_jax.train.hoisting``).

The split epoch must train exactly as the plain one: the same operations run, only earlier,
so losses, metrics and trained weights are compared bit for bit, across configurations
that change what the data-only part contains (frozen prefixes, in-step micro-batches, loss
scaling with half-precision compute, sparse labels). Then: what is hoisted for the bundled
example, chunked precomputation, and the size limits that turn hoisting off.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
import circle_jax.train.hoisting as hoisting
from circle_jax.examples import branching_cnn, digits
from circle_jax.train import Trainer, batched


def _epochs(trainer_kwargs: dict, x: np.ndarray, y: np.ndarray, hoist: bool,
            epochs: int = 2) -> tuple[list, dict]:
    model = cj.load(branching_cnn(channels=4).to_bytes())
    trainer = Trainer(model, **trainer_kwargs)
    trainer.hoist = hoist
    state, frozen = trainer.init()
    metrics = []
    for e in range(epochs):
        state, m = trainer.run_epoch(state, frozen, (jnp.asarray(x),), jnp.asarray(y), e)
        metrics.append(jax.tree.map(np.asarray, m))
    return metrics, {k: np.asarray(v) for k, v in state.params.items()}


def _data(n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    x, y = digits()
    return x[:n], y[:n]


CONFIGS = {
    "sgd batch 1": dict(loss="cce", optimizer="sgd", learning_rate=0.05, batch_size=1),
    "adam batch 8, last 2 ops": dict(loss="cce", optimizer="adam", learning_rate=0.01,
                                     batch_size=8, trainable=2),
    "in-step micro-batches": dict(loss="mse", optimizer="sgd", learning_rate=0.05,
                                  batch_size=8, accumulate=2, accumulate_mode="in_step"),
    "f16 compute, dynamic scaling": dict(loss="cce", optimizer="sgd", learning_rate=0.05,
                                         batch_size=4, precision="p=f32,c=f16,o=f32",
                                         loss_scale="dynamic"),
    "sparse labels": dict(loss="sparse_cce", optimizer="sgd", learning_rate=0.05,
                          batch_size=4),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_split_epochs_train_bit_identically(name: str) -> None:
    x, y = _data()
    if name == "sparse labels":
        y = np.argmax(y, axis=-1).astype(np.int32)
    plain = _epochs(CONFIGS[name], x, y, hoist=False)
    split = _epochs(CONFIGS[name], x, y, hoist=True)
    for a, b in zip(plain[0], split[0], strict=True):
        jax.tree.map(np.testing.assert_array_equal, a, b)
    jax.tree.map(np.testing.assert_array_equal, plain[1], split[1])


def _split_example(batch: int, steps: int) -> tuple[hoisting.SplitStep | None, tuple, Trainer]:
    trainer = Trainer(cj.load(branching_cnn(channels=4).to_bytes()), loss="cce",
                      optimizer="sgd", learning_rate=0.05, batch_size=batch)
    state, frozen = trainer.init()
    x, y = _data(batch * steps)
    xs, ys = batched((jnp.asarray(x),), jnp.asarray(y), batch, steps)
    first = jax.tree.map(lambda a: a[0], (xs, ys))
    return hoisting.split_step(trainer.train_step, state, frozen, first, steps), \
        (state, frozen, xs, ys), trainer


def test_the_example_hoists_its_input_im2col(monkeypatch) -> None:
    """The first convolution's im2col ([pixels, 9 taps x 1 channel]) depends on the batch
    alone; the weights' values do not appear among the precomputed ones. (As im2col: the
    few-channel convolution's primitive, `circle_jax.lowering.few_channels`, reads the
    input itself, which leaves nothing of it to hoist.)"""
    from circle_jax.lowering import conv

    monkeypatch.setattr(conv, "applies", lambda *a: False)
    jax.clear_caches()  # convolutions traced before took the primitive
    try:
        split, (state, frozen, xs, ys), _ = _split_example(batch=2, steps=3)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert split is not None
    values = split.precompute(frozen, (xs, ys))
    shapes = [v.shape for v in values]
    assert (3, 2 * 64, 9) in shapes, shapes
    assert all(v.shape[0] == 3 for v in values)
    weights = {tuple(v.shape) for v in jax.tree.leaves(state.params)}
    assert not weights & {s[1:] for s in shapes}, shapes


def test_chunked_precompute_equals_one_vectorized_pass(monkeypatch) -> None:
    """Precomputation in chunks (with a remainder), or step by step, gives the values of
    one vectorized pass."""
    split, (state, frozen, xs, ys), _ = _split_example(batch=2, steps=7)
    whole = split.precompute(frozen, (xs, ys))
    monkeypatch.setattr(hoisting, "CHUNK_BYTES", 1)
    chunked, *_ = _split_example(batch=2, steps=7)
    assert chunked.chunk == 1
    for chunk in (1, 3):  # step by step; 2 chunks of 3 + 1 left
        part = hoisting.SplitStep(**{**chunked.__dict__, "chunk": chunk})
        for a, b in zip(whole, part.precompute(frozen, (xs, ys)), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("limit", ["MAX_STEP_BYTES", "MAX_HOISTED_BYTES"])
def test_no_split_above_the_size_limits(monkeypatch, limit: str) -> None:
    """Above either limit the epoch runs the plain step (and still trains)."""
    monkeypatch.setattr(hoisting, limit, 1)
    split, (state, frozen, xs, ys), trainer = _split_example(batch=2, steps=3)
    assert split is None
    new, m = jax.jit(trainer._epoch_impl)(state, frozen, xs, ys)
    assert np.all(np.isfinite(np.asarray(m.loss)))


def test_invariant_times_batch_is_precomputed_per_step() -> None:
    """In ``c + i * b`` the product depends on the invariant and the batch only: it is the
    precomputed value, one per step; a step that never reads its batch is not split."""
    b = jnp.arange(12.0).reshape(4, 3)
    split = hoisting.split_step(lambda c, i, b: (c + i * b, c), jnp.ones(3), jnp.full(3, 2.0),
                                b[0], 4)
    (values,) = split.precompute(jnp.full(3, 2.0), b)
    np.testing.assert_array_equal(values, 2.0 * b)
    carry, out = split.step(jnp.ones(3), jnp.full(3, 2.0), (values[1],))
    np.testing.assert_array_equal(carry, 1.0 + 2.0 * b[1])
    assert hoisting.split_step(lambda c, i, b: (c * i, c), jnp.ones(3), jnp.ones(3),
                               jnp.ones(3), 4) is None


def test_without_partial_evaluation_epochs_run_the_plain_step(monkeypatch) -> None:
    """A JAX without the internal partial evaluation trains unsplit, to the same weights."""
    x, y = _data(16)
    split = _epochs(CONFIGS["sgd batch 1"], x, y, hoist=True, epochs=1)
    monkeypatch.setattr(hoisting, "partial_eval_jaxpr_nounits", None)
    assert _split_example(batch=2, steps=3)[0] is None
    plain = _epochs(CONFIGS["sgd batch 1"], x, y, hoist=True, epochs=1)
    jax.tree.map(np.testing.assert_array_equal, split[1], plain[1])


DENSE = [name for name, kw in CONFIGS.items() if kw["loss"] != "sparse_cce"]


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("source", ["example", "keras branching cnn"])
def test_a_dense_loss_precomputes_at_least_its_targets(monkeypatch, name: str,
                                                       source: str) -> None:
    """The premise of ``split_step``'s ``needed``: with a dense loss the state part reads
    every target, so the precomputed values of a step hold at least the targets' bytes, and
    targets over the limits rule the split out, as the full analysis would. Checked on the
    bundled example and on a model TF's converter wrote, for every dense configuration."""
    model = cj.load(branching_cnn(channels=4).to_bytes()) if source == "example" else \
        cj.load("tests/data/keras/branching_cnn.tflite")
    monkeypatch.setattr(hoisting, "MAX_STEP_BYTES", 1 << 40)
    monkeypatch.setattr(hoisting, "MAX_HOISTED_BYTES", 1 << 40)
    trainer = Trainer(model, **CONFIGS[name])
    state, frozen = trainer.init()
    b, k = trainer.config.batch_size, model.outputs[0].shape[-1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, *model.inputs[0].shape[1:])).astype(np.float32)
    y = jnp.asarray(np.eye(k, dtype=np.float32)[rng.integers(0, k, b)])
    batch = ((jnp.asarray(x),), y)
    split = hoisting.split_step(trainer.train_step, state, frozen, batch, 1)
    assert split is not None
    values = jax.jit(split.precompute)(frozen, jax.tree.map(lambda a: a[None], batch))
    assert sum(v[0].nbytes for v in values) >= y.nbytes

    monkeypatch.setattr(hoisting, "MAX_STEP_BYTES", y.nbytes - 1)
    assert hoisting.split_step(trainer.train_step, state, frozen, batch, 1) is None
    monkeypatch.setattr(jax, "make_jaxpr", None)  # decided without tracing the step
    assert hoisting.split_step(trainer.train_step, state, frozen, batch, 1, needed=y) is None
