"""onert's inference session (the wheel's ``onert.infer.session``, no training backend) runs
circle-jax's exported functional training step: each step's new state is fed back as the
next step's inputs, and the per-step losses and the final weights are circle-jax's ``fit``
(1e-5 relative: float32 programs whose operators sum in another order).

onert runs in a child process (as every onert call of circle-jax does): a loader fault is a
failed test, not a crashed test run.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.ondevice import export_training_graph
from tests.paths import REPO_ROOT, shared_model

pytest.importorskip("onert")

# The wheel's own ``onert.infer.session`` wrapper cannot take a scalar input (Adam's step
# count: its set_input_tensorinfo error path raises a NameError), so the child drives the
# native session directly, as the wrapper does.
CHILD = """
import sys, numpy as np
from onert.native.libnnfw_api_pybind import infer, prepare_config
path, data, steps, out = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
feeds = [data[f"feed{i}"] for i in range(int(data["feeds"]))]
state = [data[f"state{i}"] for i in range(int(data["states"]))]
s = infer.nnfw_session(path, "cpu")
s.set_prepare_config(prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
s.prepare()
losses = []
for _ in range(steps):
    held = [np.ascontiguousarray(a) for a in feeds + state]  # onert keeps the pointers
    for i, a in enumerate(held):
        s.set_input(i, a)
    s.run()
    outs = [np.array(s.get_output(i), copy=True) for i in range(s.output_size())]
    losses.append(float(outs[0]))
    state = outs[1:]
np.savez(out, losses=np.array(losses), **{f"state{i}": v for i, v in enumerate(state)})
"""

MODELS = {
    "torch_mlp": ("tests/data/torch/mlp.tflite", "mse"),
    "planestrike": ("tfexamples_planestrike_mlp.tflite", "cce"),
    # convolutions, max pooling and their gradients (no CUMSUM, no TRANSPOSE_CONV: onert's
    # CPU backend has neither for these steps)
    "onert_micro_mnist": ("onert_micro_simple_mnist_model.circle", "cce"),
    "keras_branching_cnn": ("tests/data/keras/branching_cnn.tflite", "cce"),
}

def _onert_run(tmp_path, export, feeds: list[np.ndarray], steps: int
               ) -> subprocess.CompletedProcess:
    model = tmp_path / "step.circle"
    model.write_bytes(export.model)
    state = list(export.state.values())
    np.savez(tmp_path / "in.npz", feeds=len(feeds), states=len(state),
             **{f"feed{i}": v for i, v in enumerate(feeds)},
             **{f"state{i}": np.asarray(v) for i, v in enumerate(state)})
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(tmp_path / "in.npz"),
                           str(steps), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=300)
    return done


def _onert_steps(tmp_path, export, feeds: list[np.ndarray], steps: int
                 ) -> tuple[list[float], dict[str, np.ndarray]]:
    done = _onert_run(tmp_path, export, feeds, steps)
    assert done.returncode == 0, f"onert: rc {done.returncode} {done.stderr[-1500:]}"
    out = np.load(tmp_path / "out.npz")
    return list(out["losses"]), {n: out[f"state{i}"] for i, n in enumerate(export.state)}


def _problem(name: str) -> tuple[cj.Model, np.ndarray, np.ndarray, str]:
    path, loss = MODELS[name]
    model = cj.load(f"{REPO_ROOT}/{path}" if path.startswith("tests/") else shared_model(path))
    rng = np.random.default_rng(2)
    batch = 16
    x = rng.uniform(-1, 1, (batch, *model.inputs[0].shape[1:])).astype(np.float32)
    classes = model.outputs[0].shape[-1]
    y = (np.eye(classes, dtype=np.float32)[rng.integers(0, classes, batch)] if loss == "cce"
         else rng.standard_normal((batch, classes)).astype(np.float32))
    return model, x, y, loss


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "momentum"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onert_inference_trains_the_functional_step_as_fit_does(tmp_path, name: str,
                                                                optimizer: str) -> None:
    model, x, y, loss = _problem(name)
    steps = 20
    config = dict(loss=loss, optimizer=optimizer, learning_rate=0.001, batch_size=len(x))
    export = export_training_graph(model, file_format="circle", **config)
    losses, state = _onert_steps(tmp_path, export, [x, y], steps)
    ref = cj.fit(model, x, y, epochs=steps, **config)
    np.testing.assert_allclose(losses, ref.history.loss, rtol=1e-5)
    for param in model.trainable_params:
        w, w_ref = state[param], np.asarray(ref.params[param])
        assert np.max(np.abs(w - w_ref)) <= 1e-5 * np.max(np.abs(w_ref)), param
    assert losses[-1] < losses[0]
