"""float16 training on real models (issue 23, item 2): the precision policy's float32
operators, float32 weight gradients, the first non-finite tensor, and the warning when the
loss scale is at its floor.

Random data (uniform inputs, one-hot random labels), Adam, CCE, as the issue's measurement.
The full study (ResNet-8 and MobileNet 0.25/128, 200 samples, 3 epochs, skip and retry) is
benchmarks/bench_float16.py, its numbers in benchmarks/README.md; here ResNet-8 on fewer
samples, so that the file runs in CI.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.optim import DynamicLossScale, Policy
from circle_jax.optim.precision import float32_weight_grads
from circle_jax.train import fit
from tests.paths import shared_model

RESNET = "mlperftiny_resnet8_cifar10_float.tflite"
EXAMPLE = "example"  # the bundled branching CNN
COMMON = dict(loss="cce", optimizer="adam", learning_rate=1e-3)
FLOAT16 = "p=f32,c=f16,o=f32"
ALL_HALF = Policy(compute_dtype="f16", float32_ops=())  # every operator in float16


@functools.cache
def model(name: str) -> cj.Model:
    if name == EXAMPLE:
        return cj.load(branching_cnn().to_bytes("circle"))
    return cj.load(shared_model(name))


def data(m: cj.Model, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((n, *m.inputs[0].shape[1:]), np.float32)
    k = m.outputs[0].shape[-1]
    return x, np.eye(k, dtype=np.float32)[rng.integers(0, k, n)]


def test_policy_float32_operators() -> None:
    assert "SOFTMAX" in Policy(compute_dtype="f16").float32_ops
    assert Policy(compute_dtype="bf16", float32_ops={"MEAN"}).float32_ops == {"MEAN"}
    assert Policy().float32_ops == frozenset()  # float32 compute: nothing to widen
    assert str(ALL_HALF) == "p=f32,c=f16,g=f32,o=f32 (every operator in half)"
    with pytest.raises(ValueError, match="float32_ops"):
        Policy(compute_dtype="f16", float32_ops="SOFTMAX")


def test_float32_operator_keeps_model_output_float32() -> None:
    """The SOFTMAX output reaches the loss in float32; the rest of the model stays half."""
    m = model(EXAMPLE)
    x, _ = data(m, 2)
    half = Policy(compute_dtype="f16")
    params, x16 = half.cast_to_compute(m.params), x.astype(np.float16)
    (out,) = jax.jit(m.lowered(float32_ops=half.float32_ops))(params, x16)
    assert out.dtype == np.float32
    assert np.min(out) > 0  # no probability underflows to zero
    assert jax.eval_shape(m.apply, params, x16)[0].dtype == np.float16


def test_float32_weight_gradients() -> None:
    """With float32 weights into a float16 forward (``half_weights``), the weights'
    gradients are computed in float32. The bundled example, 32 digits, loss scale 2**17:
    its largest weight gradient (0.65 at scale 1, conv2's filter) overflows float16 when
    the weights are cast to float16 before the forward, and is finite in float32 with
    ``half_weights``; where both are finite they agree to 1% of the largest."""
    assert float32_weight_grads(Policy(compute_dtype="f16"))
    assert not float32_weight_grads(Policy(compute_dtype="f16", grad_dtype="f16"))
    assert not float32_weight_grads(Policy())
    m = model(EXAMPLE)
    x, y = (a[:32] for a in digits())
    half = Policy(compute_dtype="f16")

    def grads(lowered: Any, params: dict) -> dict:
        def loss(p: dict) -> jax.Array:
            (out,) = lowered(p, x.astype(np.float16))
            return -jnp.sum(y * jnp.log(out)) / 32 * 2.0**17
        return jax.device_get(jax.jit(jax.grad(loss))(params))

    wide = grads(m.lowered(float32_ops=half.float32_ops, half_weights="float16"), m.params)
    narrow = grads(m.lowered(float32_ops=half.float32_ops), half.cast_to_compute(m.params))
    assert {v.dtype for v in wide.values()} == {np.dtype(np.float32)}
    assert all(np.isfinite(v).all() for v in wide.values())
    assert not np.isfinite(narrow["conv2/filter"]).all()
    for k, v in wide.items():
        ok = np.isfinite(narrow[k])
        np.testing.assert_allclose(narrow[k][ok], v[ok], atol=0.01 * np.abs(v).max(),
                                   err_msg=k)


@pytest.mark.slow  # 3 epochs in float32 and in float16 (a measurement as much as a test)
def test_float16_tracks_float32() -> None:
    """ResNet-8, batch 16, 64 samples, 3 epochs, the default dynamic scale skipping
    overflowed steps (Keras, PyTorch): no step skipped at the initial scale 2**15, and every
    epoch's loss within 15% of float32's. Measured: 0 of 12 skipped, -1.6%, -10.0%, -9.7%
    (on 4 batches of random labels the two runs' trajectories part; with 200 samples the
    gap is at most 3.3%, benchmarks/README.md). With float16 weight gradients the first
    5 steps overflowed (the scale backed off to 1024), which the first assertion catches;
    every operator in float16 diverged (+43% to +147% on 200 samples)."""
    m = model(RESNET)
    x, y = data(m, 64)
    run = dict(batch_size=16, epochs=3, **COMMON)
    base = fit(m, x, y, **run).history
    with warnings.catch_warnings():
        warnings.simplefilter("error", cj.LossScaleWarning)
        half = fit(m, x, y, precision=FLOAT16, loss_scale="dynamic", **run).history
    assert half.skipped == [0, 0, 0] and half.overflow is None
    assert half.loss_scale[-1] == 2.0**15
    np.testing.assert_allclose(half.loss, base.loss, rtol=0.15)
    assert half.loss[-1] < half.loss[0]


def test_floor_warning_names_the_first_non_finite_tensor() -> None:
    """Every operator in float16 (the behaviour before issue 23), the bundled example with
    a dynamic scale whose floor is 2**20: there the SOFTMAX output's float16 gradient
    (-t/(N p) times the scale) overflows, so after the first step backs off to the floor
    every step is skipped; fit warns once, naming that tensor."""
    m = model(EXAMPLE)
    x, y = (a[:64] for a in digits())
    with pytest.warns(cj.LossScaleWarning) as caught:
        h = fit(m, x, y, batch_size=16, precision=ALL_HALF, epochs=1,
                loss_scale=DynamicLossScale(2.0**21, min_scale=2.0**20), **COMMON).history
    assert len(caught) == 1
    assert h.loss_scale[-1] == 2.0**20 and h.skipped == h.steps == [4]
    assert "SOFTMAX) is the first non-finite value" in h.overflow
    assert h.overflow.startswith("epoch ")
    assert f"loss scale at its floor ({2.0**20:g})" in h.overflow
