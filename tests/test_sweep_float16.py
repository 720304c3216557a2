"""One float16 training step on every shared model (issue 23): a model dropped into
../shared/models is covered without writing a test.

Each model (``*.tflite``, ``*.circle``) is loaded and takes one step of the float16 policy
(``p=f32,c=f16,o=f32``, the policy's float32 operators) at loss scale 1 on a fixed batch at
the declared batch size: random inputs (fixed seed) of the input dtypes, mean squared error
against zero targets on output 0, SGD. The step must not be skipped (its float16 gradients
are finite at scale 1, the floor a dynamic scale backs off to), and must leave every weight
finite, at least one of them changed (when the model has trainable weights). A model that
cannot take that step is listed in ``REFUSED`` with the one-line reason the library gives
(the test checks that it still refuses, with that reason).
"""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.train import Trainer
from tests.paths import SHARED_MODELS


def shared_model_files() -> list[str]:
    """Every model file of the shared models directory, sorted by name."""
    found = glob.glob(os.path.join(SHARED_MODELS, "*.tflite")) + \
        glob.glob(os.path.join(SHARED_MODELS, "*.circle"))
    return sorted(os.path.basename(p) for p in found)


#: model -> (a regular expression of) the one-line error that refuses its float16 step
REFUSED: dict[str, str] = {
    # a WHILE whose loop variables change shape with a run-time trip count runs eagerly only
    "one_vscode_while_000.circle": "WHILE body changes the shape or dtype of a loop variable",
    # declares input [1, 1] (dynamic [1, -1] audio): its 512-tap STFT needs a resized input
    "oww_melspectrogram.tflite": r"kernel \(512, dilation 1\) is larger than the padded input",
}

POLICY = dict(precision="p=f32,c=f16,o=f32", loss_scale=1.0, loss="mse", optimizer="sgd",
              learning_rate=1e-3, epochs=1)


def _inputs(model: cj.Model, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    xs = []
    for spec in model.inputs:
        shape = tuple(max(int(d), 1) for d in spec.shape)
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.floating):
            xs.append(rng.random(shape).astype(dtype))
        elif dtype == np.bool_:
            xs.append(np.zeros(shape, bool))
        else:  # token ids, indices: small non-negative integers
            xs.append(rng.integers(0, 2, shape).astype(dtype))
    return tuple(xs)


def _step(name: str) -> tuple[dict, dict, object]:
    model = cj.load(os.path.join(SHARED_MODELS, name))
    rng = np.random.default_rng(0)
    x = _inputs(model, rng)
    batch = x[0].shape[0] if x and x[0].ndim else 1
    trainer = Trainer(model, batch_size=batch, **POLICY)
    state, frozen = trainer.init()
    out = jax.eval_shape(model.apply, model.params, *x)[trainer.loss_output]
    y = jnp.zeros(out.shape, jnp.float32)
    new, metrics = jax.jit(trainer.train_step)(state, frozen, (tuple(map(jnp.asarray, x)), y))
    return state.params, new.params, metrics


@pytest.mark.parametrize("name", shared_model_files())
def test_float16_step_leaves_finite_weights(name: str) -> None:
    if name in REFUSED:
        with pytest.raises(cj.CircleJaxError, match=REFUSED[name]):
            _step(name)
        return
    before, after, m = _step(name)
    assert int(m.skipped) == 0, "float16 gradients not finite at loss scale 1"
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in after.values())
    assert not after or any(not np.array_equal(before[k], after[k]) for k in after), \
        "no weight changed"
