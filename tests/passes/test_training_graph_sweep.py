"""Which models of the sweep (`tests.model_zoo.all_models`, and the torch conversions of
tests/data/torch) export their training step of every weight (`export_training_graph`'s
refusals, checked before anything is built): every model exports but those pinned in
``REFUSED``, each refused in one line naming the reason. A model dropped into
../shared/models is covered without writing a test. The exports' training is checked
against ``fit`` in ``tests/passes/test_training_graph.py``.

The step is configured at batch 2, or at the declared batch where the graph does not follow
the batch (`Model.batch_blocker`; 1 for a scalar input), each input of its sample shape
(`sweep_shapes`). About 5 s for the 42 models.
"""

from __future__ import annotations

import glob
import os

import pytest

import circle_jax as cj
from circle_jax.ondevice import exportable, step_config
from circle_jax.passes.training_graph import unsupported
from tests import model_zoo
from tests.paths import REPO_ROOT

TORCH = sorted(f"torch:{os.path.basename(p)}"
               for p in glob.glob(f"{REPO_ROOT}/tests/data/torch/*.tflite"))
OUTSIDE = "a loop whose trip count is not static, or a branch, has no backward"

# What the known models refuse (a substring of the one-line refusal)
REFUSED = {
    "aeq_bmm.tflite": "nothing trains",  # two runtime inputs, no weight
    "one_vscode_while_000.circle": f"WHILE #0 reads the trainable params ['ifm5']: {OUTSIDE}",
}


def model_source(name: str) -> str | bytes:
    """A sweep name's file (``torch:<file>``: tests/data/torch's) or built model."""
    return name.replace("torch:", f"{REPO_ROOT}/tests/data/torch/") \
        if name.startswith("torch:") else model_zoo.source(name)


def sweep_batch(model: cj.Model) -> int:
    """2, or the declared batch where the graph does not follow the batch (1: a scalar)."""
    declared = model.inputs[0].shape
    return 2 if model.batch_blocker is None else (declared[0] if declared else 1)


def sweep_shapes(model: cj.Model, name: str, batch: int) -> list[tuple[int, ...]]:
    """Each input's shape in the sweep's step: ``batch`` samples of `model_zoo.sample_shapes`
    (a model of dynamic input shapes gets its own, `model_zoo.SAMPLE_SHAPES`)."""
    return [(batch, *s) for s in model_zoo.sample_shapes(model, name)]


def _outcome(name: str) -> str:
    """"exports", or the refusal's line."""
    loaded = cj.load(model_source(name))
    model = exportable(loaded)
    batch = sweep_batch(model)
    try:
        config = step_config(model, batch_size=batch, trainable=-1, trainable_of=loaded,
                             input_shapes=sweep_shapes(model, name, batch))
    except cj.CircleJaxError as e:
        return str(e)
    missing = unsupported(model.ir, config)
    return f"no rule: {', '.join(missing)}" if missing else "exports"


@pytest.mark.parametrize("name", model_zoo.all_models() + TORCH)
def test_every_model_exports_its_step_or_is_pinned(name: str) -> None:
    outcome = _outcome(name)
    if name in REFUSED:
        assert REFUSED[name] in outcome and "\n" not in outcome, outcome
    else:
        assert outcome == "exports", outcome
