"""onert 0.1.0's categorical cross-entropy, found from the wheel: on an output produced by a
SOFTMAX it is ``-sum t log max(p, 1e-20)`` of the probabilities; on any other output (logits,
or a SOFTMAX followed by a RESHAPE) it is the softmax cross-entropy of that output taken as
logits. The default (onert) profile follows the rule (`circle_jax.numerics`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from tests.onert_peer import onert_fit


def _mlp(tail: tuple[str, ...], scale: float = 1.5) -> bytes:
    """8 -> 16 (RELU) -> 4, then the ``tail`` operators (SOFTMAX, RESHAPE)."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (1, 8))
    w1 = b.constant("w1", (rng.standard_normal((16, 8)) * 0.5).astype(np.float32))
    b1 = b.constant("b1", np.full(16, 0.1, np.float32))
    w2 = b.constant("w2", (rng.standard_normal((4, 16)) * scale).astype(np.float32))
    b2 = b.constant("b2", np.full(4, 0.2, np.float32))
    h = b.op("FULLY_CONNECTED", [x, w1, b1], {"fused_activation_function": "RELU"})
    y = b.op("FULLY_CONNECTED", [h, w2, b2], {})
    for op in tail:
        if op == "SOFTMAX":
            y = b.op("SOFTMAX", [y], {"beta": 1.0})
        else:
            y = b.op("RESHAPE", [y, b.constant("shape", np.array([1, 4], np.int32))],
                     {"new_shape": [1, 4]})
    b.output(y)
    return b.to_bytes("circle")


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    return x, np.eye(4, dtype=np.float32)[rng.integers(0, 4, 32)]


@pytest.mark.parametrize("tail", [(), ("SOFTMAX",)], ids=["logits", "softmax"])
def test_default_profile_trains_as_onert(tail: tuple[str, ...], tmp_path: Path) -> None:
    """CCE and MSE x SGD and Adam x batch 1 and 16, 3 epochs, lr 0.01: per-epoch losses within
    1e-3 of the wheel's (measured worst 6.7e-5 on logits, MSE, Adam, batch 1; 1.5e-5 on the
    softmax model); with the logits read as probabilities (the rule before) CCE on the logits
    model was off by up to 25."""
    path = tmp_path / "m.circle"
    path.write_bytes(_mlp(tail))
    model = cj.load(path)
    x, y = _data()
    for loss, code in (("cce", 2), ("mse", 1)):
        for opt, ocode in (("sgd", 1), ("adam", 2)):
            for batch in (1, 16):
                want = onert_fit(path, x, y, epochs=3, batch_size=batch, learning_rate=0.01,
                                 loss=code, optimizer=ocode).loss
                got = cj.fit(model, x, y, epochs=3, batch_size=batch, learning_rate=0.01,
                             loss=loss, optimizer=opt).history.loss
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-3,
                                           err_msg=f"{tail} {loss} {opt} {batch}")


@pytest.mark.parametrize("tail,rule", [(("SOFTMAX",), "clip"), (("SOFTMAX", "RESHAPE"), "logits"),
                                       ((), "logits")])
def test_onert_cce_rule_on_a_saturated_output(tail: tuple[str, ...], rule: str,
                                              tmp_path: Path) -> None:
    """With logits ~ 100 apart, a SOFTMAX output's per-sample CCE is ``-log(1e-20)`` = 46.05
    where the target's probability underflows (the logits' value is far larger); a SOFTMAX
    behind a RESHAPE is read as logits again (softmax of the probabilities, < 2). The
    per-step losses of onert and of the profile's loss agree within 1e-4 relative."""
    path = tmp_path / "m.circle"
    path.write_bytes(_mlp(tail, scale=40.0))
    x, y = _data()
    steps = onert_fit(path, x, y, epochs=1, batch_size=1, learning_rate=1e-9,
                      loss=2).step_loss[0]
    model = cj.load(path)
    out = np.asarray(model.apply(model.params, x)[0], np.float64)
    if rule == "clip":
        want = -np.sum(y * np.log(np.maximum(out, 1e-20)), -1)
        assert np.isclose(max(steps), -np.log(1e-20), rtol=1e-5)
    else:
        z = out - out.max(-1, keepdims=True)
        want = -np.sum(y * (z - np.log(np.exp(z).sum(-1, keepdims=True))), -1)
    np.testing.assert_allclose(steps, want, rtol=1e-4, atol=1e-5)
    trainer = cj.Trainer(model, batch_size=1, loss="cce")
    got = [trainer.evaluate(model.params, x[i:i + 1], y[i:i + 1])[0] for i in range(4)]
    np.testing.assert_allclose(got, want[:4], rtol=1e-4, atol=1e-5)
