"""Mixed precision and loss scaling inside the real training step (issue: composable wrappers)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.optim import DynamicLossScale
from circle_jax.train import Trainer, fit

COMMON = dict(epochs=8, batch_size=32, loss="cce", optimizer="adam", learning_rate=0.01,
              validation_split=0.2)


@functools.lru_cache(maxsize=1)
def example() -> tuple[cj.Model, np.ndarray, np.ndarray]:
    x, y = digits()
    return cj.load(branching_cnn().to_bytes("circle")), x, y


@functools.cache
def accuracy(precision: str | None, loss_scale: str) -> float:
    model, x, y = example()
    r = fit(model, x, y, precision=precision, loss_scale=loss_scale, **COMMON)
    assert all(np.isfinite(r.history.loss))
    return r.history.val_accuracy[-1]


@pytest.mark.parametrize("precision,loss_scale", [("p=f32,c=f16,o=f32", "dynamic"),
                                                  ("mixed_bfloat16", "none")])
def test_half_precision_matches_float32_accuracy(precision: str, loss_scale: str) -> None:
    """Held-out accuracy (last 20% of the digits) within 1 percentage point of float32."""
    base = accuracy(None, "none")
    assert base > 0.95
    assert accuracy(precision, loss_scale) >= base - 0.01


def _batch(n: int = 32) -> tuple[tuple[jax.Array], jax.Array]:
    _, x, y = example()
    return (jnp.asarray(x[:n]),), jnp.asarray(y[:n])


def test_forced_overflow_skips_then_recovers() -> None:
    model, x, y = example()
    trainer = Trainer(model, precision="p=f32,c=f16,o=f32",
                      loss_scale=DynamicLossScale(2.0**40), **COMMON)
    state, frozen = trainer.init()
    step = jax.jit(trainer.train_step)
    new, m = step(state, frozen, _batch())
    assert int(m.skipped) == 1 and int(m.overflows) == 1
    assert float(new.loss_scale.loss_scale) == 2.0**39
    for k in state.params:  # a skipped step changes nothing
        np.testing.assert_array_equal(new.params[k], state.params[k])
    jax.tree.map(np.testing.assert_array_equal, new.opt_state, state.opt_state)
    r = fit(model, x, y, precision="p=f32,c=f16,o=f32",
            loss_scale=DynamicLossScale(2.0**40), **COMMON)
    h = r.history
    # 2**40 halves until the float16 activation gradients fit (measured: 19 skipped, 2**21;
    # the weight gradients are float32)
    assert h.skipped[0] >= 15
    assert h.loss_scale[-1] < 2.0**20 and h.loss[-1] < h.loss[0]
    assert h.val_accuracy[-1] > 0.9


def test_retry_loses_no_batch() -> None:
    model, _, _ = example()
    trainer = Trainer(model, precision="p=f32,c=f16,o=f32", on_overflow="retry",
                      loss_scale=DynamicLossScale(2.0**40), **COMMON)
    state, frozen = trainer.init()
    new, m = jax.jit(trainer.train_step)(state, frozen, _batch())
    assert int(m.skipped) == 0 and int(m.overflows) >= 15
    assert float(new.loss_scale.loss_scale) < 2.0**25
    changed = [k for k in state.params if not np.array_equal(new.params[k], state.params[k])]
    assert changed, "the retried batch must update the weights"


def test_static_power_of_two_scale_is_bit_identical() -> None:
    model, x, y = example()
    cfg = dict(COMMON, epochs=2)
    plain = fit(model, x, y, **cfg).params
    scaled = fit(model, x, y, loss_scale=1024.0, **cfg).params
    for k in plain:
        np.testing.assert_array_equal(np.asarray(plain[k]), np.asarray(scaled[k]))


@pytest.mark.parametrize("policy", ["p=f16,c=f16,g=f32,o=f32", "p=f16,c=f16,g=f16,o=f32"])
def test_half_variables_with_separate_gradient_dtype_train(policy: str) -> None:
    """nntrainer's case: fp16 variables (fp32 masters kept) with fp32 or fp16 gradients."""
    model, x, y = example()
    r = fit(model, x, y, precision=policy, loss_scale="dynamic", **dict(COMMON, epochs=4))
    h = r.history
    assert h.loss[-1] < 0.5 * h.loss[0] and h.val_accuracy[-1] > 0.9
    assert all(v.dtype == jnp.float32 for v in r.state.params.values())  # masters
