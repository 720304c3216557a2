"""One load: the file parsed once, the pass pipeline built once and run once, the IR lowered
once (`circle_jax.load`, `circle_jax.passes.pipeline_stages`), however the model is then used:
the numerics profile's CCE from a SOFTMAX's logits, the NaN diagnosis of a training step
and loop bodies (``in_loop``) are views of that one lowering (`Model.view`), and a
personalization asked of ``load`` is a stage of its pipeline.

Counted by wrapping the functions that do the work: object-API parses and raw root reads of
the FlatBuffer (`tests.passes.test_pipeline`), `pipeline_stages` (builds) and `run_stages`
(runs) as `load` calls them, the pass that opens every pipeline (`fill_conversion_shapes`:
one call per pipeline run, whoever builds it), `Lowered.__init__` (lowerings) and
`operator_table` (each graph's operators checked and given their implementations: a QAT
model's integer forward lowers the integer source's too, one table per graph).

The logits view is also checked against its own lowering and the tensor the model computes:
exact equality of jitted runs (the same operators traced on the same inputs, the same float
operations); its ``in_loop`` view within 1e-6 (loop-body kernels may sum in another order).
On main before this, a load + fit with CCE from logits lowered 3 times, a QAT load and a
personalizing load twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import circle_jax as cj
import circle_jax.model as model_module
from circle_jax import passes
from circle_jax.formats.reader import read_model
from circle_jax.graph import ir
from circle_jax.lowering import interpreter
from circle_jax.lowering.interpreter import Lowered
from circle_jax.passes import stages
from circle_jax.train.diagnose import first_non_finite
from circle_jax.train.numerics import softmax_input, training_numerics
from tests.passes.test_pipeline import _count_parses_and_writes

DATA = Path(__file__).parent / "data"
MLP = DATA / "keras" / "mlp_no_bias.tflite"  # FULLY_CONNECTED x2 without bias -> SOFTMAX
QAT = DATA / "quantized" / "full_int8_float_io.tflite"
ONDEVICE = DATA / "ondevice" / "mlp_sgd.tflite"  # an on-device training file (variables)


def _wrap(monkeypatch: pytest.MonkeyPatch, counts: Counter, owner: Any, name: str,
          key: str) -> None:
    original = getattr(owner, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, call)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Parses, pipeline builds and runs, lowerings and operator tables, counted."""
    found = _count_parses_and_writes(monkeypatch)
    _wrap(monkeypatch, found, model_module, "pipeline_stages", "pipeline built")
    _wrap(monkeypatch, found, model_module, "run_stages", "pipeline run")
    for owner in (stages, passes):  # load's stages, and passes.pipeline()'s lists
        _wrap(monkeypatch, found, owner, "fill_conversion_shapes", "first pass")
    _wrap(monkeypatch, found, Lowered, "__init__", "lowered")
    _wrap(monkeypatch, found, interpreter, "operator_table", "operator table")
    return found


def _once(operator_tables: int = 1) -> dict[str, int]:
    return {"parse": 1, "pipeline built": 1, "pipeline run": 1, "first pass": 1,
            "lowered": 1, "operator table": operator_tables}


def _input(model: cj.Model, n: int | None = None) -> np.ndarray:
    """Uniform [-1, 1) samples for input 0: ``n`` of them, or its declared batch."""
    spec = model.inputs[0]
    rng = np.random.default_rng(0)
    shape = spec.shape if n is None else (n, *spec.shape[1:])
    return rng.uniform(-1, 1, shape).astype(spec.dtype)


def test_a_plain_load_does_everything_once(counts: Counter) -> None:
    model = cj.load(MLP)
    model(_input(model))
    assert dict(counts) == _once()


def test_fit_with_cce_from_logits_lowers_nothing_again(counts: Counter) -> None:
    model = cj.load(MLP, numerics="keras")  # keras: softmax_cce="logits", biases added
    assert {"add_missing_biases"} <= {r.name for r in model.passes}
    x = _input(model, 8)
    y = np.eye(model.outputs[0].shape[-1], dtype=np.float32)[np.arange(8) % 2]
    config = cj.TrainConfig(epochs=1, batch_size=4, loss="categorical_crossentropy",
                            optimizer="sgd", learning_rate=0.1)
    result = cj.fit(model, x, y, config)
    assert result.trainer.numerics.logits_of == softmax_input(model)  # the variant was used
    trainer = result.trainer
    params = trainer.unpacked(result.state).params
    frozen = {k: v for k, v in model.params.items() if k not in params}
    assert first_non_finite(trainer, params, frozen, (x,), y, 1.0) is None  # the diagnosis
    assert dict(counts) == _once()


