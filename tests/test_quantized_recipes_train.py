"""Every ai-edge-quantizer recipe trains and exports in its file's own layout
(`tests/aeq_files.py` makes the files from the tests' float models at test time).

- ``weight_only_*`` and ``dynamic_*`` files load dequantized (float32 masters, hybrid
  operators computing as LiteRT's kernels) and ``fit`` lowers the loss; export writes each
  weight back in its own type and layout (`circle_jax.passes.requantize_weights`): int4
  stays int4 per channel, int2 int2, blockwise int4 blockwise with the same block size and
  recomputed float16 scales, weights read through DEQUANTIZE read through it again. Every
  trained weight is within half a quantization step of its float master.
- ``static_*`` files load for QAT (``qat=True``, the integer forward) and export integer;
  the keras LayerNorm's quantized constants read by ADD and MUL (epsilon, gamma, beta) are
  grid constants (`circle_jax.passes.fake_quant`): trained on the file's own scale and zero
  point, written back on it; by both QAT forwards.
- LiteRT runs every export and agrees with circle-jax on it as on the quantizer's own files
  (`tests.test_ai_edge_quantizer.agrees_with_litert`: the same tolerances, the same LiteRT
  faults pinned).
- An export of the untrained model is the quantizer's file, byte for byte.
- Requantizing the float model's weights into the quantizer's layout gives the integers and
  scales the quantizer wrote (the rule is ai-edge-quantizer's, checked against it).
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.errors import ConfigError
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import write_model
from circle_jax.graph import ir
from circle_jax.passes.dequantize import dequantized_values, is_quantized, requantized_weight
from circle_jax.passes.edit import add_operator, add_tensor, replace_subgraph
from tests.aeq_files import quantized, quantized_path
from tests.test_ai_edge_quantizer import CELLS, MODELS, agrees_with_litert

#: The QAT forward each model's static files train with (default "integer").
QAT_FORWARD: dict[str, str] = {}
STATIC = [c for c in CELLS if c[1].startswith("static")]
FLOAT = [c for c in CELLS if not c[1].startswith("static")]
#: The default tier trains every recipe but static_wi8_ai16 (int16 QAT) of the smallest model;
#: the other cells are slow (each compiles a training step: ~5-20 s).
DEFAULT_MODEL = "torch_mlp"
TRAINED = [c if c[0] == DEFAULT_MODEL and c[1] != "static_wi8_ai16"
           else pytest.param(*c, marks=pytest.mark.slow)
           for c in CELLS]


def _load(data: bytes, model: str, recipe: str) -> cj.Model:
    if recipe.startswith("static"):
        return cj.load(data, qat=True, qat_forward=QAT_FORWARD.get(model, "integer"))
    return cj.load(data)


def _data(m: cj.Model, n: int = 16, seed: int = 0) -> tuple[list, list]:
    """Standard-normal float inputs and targets of the model's shapes."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((n, *s.shape[1:])).astype(np.float32) for s in m.inputs]
    y = [rng.standard_normal((n, *s.shape[1:])).astype(np.float32) for s in m.outputs]
    return x, y


@functools.cache
def _trained(model: str, recipe: str) -> tuple[cj.Model, cj.FitResult, bytes]:
    """(the loaded file, 3 epochs of Adam on random data, the trained export as .tflite)."""
    m = _load(quantized(MODELS[model], recipe), model, recipe)
    x, y = _data(m)
    r = cj.fit(m, x if len(x) > 1 else x[0], y if len(y) > 1 else y[0], epochs=3,
               batch_size=4, loss="mse", optimizer="adam", learning_rate=1e-2)
    return m, r, m.export(r.params, file_format="tflite")


