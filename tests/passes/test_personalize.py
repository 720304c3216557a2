"""Personalizing: a new classifier head and LoRA adapters together (each pass alone:
`test_head`, `test_lora`), their refusals, training, files and exports.

Exports are checked against LiteRT and onert (inference): rtol 1e-5 with an atol of 1e-5
times the output's scale, as in test_pipeline (float32 kernels summing in other orders; a
wrong weight or operator moves the outputs by far more). A merged model is compared with
the unmerged graph circle-jax runs: merging changes the float32 rounding of ``W + s B A``
only (same tolerance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.checkpoints import fit_checkpointed, save_wof
from circle_jax.cli import main
from circle_jax.formats.reader import read_model
from circle_jax.train import Trainer, fit
from tests.compile_events import COMPILE, LOWER, compile_events
from tests.conformance import run_litert
from tests.passes.test_pipeline import _assert_same, _feeds
from tests.paths import shared_model
from tests.toy_models import cnn

MOBILENET = "mobilenet_v1_0.25_128_float.tflite"  # 1x1 CONV_2D head, RESHAPE, SOFTMAX
MNIST = "onert_micro_simple_mnist_model.circle"  # FC head, SOFTMAX; fast to compile
KERAS = Path(__file__).parents[1] / "data" / "keras"


def _onert(data: bytes, feeds: list[np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    from onert.infer import session

    path = tmp_path / "m.circle"
    path.write_bytes(data)
    return session(str(path)).infer(feeds)


def _moved(model: cj.Model, names: Any, seed: int = 1, size: float = 0.05) -> dict:
    """The model's params with ``names`` moved by seeded noise (as if trained)."""
    rng = np.random.default_rng(seed)
    params = dict(model.params)
    for n in names:
        p = np.asarray(params[n])
        params[n] = (p + rng.normal(0, size, p.shape)).astype(p.dtype)
    return params


QUANTIZED = Path(__file__).parents[1] / "data" / "quantized"
FULL_INT8 = str(QUANTIZED / "full_int8.tflite")
INT8_FLOAT_IO = str(QUANTIZED / "full_int8_float_io.tflite")  # DEQUANTIZE at the output
FLOAT16 = str(QUANTIZED / "float16.tflite")  # float16 weights, DEQUANTIZE to float32
DEQUANTIZE_FIRST = ("train float32 weights: dequantize the model to float32 first "
                    "(load(dequantize=True), --dequantize)")


def _not_weighted() -> bytes:
    """[1, 4] -> FULLY_CONNECTED -> RELU: the output is not a weighted operator's."""
    b = Builder()
    y = b.op("FULLY_CONNECTED", [b.input("x", (1, 4)), b.constant("w", np.ones((3, 4),
                                                                              np.float32)), -1])
    b.output(b.op("RELU", [y]))
    return b.to_bytes("tflite")


BAD_INPUT = [  # (model, personalizing keywords, the one line's text)
    (MNIST, dict(new_head=0), "class count must be an integer >= 1"),
    ("face", dict(new_head=3), "'regressors' is not fed by a weighted operator"),
    ("relu", dict(new_head=3), "is not fed by a weighted operator (FULLY_CONNECTED or 1x1 "
     "CONV_2D, then RESHAPE/SQUEEZE, SOFTMAX/LOGISTIC) but by RELU #1"),
    (MNIST, dict(lora=5), "LoRA rank 5 exceeds the rank 2 of FULLY_CONNECTED #4"),
    (MNIST, dict(lora=1, lora_targets="op9.weight"), "LoRA target 'op9.weight' names no weights"),
    (MNIST, dict(lora=1, lora_targets="matmul"), "LoRA target 'matmul' names nothing"),
    (FULL_INT8, dict(new_head=3), "FULLY_CONNECTED #10's weights 'functional_1/dense_1_2/MatMul'"
     f" are int8 (a quantized model, run by integer kernels); a new head and LoRA "
     f"{DEQUANTIZE_FIRST}"),
    (INT8_FLOAT_IO, dict(new_head=3), "FULLY_CONNECTED #11's weights 'functional_1/dense_1_2/"
     "MatMul' are int8"),
    (FULL_INT8, dict(lora=2), "LoRA: CONV_2D #0's weights 'functional_1/conv2d_1/convolution' "
     f"are int8 (a quantized model, run by integer kernels); a new head and LoRA "
     f"{DEQUANTIZE_FIRST}"),
    (FLOAT16, dict(new_head=3, dequantize=False), "made float32 by DEQUANTIZE #6; a new head "
     f"and LoRA {DEQUANTIZE_FIRST}"),
    (FLOAT16, dict(lora=2, dequantize=False), "made float32 by DEQUANTIZE #8; a new head and "
     f"LoRA {DEQUANTIZE_FIRST}"),
]


