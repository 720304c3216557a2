"""Every model whose training step exports trains in LiteRT as in circle-jax (slow tier):
LiteRT runs the exported functional step 20 times, each step's state fed to the next, and
the per-step losses and final weights equal circle-jax's 20 steps, SGD and Adam. A model
dropped into ../shared/models is covered without writing a test.

The problem (`problem`): the sweep's batch (`sweep_batch`), the sweep's seeded inputs
(`model_zoo.inputs`), CCE on a SOFTMAX's output with one-hot targets, else MSE to the
model's own output plus normal noise of a tenth of its root mean square (the loss then
is no difference of nearly equal numbers). The learning rate is set so that
the first step's first-order decrease is 1% of the loss (SGD: ``0.01 L / |g|^2``, Adam:
``0.01 L / |g|_1``, ``g`` the first gradient), quartered until circle-jax's 20 losses
never rise: a step size of the same proportion on every model, small enough that training
descends rather than oscillates, so that the training itself does not amplify float32's
rounding. circle-jax's steps are ``fit``'s, or
`make_train_step`'s jitted where the output does not follow the inputs' batch (one call
is one sample: ``fit`` cannot slice the targets by the inputs' samples).

The contract: losses 1e-5 relative, each weight within 1e-5 of its largest element (two
float32 summation orders over 20 steps); each exception in ``DRIFT`` with its measured
bound and why.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.ondevice import export_training_graph
from circle_jax.train import make_train_step
from tests import model_zoo
from tests.passes.test_training_graph import _steps
from tests.passes.test_training_graph_sweep import (
    REFUSED,
    SKIPPED,
    TORCH,
    model_source,
    sweep_batch,
)

STEPS = 20
BACKTRACKS = 8
TOLERANCE = 1e-5
# (model, optimizer): (losses' bound, weights' bound) measured, and why
DRIFT: dict[tuple[str, str], tuple[float, float]] = {}


class Problem(NamedTuple):
    model: cj.Model
    inputs: list[np.ndarray]
    targets: np.ndarray
    config: dict
    params: dict[str, np.ndarray]  # circle-jax's after the steps
    losses: list[float]  # circle-jax's per step


def problem(name: str, optimizer: str, steps: int = STEPS) -> Problem:
    """The model, its inputs, targets, step configuration and circle-jax's ``steps`` steps
    (see the module docstring)."""
    model = cj.load(model_source(name))
    batch = sweep_batch(model)
    xs = model_zoo.inputs(model, name, None if model.batch_blocker is not None else batch)
    rng = np.random.default_rng(1)
    out = np.asarray(model.apply(model.params, *xs)[0], np.float32)
    if model.ir.subgraphs[0].operators[-1].type == "SOFTMAX" and out.shape[-1] > 1:
        y = np.eye(out.shape[-1], dtype=np.float32)[rng.integers(0, out.shape[-1],
                                                                 out.shape[:-1])]
        loss = "cce"
    else:
        noise = 0.1 * (np.sqrt(np.mean(out ** 2)) + 1e-3)
        y = (out + noise * rng.standard_normal(out.shape)).astype(np.float32)
        loss = "mse"
    config = dict(loss=loss, optimizer="sgd", learning_rate=1.0, batch_size=batch)
    params, first = _circle_jax_steps(model, xs, y, 1, config, fit_can_slice=False)
    g = [np.asarray(model.params[k], np.float64) - np.asarray(params[k], np.float64)
         for k in params]
    norm = sum(float(np.sum(v ** 2)) for v in g) if optimizer == "sgd" else \
        sum(float(np.sum(np.abs(v))) for v in g)
    config.update(optimizer=optimizer, learning_rate=0.01 * first[0] / max(norm, 1e-30))
    for _ in range(BACKTRACKS):
        try:
            params, losses = _circle_jax_steps(model, xs, y, steps, config)
            if all(b <= a * (1 + 1e-6) for a, b in zip(losses, losses[1:])):
                break
        except cj.TrainingError:  # the loss overflowed
            pass
        config["learning_rate"] /= 4
    else:
        raise AssertionError(f"{name}: no learning rate descends for {steps} steps")
    return Problem(model, xs, y, config, params, losses)


def _circle_jax_steps(model: cj.Model, xs: list[np.ndarray], y: np.ndarray, steps: int,
                      config: dict, fit_can_slice: bool = True
                      ) -> tuple[dict[str, np.ndarray], list[float]]:
    """circle-jax's ``steps`` steps on the one batch: the trained params and the losses."""
    if fit_can_slice and np.shape(y)[:1] == xs[0].shape[:1]:
        ref = cj.fit(model, xs if len(xs) > 1 else xs[0], y, epochs=steps, **config)
        return {k: np.asarray(ref.params[k]) for k in model.trainable_params}, \
            list(ref.history.loss)
    init, step, _ = make_train_step(model, **config)
    state, losses, step = init(), [], jax.jit(step)
    for _ in range(steps):
        state, metrics = step(state, (tuple(xs), y))
        losses.append(float(metrics.loss))
    return {k: np.asarray(v) for k, v in state.train.params.items()}, losses


def agreement(name: str, optimizer: str, steps: int = STEPS) -> tuple[float, float, str]:
    """(the losses' largest relative difference, the worst weight's, that weight)."""
    model, xs, y, config, params, theirs = problem(name, optimizer, steps)
    losses, state = _steps(export_training_graph(model, **config), [*xs, y], steps)
    theirs = np.asarray(theirs)
    dl = float(np.max(np.abs(np.asarray(losses) - theirs) / np.maximum(np.abs(theirs), 1e-30)))
    worst, dw = "", 0.0
    for param, w_ref in params.items():
        d = float(np.max(np.abs(state[param] - w_ref)) / max(np.max(np.abs(w_ref)), 1e-30))
        if d >= dw:
            worst, dw = param, d
    return dl, dw, worst


EXPORTING = [n for n in model_zoo.all_models() + TORCH if n not in REFUSED and n not in SKIPPED]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", EXPORTING)
def test_litert_trains_every_exported_step_as_circle_jax_does(name: str, optimizer: str) -> None:
    dl, dw, worst = agreement(name, optimizer)
    bound_l, bound_w = DRIFT.get((name, optimizer), (TOLERANCE, TOLERANCE))
    assert dl <= bound_l, f"losses {dl:.1e} apart"
    assert dw <= bound_w, f"{worst} {dw:.1e} apart"