def _quantization(t: ir.Tensor, sg: ir.Subgraph) -> tuple | None:
    """What a tensor's layout is: (scale count, axis, zero points: a constant's only
    whether they are all 0, as a trained weight's are recomputed), or for a blockwise one
    its block size and its scales tensor's name, type and shape."""
    q = t.quantization
    if q is None:
        return None
    if q.blockwise is not None:
        s = sg.tensors[q.blockwise.scales]
        return ("blockwise", q.blockwise.block_size, q.blockwise.zero_points, s.name, s.dtype,
                s.shape)
    zero = not any(q.zero_point) if t.is_constant else q.zero_point
    return len(q.scale), q.quantized_dimension, zero


def _layout(model: ir.Model, copies: dict[str, str] | None = None) -> list:
    """Every tensor's name, type, shape and quantization layout, every operator's wiring.
    ``copies`` (untied copies, ``copy name -> source name``: tensors appended to the main
    subgraph) are read as their sources, whose layout they must have."""
    sg = model.main
    by_name = {t.name: t.index for t in sg.tensors}
    source = {by_name[c]: by_name[s] for c, s in (copies or {}).items() if c in by_name}

    def entry(t: ir.Tensor) -> tuple:
        return t.dtype, t.shape, t.is_constant, _quantization(t, sg)

    assert all(entry(sg.tensors[c]) == entry(sg.tensors[s]) for c, s in source.items())
    return [[(t.name, *entry(t)) for t in sg.tensors if t.index not in source],
            [(op.type, tuple(source.get(i, i) for i in op.inputs), op.outputs)
             for op in sg.operators], len(model.subgraphs)]


def _step(t: ir.Tensor, sg: ir.Subgraph) -> np.ndarray:
    """Each value's quantization step (its channel's or block's scale)."""
    ones = np.ones(t.shape, np.int8).astype(ir.as_numpy_dtype(t.dtype))
    return dequantized_values(replace(t, data=ones), sg)


@pytest.mark.parametrize("model, recipe", TRAINED)
def test_training_lowers_the_loss_and_export_keeps_the_layout(model: str, recipe: str) -> None:
    m, r, out = _trained(model, recipe)
    loss = r.history.loss
    assert np.isfinite(loss).all() and loss[-1] < loss[0], loss
    assert all(np.asarray(v).dtype == np.float32 for v in r.params.values())
    source, written = read_model(quantized(MODELS[model], recipe)), read_model(out)
    assert _layout(written, m.rewrites.untied) == _layout(source)
    sg, before = written.main, source.main
    weights = [t for t in sg.tensors[:len(before.tensors)] if t.is_constant and is_quantized(t)
               and t.dtype not in ("int32", "int64")]
    assert weights
    changed = [t for t in weights if t.data.tobytes() != before.tensors[t.index].data.tobytes()
               or t.quantization != before.tensors[t.index].quantization]
    assert changed, "training changed no quantized weight"
    if recipe.startswith("static"):
        return
    for t in weights:  # within half a step (its channel's or block's scale) of the master
        master = np.asarray(r.params[t.name], np.float64)
        err = np.abs(dequantized_values(t, sg).astype(np.float64) - master)
        assert np.all(err <= _step(t, sg) * (0.5 + 1e-5)), (t.name, float(err.max()))
    for t in changed:
        if t.quantization.blockwise is not None:
            s = t.quantization.blockwise.scales
            assert sg.tensors[s].data.tobytes() != before.tensors[s].data.tobytes()


@pytest.mark.parametrize("model, recipe", TRAINED)
def test_litert_runs_the_trained_export_as_circle_jax(model: str, recipe: str) -> None:
    agrees_with_litert(_trained(model, recipe)[2], model, recipe)


@pytest.mark.parametrize("model, recipe", CELLS)
def test_the_untrained_export_is_the_quantizers_file(model: str, recipe: str) -> None:
    data = quantized(MODELS[model], recipe)
    assert _load(data, model, recipe).export(file_format="tflite") == data


