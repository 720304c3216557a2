"""Every model whose training step exports: LiteRT's 20 steps of the export against ``fit``'s
20 steps, SGD and Adam (a study, not a test: the slow tier checks the contract on each model,
`tests/passes/test_training_graph_sweep.py`).

    python benchmarks/training_graph_agreement.py [--steps 20] [--only TEXT]

Per model and optimizer: the largest relative difference of the per-step losses, and of the
final weights (each weight's largest difference over its largest element, the worst weight).
Batch 2 (or the declared batch where the graph does not follow it), inputs uniform in
[-1, 1) (integer inputs: ids in [0, 5)); CCE on a SOFTMAX's output with one-hot targets,
else MSE to the model's own output plus noise of a tenth of its spread; learning rate 1e-3
over the output's mean square (at least 1).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import circle_jax as cj  # noqa: E402
from circle_jax.ondevice import export_training_graph  # noqa: E402
from tests import model_zoo  # noqa: E402
from tests.passes.test_training_graph import _steps  # noqa: E402
from tests.passes.test_training_graph_sweep import REFUSED, SKIPPED, TORCH, model_source  # noqa: E402


def problem(name: str) -> tuple[cj.Model, np.ndarray, np.ndarray, dict]:
    """The model, its inputs and targets, and the configuration (see the module docstring)."""
    model = cj.load(model_source(name))
    declared = model.inputs[0].shape
    batch = 2 if model.batch_blocker is None else (declared[0] if declared else 1)
    rng = np.random.default_rng(0)
    spec = model.inputs[0]
    shape = (batch, *spec.shape[1:])
    x = (rng.uniform(-1, 1, shape).astype(np.float32)
         if np.issubdtype(np.dtype(spec.dtype), np.floating)
         else rng.integers(0, 5, shape).astype(spec.dtype))
    out = np.asarray(model.apply(model.params, x)[0], np.float32)
    last = model.ir.subgraphs[0].operators[-1].type
    if last == "SOFTMAX" and out.shape[-1] > 1:
        y = np.eye(out.shape[-1], dtype=np.float32)[rng.integers(0, out.shape[-1],
                                                                 out.shape[:-1])]
        loss, lr = "cce", 1e-3
    else:
        y = (out + 0.1 * (out.std() + 1e-3) * rng.standard_normal(out.shape)).astype(np.float32)
        loss, lr = "mse", 1e-3 / max(1.0, float(np.mean(out ** 2)))
    return model, x, y, dict(loss=loss, learning_rate=lr, batch_size=batch)


def agreement(name: str, optimizer: str, steps: int) -> tuple[float, float, str]:
    """(losses' largest relative difference, the worst weight's, that weight)."""
    model, x, y, config = problem(name)
    config["optimizer"] = optimizer
    losses, state = _steps(export_training_graph(model, **config), [x, y], steps)
    ref = cj.fit(model, x, y, epochs=steps, **config)
    theirs = np.asarray(ref.history.loss)
    dl = float(np.max(np.abs(np.asarray(losses) - theirs) / np.maximum(np.abs(theirs), 1e-30)))
    worst, dw = "", 0.0
    for param in model.trainable_params:
        w_ref = np.asarray(ref.params[param])
        d = float(np.max(np.abs(state[param] - w_ref)) / max(np.max(np.abs(w_ref)), 1e-30))
        if d >= dw:
            worst, dw = param, d
    return dl, dw, worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--only", default="")
    args = p.parse_args()
    print("| model | optimizer | losses | weights | worst weight |")
    print("|---|---|---:|---:|---|")
    for name in model_zoo.all_models() + TORCH:
        if name in REFUSED or name in SKIPPED or args.only not in name:
            continue
        for optimizer in ("sgd", "adam"):
            try:
                dl, dw, worst = agreement(name, optimizer, args.steps)
            except cj.CircleJaxError as e:  # this study's data does not fit the model
                print(f"| {name} | {optimizer} | not run: {str(e)[:120]} | | |", flush=True)
                continue
            print(f"| {name} | {optimizer} | {dl:.1e} | {dw:.1e} | {worst} |", flush=True)


if __name__ == "__main__":
    main()
