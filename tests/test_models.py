"""Every shared third-party model loads and matches LiteRT on seeded random inputs.

CIR0 files are rewritten as TFL3 (version 3) by circle-jax's own writer before LiteRT runs
them. Tolerances: float32 through tens of layers accumulates rounding differently in XLA and
LiteRT's reference kernels; outputs are compared with rtol 1e-4 and an atol of 1e-4 times
the output's scale (max |LiteRT output|, at least 1).
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import export_model
from tests.conformance import run_litert
from tests.paths import SHARED_MODELS

MODELS = SHARED_MODELS

# model -> input overrides (dynamic shapes) ; models LiteRT cannot run are listed apart.
INPUT_SHAPES = {"oww_melspectrogram.tflite": [(1, 1760)]}
LITERT_CANNOT_RUN = {
    # WHILE body uses CUSTOM:BatchMatMulV2, which LiteRT's builtin resolver lacks; its
    # output is checked against a numpy loop in tests/ops/test_ops_control.py.
    "one_vscode_while_000.circle",
}


def model_files() -> list[str]:
    names = sorted(f for f in os.listdir(MODELS) if f.endswith((".tflite", ".circle")))
    return [n for n in names if n not in LITERT_CANNOT_RUN]


def random_inputs(model: cj.Model, name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = INPUT_SHAPES.get(name, [s.shape for s in model.inputs])
    feeds = []
    for spec, shape in zip(model.inputs, shapes):
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            feeds.append(rng.integers(0, 100, shape).astype(spec.dtype))
        else:
            feeds.append(rng.uniform(-1, 1, shape).astype(spec.dtype))
    return feeds


@pytest.mark.parametrize("name", model_files())
def test_model_matches_litert(name: str) -> None:
    path = os.path.join(MODELS, name)
    model = cj.load(path)
    feeds = random_inputs(model, name)
    ir = read_model(path)
    tflite = export_model(ir, file_format="tflite") if ir.format == "circle" else ir.source
    want = run_litert(tflite, feeds)
    got = jax.jit(model.apply)(model.params, *feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.max(np.abs(w))), 1.0)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * scale, err_msg=name)