@pytest.mark.parametrize("model, recipe", TRAINED)
def test_the_circle_export_keeps_the_layout(model: str, recipe: str) -> None:
    """The trained model written as .circle has the .tflite export's layout and values; an
    int2 weight, which Circle's schema has no type for, is refused in one line."""
    m, r, out = _trained(model, recipe)
    if "wi2" in recipe:
        with pytest.raises(ValueError, match="^no Circle tensor type for dtype int2$"):
            m.export(r.params, file_format="circle")
        return
    circle, tflite = read_model(m.export(r.params, file_format="circle")), read_model(out)
    assert _layout(circle, m.rewrites.untied) == _layout(tflite, m.rewrites.untied)
    assert all(a.data is None and b.data is None or a.data.tobytes() == b.data.tobytes()
               for a, b in zip(circle.main.tensors, tflite.main.tensors))


@pytest.mark.parametrize("model, recipe", [c for c in FLOAT if "wi8" not in c[1]])
def test_requantized_float_weights_are_the_quantizers(model: str, recipe: str) -> None:
    """Each int4 / int2 / blockwise weight of the quantizer's file, requantized from the
    float model's weight of the same name, is the quantizer's: integers, scales."""
    floats = {t.name: t for t in read_model(MODELS[model]).main.tensors}
    sg = read_model(quantized(MODELS[model], recipe)).main
    weights = [t for t in sg.tensors if t.is_constant and t.dtype in ("int4", "int2")]
    assert weights
    for t in weights:
        new, scales = requantized_weight(replace(t, dtype="float32", data=floats[t.name].data),
                                         t, sg)
        assert new.dtype == t.dtype and new.data.tobytes() == t.data.tobytes(), t.name
        if t.quantization.blockwise is None:
            assert scales is None and new.quantization == t.quantization
        else:
            assert scales.tobytes() == sg.tensors[t.quantization.blockwise.scales].data.tobytes()


@pytest.mark.parametrize("forward", ["integer", "fake_quant"])
@pytest.mark.slow
def test_the_layernorm_s_grid_constants_train_on_the_file_s_grid(forward: str) -> None:
    """The LayerNorm's static file trains by QAT (either forward): its ADD / MUL constants
    (epsilon, gamma, beta) move, written on the file's own scale and zero point; LiteRT
    runs the export as circle-jax does."""
    data = quantized(MODELS["keras_layernorm"], "static_wi8_ai8")
    m = cj.load(data, qat=True, qat_forward=forward)
    x, y = _data(m)
    r = cj.fit(m, x[0], y[0], epochs=3, batch_size=4, loss="mse", optimizer="adam",
               learning_rate=1e-2)
    assert r.history.loss[-1] < r.history.loss[0]
    out = m.export(r.params, file_format="tflite")
    before, after = read_model(data).main, read_model(out).main
    readers = {i for op in before.operators if op.type in ("ADD", "MUL")
               for i in op.inputs if i >= 0 and before.tensors[i].is_constant}
    constants = [i for i in readers if is_quantized(before.tensors[i])]
    assert len(constants) == 3
    for i in constants:
        assert after.tensors[i].quantization == before.tensors[i].quantization
    assert any(after.tensors[i].data.tobytes() != before.tensors[i].data.tobytes()
               for i in constants)
    agrees_with_litert(out, "keras_layernorm", "static_wi8_ai8")


@pytest.mark.parametrize("model, recipe", STATIC[:1])
def test_fit_on_an_integer_model_says_how_to_train_it(model: str, recipe: str) -> None:
    m = cj.load(quantized(MODELS[model], recipe))
    x, y = _data(m, 8)
    with pytest.raises(ConfigError) as e:
        cj.fit(m, x[0], y[0], epochs=1, batch_size=4, loss="mse")
    message = str(e.value)
    assert "\n" not in message and "qat=True" in message and "dequantize=True" in message
    assert "no trainable weights" not in message


