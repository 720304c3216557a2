"""inline_composites: each STABLEHLO_COMPOSITE of subgraph 0 as its decomposition's
operators, on the real composite file (litert-torch's scaled dot-product attention)."""

from __future__ import annotations

import numpy as np

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import write_model
from circle_jax.passes import keep_reachable
from circle_jax.passes.composite import COMPOSITE, inline_composites
from tests.conformance import ATOL, RTOL, run_litert
from tests.paths import shared_model


def test_the_inlined_attention_computes_what_the_composite_does() -> None:
    """One subgraph left, no composite, its 12 decomposition operators in the composite's
    place; circle-jax's forward of it equals the composite's bit for bit (the same
    operators), and LiteRT's run of the written file equals circle-jax's."""
    path = shared_model("aeq_sdpa_composite.tflite")
    model = read_model(path)
    flat = keep_reachable(inline_composites(model))
    types = [op.type for op in flat.main.operators]
    assert len(flat.subgraphs) == 1 and COMPOSITE not in types
    assert len(types) == len(model.main.operators) - 1 + len(model.subgraphs[1].operators)
    assert [op.index for op in flat.main.operators] == list(range(len(types)))
    assert flat.passes[-2].name == "inline_composites" and flat.passes[-2].changes
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 128)).astype(np.float32)
    original, inlined = cj.load(path), cj.Model(flat)
    mine = np.asarray(inlined(x)[0])
    np.testing.assert_array_equal(mine, np.asarray(original(x)[0]))
    (theirs,) = run_litert(write_model(flat, "tflite"), [x])
    np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL)


def test_a_model_without_composites_is_unchanged() -> None:
    model = read_model(shared_model("tfexamples_planestrike_mlp.tflite"))
    flat = inline_composites(model)
    assert flat.subgraphs == model.subgraphs and flat.passes[-1].changes == {}
