"""The pipeline of graph passes `load` runs (`circle_jax.passes.pipeline`): one parse per
load, and every pass's output written as .tflite and .circle computing in LiteRT (and
onert, where onert runs the source) what circle-jax computes on the pass's IR. Each pass
alone: ``test_<its module>.py``.

Tolerances: rtol 1e-5 with an atol of 1e-5 times the output's scale (max |LiteRT output|,
at least 1): float32 kernels of XLA and LiteRT sum in different orders; a wrong weight, bias
or operator moves outputs by far more.
"""

from __future__ import annotations

import os
from collections import Counter
from functools import partial
from typing import Any

import flatbuffers
import jax
import numpy as np
import pytest
from circle_schema.v0_10 import circle as schema

import circle_jax as cj
from circle_jax import passes
from circle_jax.formats.reader import read_model, unpack
from circle_jax.formats.writer import write_model
from circle_jax.model import Model
from tests.conformance import run_litert
from tests.formats.test_writer import differences
from tests.paths import KERAS_DATA, shared_model

TRANSFORMER = "aeq_toy_transformer_kv_cache_2sig.tflite"
MNIST_CIRCLE = "onert_micro_simple_mnist_model.circle"  # two FULLY_CONNECTED without bias
MELSPEC = "oww_melspectrogram.tflite"  # one convolution weight read by two operators
BRANCHING = os.path.join(KERAS_DATA, "branching_cnn.tflite")  # a bias read by three convs


def _feeds(model: Model) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for spec in model.inputs:
        shape = spec.shape
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            out.append(rng.integers(0, 8, shape).astype(spec.dtype))
        else:
            out.append(rng.uniform(-1, 1, shape).astype(spec.dtype))
    return out


def _assert_same(got: Any, want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w))), 1.0)
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5 * scale)


def _count_parses_and_writes(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count object-API parses, raw root reads and FlatBuffer ``Finish`` calls."""
    counts: Counter = Counter()

    def counted(owner: Any, name: str, key: str, cls_method: bool) -> None:
        original = getattr(owner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(*args[1:], **kwargs) if cls_method else original(*args, **kwargs)

        monkeypatch.setattr(owner, name, classmethod(call) if cls_method else call)

    counted(schema.Model.ModelT, "InitFromBuf", "parse", True)
    counted(schema.Model.Model, "GetRootAs", "parse", True)
    counted(flatbuffers.Builder, "Finish", "serialize", False)
    return counts


@pytest.mark.parametrize("name, options, changed", [
    (TRANSFORMER, {"signature": "signature_2"}, {"select_signature", "untie_shared_constants"}),
    (MNIST_CIRCLE, {"numerics": "keras"}, {"add_missing_biases"}),
    (MELSPEC, {}, {"untie_shared_constants"}),
])
def test_load_parses_once_and_serializes_nothing(name: str, options: dict, changed: set,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _count_parses_and_writes(monkeypatch)
    model = cj.load(shared_model(name), **options)
    assert dict(counts) == {"parse": 1}
    assert {r.name for r in model.passes if r.changes} == changed
    write_model(model.ir)  # the counters see a write
    assert counts["serialize"] == 1 and counts["parse"] == 2


def test_the_counters_count() -> None:
    with pytest.MonkeyPatch.context() as mp:
        counts = _count_parses_and_writes(mp)
        data = write_model(read_model(shared_model(MNIST_CIRCLE)))
        unpack(data)
        assert counts == {"parse": 3, "serialize": 1}  # read, the writer's source, unpack


def test_pipeline_follows_the_load_options() -> None:
    names = [p.func.__name__ if isinstance(p, partial) else p.__name__
             for p in passes.pipeline(signature="s", untie=True, add_bias=True)]
    assert names == ["fill_conversion_shapes", "fake_quantize_pairs", "select_signature",
                     "untie_shared_constants", "add_missing_biases"]
    assert passes.pipeline() == [passes.fill_conversion_shapes, passes.fake_quantize_pairs]


def _trained_apart(model: Model) -> dict[str, Any]:
    """The model's params with every untied copy and added bias moved off its initial value."""
    rng = np.random.default_rng(1)
    params = dict(model.params)
    for name in [*model.rewrites.untied, *model.rewrites.added_bias]:
        p = np.asarray(params[name])
        params[name] = p + rng.uniform(0.05, 0.1, p.shape).astype(p.dtype)
    return params


@pytest.mark.parametrize("path, options", [
    (shared_model(TRANSFORMER), {"signature": "signature_2"}),
    (shared_model(MNIST_CIRCLE), {"numerics": "keras"}),
    (BRANCHING, {}),
], ids=["select_signature", "add_missing_biases", "untie_shared_constants"])
def test_every_pass_output_runs_in_litert_as_in_circle_jax(path: str, options: dict) -> None:
    model = cj.load(path, **options)
    assert any(r.changes for r in model.passes)
    params = _trained_apart(model)
    feeds = _feeds(model)
    ours = jax.jit(model.apply)(params, *feeds)
    tflite = model.export(params, file_format="tflite")
    _assert_same(ours, run_litert(tflite, feeds))
    circle = model.export(params, file_format="circle")
    assert circle[4:8] == b"CIR0"
    a, b = unpack(tflite), unpack(circle)
    a.version = b.version
    assert differences(a, b) == []  # the .circle holds the same model as the .tflite
    again = cj.load(circle, tie_shared_weights=True)  # the copies are tensors of the file
    assert len(again.params) == len(model.params)
    _assert_same(jax.jit(again.apply)(again.params, *feeds), [np.asarray(o) for o in ours])


@pytest.mark.parametrize("path, options", [
    (shared_model(MNIST_CIRCLE), {"numerics": "keras"}),
    (BRANCHING, {}),
], ids=["add_missing_biases", "untie_shared_constants"])
def test_the_circle_output_runs_in_onert(path: str, options: dict, tmp_path: Any) -> None:
    from onert.infer import session

    model = cj.load(path, **options)
    assert model.rewrites
    params = _trained_apart(model)
    path = tmp_path / "m.circle"
    path.write_bytes(model.export(params, file_format="circle"))
    feeds = _feeds(model)
    got = session(str(path)).infer(feeds)
    _assert_same(got, [np.asarray(o) for o in model.apply(params, *feeds)])