def test_cli_trains_and_exports_a_dynamic_wi4_file(tmp_path, capsys) -> None:
    path = quantized_path(MODELS["torch_mlp"], "dynamic_wi4_afp32")
    m = cj.load(path)
    x, y = _data(m, 32, seed=3)
    np.save(tmp_path / "x.npy", x[0])
    np.save(tmp_path / "y.npy", y[0])
    out = tmp_path / "trained.tflite"
    assert main(["train", path, "--load_input", str(tmp_path / "x.npy"), "--load_expected",
                 str(tmp_path / "y.npy"), "--epoch", "2", "--batch_size", "8", "--loss", "mse",
                 "--optimizer", "adam", "--learning_rate", "0.01",
                 "--export_tflite", str(out)]) == 0
    losses = [float(v) for v in re.findall(r"loss: \[0\] ([0-9.]+)", capsys.readouterr().out)]
    assert len(losses) == 2 and losses[1] < losses[0]
    data = out.read_bytes()
    assert _layout(read_model(data), m.rewrites.untied) == _layout(read_model(path))
    assert data != open(path, "rb").read()
    agrees_with_litert(data, "torch_mlp", "dynamic_wi4_afp32")


def test_untied_copies_of_a_blockwise_weight_get_scales_of_their_own() -> None:
    """The torch MLP's blockwise fc2 weight (and bias) read by a second FULLY_CONNECTED too,
    whose output the loss does not read: untied at load, one trains and the other keeps
    the file's values; both are written blockwise, the trained one's integers and float16
    scales recomputed in a scales tensor of its own, the other's the file's; LiteRT runs
    the export as circle-jax does."""
    source = read_model(quantized(MODELS["torch_mlp"], "dynamic_wi4b32_afp32"))
    fc2 = source.main.operators[1]
    hidden, weight, bias = fc2.inputs
    model, out = add_tensor(source, 0, "second", source.main.tensors[fc2.outputs[0]].shape)
    model = add_operator(model, 0, "FULLY_CONNECTED", (hidden, weight, bias), (out,),
                         dict(fc2.options))
    model = replace_subgraph(model, 0, outputs=(*model.main.outputs, out))
    m = cj.load(write_model(model))
    assert set(m.rewrites.untied.values()) >= {source.main.tensors[weight].name}
    x, y = _data(m)
    r = cj.fit(m, x[0], y[0], epochs=3, batch_size=4, loss="mse", optimizer="adam",
               learning_rate=1e-2)
    data = m.export(r.params, file_format="tflite")
    sg = read_model(data).main
    read = [sg.tensors[op.inputs[1]] for op in sg.operators[1:]]
    scales = [t.quantization.blockwise.scales for t in read]
    assert [t.dtype for t in read] == ["int4", "int4"] and len(set(scales)) == 2
    assert all(sg.tensors[s].dtype == "float16" and sg.tensors[s].shape == (10, 1)
               for s in scales)
    before = source.main.tensors
    kept = [t.data.tobytes() == before[weight].data.tobytes() and sg.tensors[s].data.tobytes()
            == before[before[weight].quantization.blockwise.scales].data.tobytes()
            for t, s in zip(read, scales)]
    assert sorted(kept) == [False, True]
    agrees_with_litert(data, "torch_mlp", "dynamic_wi4b32_afp32")


def test_int8_data_to_a_qat_model_is_the_stored_integers() -> None:
    """A QAT model's inputs are real values (float32); data in the file's int8 is the
    stored integers, dequantized (``s * (q - z)``), in ``apply`` as in ``fit`` (``apply``
    gave NaN: the grid's scale truncated to int8); other integer data is read as the
    numbers it holds."""
    m = cj.load(quantized(MODELS["torch_mlp"], "static_wi8_ai8"), qat=True)
    spec = m.inputs[0]
    assert spec.dtype == "float32" and spec.stored.dtype == "int8"
    x = np.random.default_rng(0).integers(-128, 128, (4, *spec.shape[1:]))
    out = np.asarray(m.apply(m.params, x.astype(np.int8))[0])
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, np.asarray(m.apply(m.params, spec.stored.real(x))[0]))
    as_numbers = np.asarray(m.apply(m.params, x.astype(np.int32))[0])
    np.testing.assert_array_equal(as_numbers, np.asarray(
        m.apply(m.params, x.astype(np.float32))[0]))
