"""LoRA adapters (`circle_jax.passes.lora`, ``load(lora=R)``): zero B computes the base
model and only the adapters train, A is drawn as documented, and merging adds the scaled
product to each weight (checked with numpy and LiteRT). Tolerances as in
`test_personalize` (the head and LoRA together, and the refusals of both).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import circle_jax as cj
from circle_jax import passes
from circle_jax.build import Builder
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import write_model
from circle_jax.model import Model
from circle_jax.train import fit
from tests.conformance import run_litert
from tests.passes.test_personalize import CFG, MNIST, MOBILENET, _mnist_data
from tests.passes.test_pipeline import _assert_same, _feeds
from tests.paths import shared_model


def test_lora_with_zero_b_is_the_base_model_and_trains_only_adapters() -> None:
    base = cj.load(shared_model(MNIST))
    model = cj.load(shared_model(MNIST), lora=2, lora_alpha=4.0)
    assert len(set(model.adapters.values())) == 3  # the CONV_2D's and both FCs' weights
    x, y = _mnist_data(16)
    np.testing.assert_array_equal(np.asarray(model(x[:4])[0]), np.asarray(base(x[:4])[0]))
    first = fit(model, x, y, **{**CFG, "epochs": 1, "batch_size": 16})
    want = fit(base, x, y, **{**CFG, "epochs": 1, "batch_size": 16})
    assert first.history.loss[0] == want.history.loss[0]  # B = 0: the same first loss
    trained = fit(model, x, y, **CFG)
    assert trained.trainer.trainable == model.personal_params
    for name, value in trained.params.items():
        same = np.array_equal(np.asarray(value), np.asarray(model.params[name]))
        assert same == (name not in model.personal_params), name


def test_lora_a_is_kaiming_uniform_and_seeded() -> None:
    source = read_model(shared_model(MOBILENET))
    a, b, c = (passes.add_lora(source, rank=4, seed=s) for s in (1, 1, 2))
    draws = {m: {t.name: t.data for t in m.main.tensors if t.name.endswith("/lora_a")}
             for m in (a, b, c)}
    assert len(draws[a]) == 15 and draws[a].keys() == draws[c].keys()
    for name, w in draws[a].items():
        np.testing.assert_array_equal(w, draws[b][name])  # seeded
        assert not np.array_equal(w, draws[c][name]) and w.dtype == np.float32
        bound = 1 / np.sqrt(np.prod(w.shape[1:]))  # A [R, kh, kw, I]: fan-in kh * kw * I
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.5 * bound
    every = np.concatenate([w.ravel() * np.sqrt(np.prod(w.shape[1:]))
                            for w in draws[a].values()])  # scaled to U(-1, 1)
    assert abs(float(np.var(every)) - 1 / 3) < 0.02 and abs(float(np.mean(every))) < 0.02


def test_merge_lora_adds_the_scaled_product_to_each_weight() -> None:
    b = Builder()
    x = b.input("x", (2, 4, 16))
    w = b.constant("w", np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32))
    y = b.op("BATCH_MATMUL", [x, w], {"adjoint_rhs": True})
    b.output(b.op("FULLY_CONNECTED", [y, b.constant("f", np.ones((3, 8), np.float32)), -1],
                  {"keep_num_dims": True}))
    source = read_model(b.to_bytes("tflite"))
    model = passes.add_lora(source, rank=2, alpha=3.0, targets="matmul,fc")
    (a,) = [t for t in model.main.tensors if t.name == "w/lora_a"]
    assert a.shape == (2, 2, 16) and np.abs(a.data).max() <= 1 / np.sqrt(16)
    rng = np.random.default_rng(2)
    tensors = list(model.main.tensors)
    for i, t in enumerate(tensors):
        if t.name.endswith("/lora_b"):
            tensors[i] = replace(t, data=rng.normal(size=t.shape).astype(np.float32))
    model = passes.replace_subgraph(model, 0, tensors=tuple(tensors))
    merged = passes.merge_lora(model)
    assert [op.type for op in merged.main.operators] == ["BATCH_MATMUL", "FULLY_CONNECTED"]
    assert len(merged.main.tensors) == len(source.main.tensors)
    get = {t.name: np.asarray(t.data, np.float64) for t in model.main.tensors if t.is_constant}
    want = get["w"] + 1.5 * np.swapaxes(np.swapaxes(get["w/lora_a"], -1, -2)
                                        @ get["w/lora_b"], -1, -2)
    got = next(t.data for t in merged.main.tensors if t.name == "w")
    np.testing.assert_allclose(got, want, rtol=1e-6)
    feed = _feeds(Model(source))
    want_out = [np.asarray(o) for o in Model(model)(*feed)]
    _assert_same(Model(merged)(*feed), want_out)
    for graph in (model, merged):
        _assert_same(run_litert(write_model(graph, "tflite"), feed), want_out)
