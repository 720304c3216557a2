"""Every model the tests know, for sweeps: each file in ../shared/models (*.tflite, *.circle,
found by globbing, so a model dropped there is swept without writing a test), the committed
Keras conversions (tests/data/keras/*.tflite), the bundled example and the builder-made toy
models of tests/toy_models.py.

``all_models()`` names them (pytest ids); ``load(name)`` loads one once per process (a load
refusal is returned, not raised); ``inputs(model, name, n)`` makes seeded random inputs of
``n`` samples, ``output_shapes(model, name)`` the outputs' per-sample shapes;
``LITERT_CANNOT_RUN`` and ``SAMPLE_SHAPES`` are the per-model special cases;
``is_large(name)`` sorts a model into the slow tier of the costliest sweeps.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable

import jax
import numpy as np

import circle_jax as cj
from circle_jax.examples import branching_cnn
from circle_jax.formats.reader import read_model
from tests import toy_models
from tests.paths import KERAS_DATA, SHARED_MODELS, shared_model_names

# Models LiteRT cannot run: the WHILE body uses CUSTOM:BatchMatMulV2, which LiteRT's builtin
# resolver lacks (its output is checked against a numpy loop in tests/ops/test_ops_control.py).
LITERT_CANNOT_RUN = frozenset({"one_vscode_while_000.circle"})

# Per-sample input shapes of models whose declared shapes are placeholders of dynamic ones
# (oww_melspectrogram declares [1, 1]; its signature is [1, -1] and it needs >= 512 samples).
SAMPLE_SHAPES = {"oww_melspectrogram.tflite": [(1760,)]}

_BUILT: dict[str, Callable[[], bytes]] = {
    "example:branching_cnn": lambda: branching_cnn().to_bytes("circle"),
    "toy:mlp": lambda: toy_models.mlp().to_bytes("circle"),
    "toy:cnn": lambda: toy_models.cnn().to_bytes("circle"),
    "toy:reshape_mlp": lambda: toy_models.reshape_mlp().export(),
}


def shared_files() -> list[str]:
    """The model files of ../shared/models, sorted (``[MISSING]`` without the folder:
    `tests.paths.shared_model_names`)."""
    return shared_model_names()


def all_models() -> list[str]:
    """Every sweepable model's name: shared files, ``keras:<file>``, the built ones."""
    keras = sorted(f"keras:{os.path.basename(p)}"
                   for p in glob.glob(os.path.join(KERAS_DATA, "*.tflite")))
    return [*shared_files(), *keras, *_BUILT]


# A model of this many operators or more is large: its float16 epoch compiles for 10-50 s
# on a 2-core machine (benchmarks/README.md, "The test suite's time").
LARGE_OPERATORS = 30


def is_large(name: str) -> bool:
    """Whether the model has at least ``LARGE_OPERATORS`` operators (all subgraphs), read
    from its file: the sweeps that compile its training step run in the slow tier."""
    try:
        ir = read_model(file_bytes(name))
    except (cj.CircleJaxError, FileNotFoundError):  # refused, or the shared models missing
        return False
    return sum(len(g.operators) for g in ir.subgraphs) >= LARGE_OPERATORS


def source(name: str) -> str | bytes:
    """A path (files) or the model's bytes (built models)."""
    if name in _BUILT:
        return _BUILT[name]()
    if name.startswith("keras:"):
        return os.path.join(KERAS_DATA, name.removeprefix("keras:"))
    return os.path.join(SHARED_MODELS, name)


def file_bytes(name: str) -> bytes:
    src = source(name)
    if isinstance(src, bytes):
        return src
    with open(src, "rb") as f:
        return f.read()


@functools.cache
def load(name: str, lowering: str | None = None) -> cj.Model | cj.CircleJaxError:
    """The loaded model (cached per process and lowering), or the one-line error refusing
    it."""
    try:
        return cj.load(source(name), lowering=lowering)
    except cj.CircleJaxError as e:
        return e


def sample_shapes(model: cj.Model, name: str) -> list[tuple[int, ...]]:
    """Each input's per-sample shape (the declared one without dimension 0)."""
    return SAMPLE_SHAPES.get(name, [tuple(s.shape[1:]) for s in model.inputs])


def output_shapes(model: cj.Model, name: str) -> list[tuple[int, ...]]:
    """Each output's per-sample shape: the declared one, or for a model of `SAMPLE_SHAPES`
    the one a sample of those shapes gives it."""
    if name not in SAMPLE_SHAPES:
        return [tuple(s.shape[1:]) for s in model.outputs]
    outs = jax.eval_shape(model.apply, model.params, *inputs(model, name, 1))
    return [tuple(o.shape[1:]) for o in outs]


def inputs(model: cj.Model, name: str, n: int | None, seed: int = 0) -> list[np.ndarray]:
    """Seeded random inputs of ``n`` samples, or (``n=None``) of the declared shapes:
    floats in [-1, 1), integers in [0, 5)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for spec, shape in zip(model.inputs, sample_shapes(model, name)):
        full = ((1, *shape) if name in SAMPLE_SHAPES else spec.shape) if n is None \
            else (n, *shape)
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            feeds.append(rng.integers(0, 5, full).astype(spec.dtype))
        else:
            feeds.append(rng.uniform(-1, 1, full).astype(spec.dtype))
    return feeds