def _source(name: str) -> str | bytes:
    if name == "relu":
        return _not_weighted()
    if name == "face":
        return shared_model("mediapipe_face_detection_short_range_fp16w.tflite")
    return name if name.startswith("/") else shared_model(name)


def _id(case: tuple) -> str:
    return f"{Path(case[0]).stem}-{'-'.join(f'{k}={v}' for k, v in case[1].items())}"


@pytest.mark.parametrize("name, options, message", BAD_INPUT, ids=map(_id, BAD_INPUT))
def test_bad_input_is_one_line(name: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        cj.load(_source(name), **options)
    assert message in str(e.value) and "\n" not in str(e.value)


#: The command line trains a full-integer model quantization-aware by default (--qat on),
#: so a new head or LoRA there is refused as on a QAT model, with the flag's way out.
QAT_REFUSAL = ("a new head or LoRA adapters on a quantization-aware training model are not "
               "supported; load it with qat=False (--qat off")
CLI_BAD_INPUT = [*((n, o, QAT_REFUSAL if n in (FULL_INT8, INT8_FLOAT_IO) else m)
                   for n, o, m in BAD_INPUT if "dequantize" not in o),  # the CLI has no off
                 (MNIST, dict(lora_alpha=2), "--lora_alpha, --lora_targets and "
                  "--export_unmerged need --lora R")]


@pytest.mark.parametrize("name, options, message", CLI_BAD_INPUT, ids=map(_id, CLI_BAD_INPUT))
def test_cli_bad_input_is_one_line(name: str, options: dict, message: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    """The same refusals from ``circle-jax train``: one ``E:`` line, exit 1, before any
    training (data of the model's input and output shapes and dtypes)."""
    source = _source(name)
    if isinstance(source, bytes):
        (tmp_path / "m.tflite").write_bytes(source)
        source = str(tmp_path / "m.tflite")
    model = cj.load(source)
    for spec, file in ((model.inputs[0], "x.npy"), (model.outputs[0], "y.npy")):
        np.save(tmp_path / file, np.zeros((8, *spec.shape[1:]), spec.dtype))
    flags = [a for k, v in options.items() for a in (f"--{k}", str(v))]
    rc = main(["train", source, "--load_input", str(tmp_path / "x.npy"),
               "--load_expected", str(tmp_path / "y.npy"), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.startswith("E: ") and message in err and "\n" not in err


def _mnist_data(n: int = 16, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((n, 11, 11, 1), dtype=np.float32)
    return x, np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]


CFG = dict(batch_size=4, learning_rate=0.05, loss="cce", optimizer="adam", epochs=2)


def test_a_wof_of_a_personalized_model_holds_its_new_weights_alone(tmp_path: Path) -> None:
    """save_wof's default is the model's trainable params: the head and adapters, not the
    frozen base (docs/personalizing.md: "save_wof of the trained params writes the adapters
    alone")."""
    from circle_jax.checkpoints._common import _main_params
    from circle_jax.formats.wof import decode_wof

    model = cj.load(shared_model(MNIST), new_head=3, lora=2)
    save_wof(tmp_path / "a.wof", model)
    buffers = decode_wof((tmp_path / "a.wof").read_bytes(), len(model.ir.main.tensors))
    names = _main_params(model)
    filled = {names[k] for k, b in enumerate(buffers) if b is not None}
    assert filled == model.personal_params
    assert len(model.personal_params) == 6 < len(model.params)  # 2 head, 2 x 2 adapters


@pytest.mark.parametrize("name", [MOBILENET, "mlperftiny_vww_96_mobilenet_float.tflite"])
def test_a_new_head_and_adapters_load_without_compiling(name: str) -> None:
    with compile_events() as events:
        model = cj.load(shared_model(name), new_head=3, lora=2, seed=7)
    compiled = [e for e in events if e.name in (LOWER, COMPILE)]  # lowered: even when cached
    assert model.adapters and not compiled  # drawn by JAX, a program per shape: 4 s (VWW)


def test_merged_and_unmerged_exports_run_in_litert_and_onert(tmp_path: Path) -> None:
    model = cj.load(shared_model(MOBILENET), new_head=5, lora=4, lora_alpha=8)
    assert len(model.adapters) == 28  # the 14 CONV_2D (depthwise ones are no targets)
    params = _moved(model, [n for n in model.adapters if n.endswith("lora_b")])
    feeds = _feeds(model)
    ours = [np.asarray(o) for o in jax.jit(model.apply)(params, *feeds)]
    merged = model.export(params, file_format="tflite")
    unmerged = model.export(params, file_format="tflite", merge_adapters=False)
    assert len(read_model(merged).main.operators) == 30  # 31, a 3-operator head now 2
    assert len(read_model(unmerged).main.operators) == len(model.operators)
    for data in (merged, unmerged):
        _assert_same(run_litert(data, feeds), ours)
    for merge in (True, False):
        data = model.export(params, file_format="circle", merge_adapters=merge)
        _assert_same(_onert(data, feeds, tmp_path), ours)


def test_lora_checkpoint_holds_adapters_and_resume_is_exact(tmp_path: Path) -> None:
    model = cj.load(shared_model(MNIST), new_head=2, lora=2)
    x, y = _mnist_data(16)
    whole = fit(model, x, y, **CFG)
    trainer = Trainer(model, **{**CFG, "epochs": 1})
    path = tmp_path / "run.ckpt"
    first = fit_checkpointed(model, x, y, trainer=trainer, save=path)
    second = fit_checkpointed(model, x, y, trainer=trainer, resume=path, save=path)
    assert first.history.loss + second.history.loss == whole.history.loss
    for name, value in whole.params.items():
        np.testing.assert_array_equal(np.asarray(second.params[name]), np.asarray(value))


def test_a_personalized_checkpoint_in_onerts_order_resumes_exactly(tmp_path: Path) -> None:
    """The replaced head's old weights stay in the tensor table, read by nothing. onert's
    checkpoints leave such constants out, and so do circle-jax's entries (before, onert's
    order was refused as "not a permutation of the model's constant tensors", which made
    the command line's default --export_checkpoint fail on every new head)."""
    model = cj.load(shared_model(MNIST), new_head=2, lora=2)
    sg = model.ir.main
    read = {i for op in sg.operators for i in op.inputs}
    assert [t.name for t in sg.tensors if t.is_constant and t.index not in read]  # old head
    x, y = _mnist_data(16)
    whole = fit(model, x, y, **CFG)
    trainer = Trainer(model, **{**CFG, "epochs": 1})
    path = tmp_path / "run.ckpt"
    first = fit_checkpointed(model, x, y, trainer=trainer, save=path, order="onert")
    second = fit_checkpointed(model, x, y, trainer=trainer, resume=path, save=path,
                              order="onert")
    assert first.history.loss + second.history.loss == whole.history.loss
    for name, value in whole.params.items():
        np.testing.assert_array_equal(np.asarray(second.params[name]), np.asarray(value))


TOY = cnn().to_bytes("circle")  # CONV_2D, pool, RESHAPE, FC head, SOFTMAX: compiles fast
ADAPTED = {"head/weights", "head/bias", "conv/w/lora_a", "conv/w/lora_b"}


def _toy_data(n: int = 16, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.random((n, 8, 8, 1), dtype=np.float32)
    return x, np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]


def _only_personal_moved(result: Any) -> None:
    """Finite per-epoch losses that go down; the new head and adapters alone moved, every
    param in its model dtype."""
    loss = np.asarray(result.history.loss)
    assert np.isfinite(loss).all() and loss[-1] < loss[0], loss
    model = result.model
    assert result.trainer.trainable == model.personal_params == ADAPTED
    for name, value in result.params.items():
        assert value.dtype == model.params[name].dtype, name
        moved = not np.array_equal(np.asarray(value), np.asarray(model.params[name]))
        assert moved == (name in ADAPTED), name


def test_fit_personalizes_as_load_does() -> None:
    x, y = _toy_data()
    options = dict(new_head=3, lora=1, lora_alpha=2, lora_targets="conv")
    by_fit = fit(cj.load(TOY), x, y, **options, **CFG, seed=5)
    by_load = cj.load(TOY, **options, seed=5)
    assert by_fit.model.ir.main.operators == by_load.ir.main.operators
    for name, value in by_load.params.items():  # the same initial values (seed 5)
        np.testing.assert_array_equal(np.asarray(by_fit.model.params[name]), value)
    assert by_fit.trainer.trainable == by_load.personal_params == ADAPTED
    with pytest.raises(ValueError, match="new_head and lora personalize the model a trainer"):
        fit(cj.load(TOY), x, y, trainer=by_fit.trainer, new_head=3)


@pytest.mark.parametrize("numerics", ["keras", "torch", "onert-micro"])  # onert: the others
def test_new_head_and_lora_train_under_each_numerics_profile(numerics: str) -> None:
    base = cj.load(TOY, numerics=numerics)
    x, y = _toy_data()
    result = fit(base, x, y, new_head=3, lora=2, lora_targets="conv", epochs=3,
                 batch_size=4, learning_rate=0.01, loss="cce", optimizer="adam")
    assert result.model.numerics == base.numerics
    _only_personal_moved(result)


@pytest.mark.parametrize("mode", ["stream", "in_step"])
def test_new_head_and_lora_accumulate_as_one_big_batch(mode: str) -> None:
    """sgd over 2 accumulated micro-batches of 4 = one step over the batch of 8 (the
    gradient of a mean over 8 is the mean of two means over 4): equal within float32
    rounding of the sums' order."""
    x, y = _toy_data()
    sgd = dict(new_head=3, lora=2, lora_targets="conv", learning_rate=0.1, loss="cce",
               optimizer="sgd", epochs=1)
    big = fit(cj.load(TOY), x, y, batch_size=8, **sgd)
    micro = 4 if mode == "stream" else 8  # stream: each step one micro-batch
    acc = fit(cj.load(TOY), x, y, batch_size=micro, accumulate=2, accumulate_mode=mode, **sgd)
    for name in ADAPTED:
        np.testing.assert_allclose(np.asarray(acc.params[name]), np.asarray(big.params[name]),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.array_equal(np.asarray(big.params["conv/w/lora_b"]), 0)


@pytest.mark.parametrize("precision, loss_scale, compute", [
    ("p=f32,c=f16,o=f32", "dynamic", jnp.float16), ("p=f32,c=bf16,o=f32", "none", jnp.bfloat16)])
def test_new_head_and_lora_train_in_mixed_precision(precision: str, loss_scale: str,
                                                    compute: Any) -> None:
    base = cj.load(TOY)
    x, y = _toy_data()
    result = fit(base, x, y, new_head=3, lora=2, lora_targets="conv", epochs=3,
                 batch_size=4, learning_rate=0.01, loss="cce", optimizer="adam",
                 precision=precision, loss_scale=loss_scale)
    assert result.trainer.policy.compute_dtype == compute
    _only_personal_moved(result)


def test_cli_new_head_writes_circleplus_tflite_and_refuses_lora_circleplus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from circle_jax.formats.traininfo import decode_traininfo

    monkeypatch.chdir(tmp_path)
    x, y = _mnist_data(8, 3)
    np.save("x.npy", x)
    np.save("y.npy", y)
    base = ["train", shared_model(MNIST), "--load_input", "x.npy", "--load_expected", "y.npy",
            "--epoch", "1", "--batch_size", "4", "--loss", "cce", "--optimizer", "adam",
            "--new_head", "3", "--seed", "2"]
    assert main(base + ["--export_circleplus", "h.circle", "--export_tflite", "h.tflite"]) == 0
    block = capsys.readouterr().out.split("========================")[0]
    # the new head's two params train: listed by name, not as a count of last operators
    # (before: "num_of_trainable_ops = 2", the number of names)
    assert "num_of_trainable_ops" not in block and "- trainable " in block, block
    plus = read_model("h.circle")
    info = decode_traininfo(plus.metadata["CIRCLE_TRAINING"])
    assert info.trainable_ops == (4, 5)  # the new FULLY_CONNECTED and the SOFTMAX
    (out,) = run_litert(Path("h.tflite").read_bytes(), [x[:1]])
    assert out.shape == (1, 3)
    capsys.readouterr()
    assert main(base + ["--lora", "1", "--export_circleplus", "l.circle"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("E: ") and "LoRA adapters" in err and "last N operators" in err
    assert "\n" not in err and len(err) < 300  # not every weight's name
    assert main(base + ["--lora", "1", "--export_tflite", "l.tflite", "--export_unmerged",
                        "--export_wof", "l.wof"]) == 0
    unmerged = read_model("l.tflite")
    assert len(unmerged.main.operators) > len(plus.main.operators)


TORCH = Path(__file__).parents[1] / "data" / "torch"
SAME_GRAPH = {"lstm_b16", "three_consumers", "mlp_zero_bias"}  # as lstm, three_consumers_b16,
# torch's mlp
CONVERTED = sorted(p for p in [*TORCH.glob("*.tflite"), *KERAS.glob("*.tflite")]
                   if p.stem not in SAME_GRAPH)
HEAD_ONLY = {"embedding", "lstm"}  # the head is their only FULLY_CONNECTED


@pytest.mark.parametrize("path", CONVERTED, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_converted_classifiers_personalize_train_and_export(path: Path) -> None:
    """Every converted Keras and litert-torch classifier (MLP, CNN with NCHW input and folded
    BatchNorm, residual, attention, Conv1D, LSTM, embedding) takes a 4-class head (and
    rank-2 LoRA where it has weighted operators besides the head), trains one epoch with
    finite losses, and its exports (merged and unmerged) run in LiteRT with 4 outputs equal
    to circle-jax's (the module's tolerance)."""
    lora = None if path.stem in HEAD_ONLY else 2
    if lora is None:
        with pytest.raises(ValueError, match="but the new head, which trains whole"):
            cj.load(path, new_head=4, lora=2)
    model = cj.load(path, new_head=4, lora=lora, seed=3)
    with np.load(path.parent / "data.npz") as d:
        x = d[f"{path.stem.removesuffix('_b16')}/x"][:16]
    y = np.eye(4, dtype=np.float32)[np.arange(16) % 4]
    batch = model.inputs[0].shape[0]
    result = fit(model, x, y, epochs=1, batch_size=max(batch, 8), learning_rate=0.01,
                 loss="cce", optimizer="adam")
    assert np.isfinite(result.history.loss).all()
    assert len(model.adapters) == (0 if lora is None else len(model.personal_params) - 2)
    feeds = [x[:batch]]
    ours = [np.asarray(o) for o in jax.jit(model.apply)(result.params, *feeds)]
    assert ours[0].shape == (batch, 4)
    for merge in (True, False) if lora else (True,):
        data = model.export(result.params, "tflite", merge_adapters=merge)
        _assert_same(run_litert(data, feeds), ours)


@pytest.mark.parametrize("name, options, tolerance", [
    ("float16", {}, 1e-5), ("dynamic_range", {}, 2e-2),
    ("full_int8", dict(dequantize=True), 1e-5)])  # the refusal's way out
def test_quantized_bases_personalize_once_loaded_as_float(name: str, options: dict,
                                                          tolerance: float) -> None:
    """A weight-only quantized base (float16 or dynamic-range int8 weights) loads as float32
    and takes a new head and LoRA; a full-integer one does with ``dequantize=True``. The
    exports, merged (W + s B A written back in the base's own layout) and unmerged, run in
    LiteRT with 4 outputs; LiteRT on an export is compared with circle-jax on the same
    export, within test_weight_only_models' tolerances (LiteRT's hybrid kernels quantize
    the activations: 2e-2; float16 weights and float graphs compute float32: 1e-5).

    The unmerged export computes the trained model exactly; the merged one rounds
    ``W + s B A`` to the base's float16 or int8 weights, which keeps the adapters' change
    to within 10% (measured after 2 epochs, of an adapters' effect of 4.8e-2: 4.7e-5 for
    float16, 1.35e-3 for dynamic-range int8, 1e-7 for the dequantized full-integer model)."""
    model = cj.load(QUANTIZED / f"{name}.tflite", new_head=4, lora=2, **options)
    assert model.adapters and model.outputs[0].shape == (1, 4)
    with np.load(QUANTIZED / "inputs.npz") as d:
        x = next(iter(d.values())).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[np.arange(len(x)) % 4]
    result = fit(model, x, y, epochs=2, batch_size=4, learning_rate=0.01, loss="cce",
                 optimizer="adam")
    assert np.isfinite(result.history.loss).all()
    apply = jax.jit(model.apply)
    trained = np.asarray(apply(result.params, x)[0])
    effect = np.abs(trained - np.asarray(apply({**result.params, **{
        n: model.params[n] for n in model.adapters}}, x)[0])).max()
    for merge in (True, False):
        data = model.export(result.params, "tflite", merge_adapters=merge)
        again = cj.load(data, **options)
        exported = np.asarray(jax.jit(again.apply)(again.params, x)[0])
        assert np.abs(exported - trained).max() <= (0.1 * effect if merge else 0)
        got = run_litert(data, [x[:1]])
        assert got[0].shape == (1, 4)
        np.testing.assert_allclose(got[0], exported[:1], rtol=0, atol=tolerance)
