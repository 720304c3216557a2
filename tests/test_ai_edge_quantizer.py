"""Every ai-edge-quantizer recipe on the tests' float models: the files the quantizer writes
load, and circle-jax's outputs agree with LiteRT's on the same bytes (`tests/aeq_files.py`
makes them at test time).

What "agree" means, per recipe family (measured on the default tier's models):
- ``static_*`` (full integer, int8 or int16 activations): equal (``array_equal``).
- ``weight_only_*`` (int8 / int4 weights read by DEQUANTIZE, float compute): within 1e-5 of
  the output's scale: both compute the dequantized weights exactly (``scale * q`` in
  float32) and differ only in float32 summation order (measured at most 6e-8).
- ``dynamic_wi8/wi4/wi2c`` (hybrid operators): circle-jax computes LiteRT's hybrid kernels
  (`circle_jax.ops.hybrid`, equal to LiteRT operator by operator in
  tests/ops/test_ops_hybrid.py); the float operators around them (softmax, layer norms)
  differ in float32 summation order: within 1e-5 of the output's scale (measured at most
  2.4e-7; it was 6.4e-3 when the hybrid operators computed in float).
- ``dynamic_wi4b32`` (blockwise int4): circle-jax computes LiteRT's blockwise hybrid
  FULLY_CONNECTED (`circle_jax.ops.hybrid`), but LiteRT's kernel drops the fused
  activation (a RELU's negative outputs come back), so the file's meaning and LiteRT part;
  with the fused activations of the blockwise operators set to NONE in a copy, LiteRT and
  circle-jax are equal (``array_equal``: the torch MLP has no float operator besides); the
  test asserts LiteRT's departure too, so a LiteRT that fixes it is noticed.
- :data:`LITERT_FAULTS`: cells where LiteRT's own output is wrong, each pinned by a check
  that fails once LiteRT is fixed.
"""

from __future__ import annotations

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from tests.aeq_files import RECIPES, blockwise_without_activation, quantized
from tests.conformance import run_litert
from tests.paths import KERAS_DATA, TESTS

TORCH_DATA = f"{TESTS}/data/torch"
MODELS = {"keras_branching_cnn": f"{KERAS_DATA}/branching_cnn.tflite",
          "keras_layernorm": f"{KERAS_DATA}/layernorm.tflite",
          "torch_mlp": f"{TORCH_DATA}/mlp.tflite"}
#: Cells the quantizer itself refuses: a blockwise recipe on a layer whose input size does
#: not divide by the block (layernorm's 6-wide Dense).
QUANTIZER_REFUSES = {("keras_layernorm", "dynamic_wi4b32_afp32")}
#: Cells LiteRT computes wrong, each with the check that pins its fault: the int2 hybrid
#: CONV_2D's output holds NaN (circle-jax's is finite); the blockwise FULLY_CONNECTED of 3
#: outputs without a bias returns zeros (the softmax after it then 1/3 everywhere): LiteRT's
#: blockwise kernel leaves out the products of a layer with fewer than 4 outputs
#: (tests/ops/test_ops_hybrid_blockwise.py).
LITERT_FAULTS = {
    ("keras_branching_cnn", "dynamic_wi2c_afp32"): lambda y: bool(np.isnan(y).any()),
    ("keras_branching_cnn", "dynamic_wi4b32_afp32"): lambda y: bool(np.allclose(y, 1 / 3)),
}
TOLERANCE = {"weight_only": 1e-5, "dynamic": 1e-5, "dynamic_blockwise": 0.0}


def _feeds(data: bytes, seed: int = 1) -> list[np.ndarray]:
    """Standard-normal float inputs; integer inputs over their type's whole range."""
    rng = np.random.default_rng(seed)
    main = read_model(data).main
    feeds = []
    for t in (main.tensors[i] for i in main.inputs):
        if t.dtype == "float32":
            feeds.append(rng.standard_normal(t.shape).astype(np.float32))
        else:
            info = np.iinfo(t.dtype)
            feeds.append(rng.integers(info.min, info.max + 1, t.shape).astype(t.dtype))
    return feeds


def _circle_jax(data: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    m = cj.load(data)
    out = m.apply(m.params, *feeds)
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _agree(ours: list[np.ndarray], ref: list[np.ndarray], recipe: str) -> None:
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        if recipe.startswith("static"):
            np.testing.assert_array_equal(a, b)
            continue
        scale = max(1.0, float(np.max(np.abs(b))))
        worst = float(np.max(np.abs(a.astype(np.float64) - b)))
        family = next(f for f in ("weight_only", "dynamic_blockwise", "dynamic")
                      if recipe.startswith(f))
        assert worst <= TOLERANCE[family] * scale, (recipe, worst)


CELLS = [(m, r) for m in MODELS for r in RECIPES if (m, r) not in QUANTIZER_REFUSES]


def agrees_with_litert(data: bytes, model: str, recipe: str) -> None:
    """Assert circle-jax's outputs on ``data`` (a file of ``recipe`` on ``model``, or its
    export) agree with LiteRT's as the module docstring says, the cell's LiteRT fault
    pinned where it has one."""
    feeds = _feeds(data)
    ref = run_litert(data, feeds)
    fault = LITERT_FAULTS.get((model, recipe))
    if fault is not None:
        ours = _circle_jax(data, feeds)
        assert fault(ref[0]), "LiteRT's fault is gone: compare this cell"
        assert np.isfinite(ours[0]).all() and not fault(ours[0])
        return
    if "b32" in recipe:
        data = blockwise_without_activation(data)
        without = run_litert(data, feeds)
        assert all(np.array_equal(a, b) for a, b in zip(ref, without)), \
            "LiteRT's blockwise kernel now applies the fused activation"
        recipe = "dynamic_blockwise"
    _agree(_circle_jax(data, feeds), ref, recipe)


@pytest.mark.parametrize("model, recipe", CELLS)
def test_recipe_output_agrees_with_litert(model: str, recipe: str) -> None:
    agrees_with_litert(quantized(MODELS[model], recipe), model, recipe)


@pytest.mark.parametrize("model, recipe", sorted(QUANTIZER_REFUSES))
def test_the_quantizer_refuses_these_cells(model: str, recipe: str) -> None:
    with pytest.raises(ValueError, match="not divisible"):
        quantized(MODELS[model], recipe)
