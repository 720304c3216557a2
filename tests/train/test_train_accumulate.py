"""Gradient accumulation inside the real training loop equals the big batch."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.train import fit

N = 64


def _run(x64: bool, **cfg: object) -> dict:
    with jax.enable_x64(x64):
        x, y = digits()
        model = cj.load(branching_cnn(channels=4).to_bytes("circle"))
        if x64:
            model.params = {k: v.astype(np.float64) for k, v in model.params.items()}
            x, y = x.astype(np.float64), y.astype(np.float64)
        if x64:
            cfg = {"precision": "float64", **cfg}
        cfg = {"learning_rate": 0.05, **cfg}
        r = fit(model, x[:N], y[:N], epochs=2, loss="cce", **cfg)
        return {k: np.asarray(v) for k, v in r.params.items()}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("mode", ["stream", "in_step"])
@pytest.mark.parametrize("x64,tol", [(False, 1e-6), (True, 1e-12)])
def test_accumulated_equals_big_batch(optimizer: str, mode: str, x64: bool, tol: float) -> None:
    """k=4 micro-batches of 4 give the weights of batches of 16 (sum_over_batch_size)."""
    big = _run(x64, batch_size=16, optimizer=optimizer)
    micro = 4 if mode == "stream" else 16
    acc = _run(x64, batch_size=micro, optimizer=optimizer, accumulate=4, accumulate_mode=mode)
    for k in big:
        np.testing.assert_allclose(acc[k], big[k], rtol=tol, atol=tol, err_msg=k)


def test_sum_reduction_accumulates_sums() -> None:
    """With reduction "sum" the big-batch loss is the sum of micro-batch sums: grads add."""
    big = _run(False, batch_size=16, optimizer="sgd", reduction="sum", learning_rate=0.005)
    acc = _run(False, batch_size=16, optimizer="sgd", reduction="sum", learning_rate=0.005,
               accumulate=4, accumulate_mode="in_step")
    for k in big:
        np.testing.assert_allclose(acc[k], big[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_everything_composes_in_one_step() -> None:
    """Accumulation x loss scaling x trainable subset x optimizer, one jitted step."""
    p = _run(False, batch_size=4, optimizer="adam", accumulate=2, loss_scale="dynamic",
             precision="p=f32,c=f16,o=f32", trainable=2)
    model = cj.load(branching_cnn(channels=4).to_bytes("circle"))
    frozen = {"conv1/filter", "conv1/bias", "conv2/filter", "conv2/bias"}
    for k in frozen:
        np.testing.assert_array_equal(p[k], np.asarray(model.params[k]))
    assert not np.array_equal(p["dense/weights"], np.asarray(model.params["dense/weights"]))