def test_the_logits_view_computes_what_its_own_lowering_computes() -> None:
    model = cj.load(MLP, numerics="keras")
    numerics = training_numerics(model, "categorical_crossentropy", "sgd", None, None, None,
                                 {})
    index, beta = numerics.logits_of
    x = _input(model, 3)
    outputs = list(model.ir.main.outputs)
    outputs[0] = index
    own = Lowered(_with_outputs(model.ir, outputs), model.lowering)  # lowered again
    want = np.asarray(jax.jit(own.apply)(model.params, x)[0]) * beta
    got = np.asarray(jax.jit(numerics.apply)(model.params, x)[0])
    np.testing.assert_array_equal(got, want)
    _, tensors = jax.jit(model.tensors)(model.params, x)
    np.testing.assert_array_equal(got, np.asarray(tensors[index]) * beta)
    in_loop = np.asarray(jax.jit(numerics.apply_in_loop)(model.params, x)[0])
    np.testing.assert_allclose(in_loop, want, rtol=1e-6, atol=1e-6)  # loop-body kernels


def _with_outputs(ir_model: ir.Model, outputs: list[int]) -> ir.Model:
    sg = ir_model.main
    return replace(ir_model, subgraphs=(replace(sg, outputs=tuple(outputs)),
                                        *ir_model.subgraphs[1:]))


@pytest.mark.slow
def test_a_qat_load_lowers_once(counts: Counter) -> None:
    model = cj.load(QAT, qat=True)
    assert model.simulated is not None
    numerics = training_numerics(model, "categorical_crossentropy", "sgd", None, None, None,
                                 {})
    if softmax_input(model) is not None:  # QAT_SOFTMAX_CCE: the integer model's logits
        assert numerics.logits_of is not None
    numerics.apply(model.params, _input(model))
    assert dict(counts) == _once(operator_tables=2)  # the fake-quant graph, the integer one


@pytest.mark.parametrize("options, added", [
    ({"new_head": 3}, "replace_head"),
    ({"lora": 2}, "add_lora"),
    ({"new_head": 3, "lora": 2}, "add_lora"),
], ids=["new_head", "lora", "both"])
def test_a_personalizing_load_lowers_once(options: dict, added: str, counts: Counter) -> None:
    model = cj.load(MLP, **options)
    assert added in [r.name for r in model.passes] and model.personal_params
    assert dict(counts) == _once()
    again = cj.load(MLP).personalize(**options)  # the same model, personalized after load
    assert again.digest == model.digest
    assert [r.name for r in again.passes] == [r.name for r in model.passes]
    for name, value in model.params.items():
        np.testing.assert_array_equal(np.asarray(again.params[name]), np.asarray(value))


def test_a_signature_of_an_on_device_training_file_loads_once(counts: Counter) -> None:
    model = cj.load(ONDEVICE, signature="infer")
    names = [r.name for r in model.passes]
    assert names[:3] == ["select_signature", "read_variables_as_constants", "keep_reachable"]
    model(_input(model))
    assert dict(counts) == _once()


def test_the_counters_count(counts: Counter) -> None:
    cj.load(MLP).personalize(new_head=3)  # personalizing a loaded model: its own lowering
    assert counts["lowered"] == 2 and counts["parse"] == 1
    passes.run(read_model(MLP), passes.pipeline())  # a pipeline outside load
    assert counts["first pass"] == 2 and counts["parse"] == 2


def test_the_stages_follow_the_options_and_refuse_before_the_file_is_read() -> None:
    assert [s.name for s in passes.pipeline_stages()] == ["selected", "float", "trained"]
    built = passes.pipeline_stages(personal=passes.personalize(new_head=2))
    assert [s.name for s in built] == ["selected", "float", "trained", "personal"]
    with pytest.raises(cj.ConfigError, match="seed must be an integer"):
        cj.load(DATA / "no such file.tflite", new_head=2, seed=0.5)  # options first
