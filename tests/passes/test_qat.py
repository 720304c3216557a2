"""Quantization-aware training of fully quantized models (``load(qat=True)``): its
settings and its export (`circle_jax.passes.qat`), the model it trains.

Checked against things the simulation does not compute itself: LiteRT running the exported
integer file (every intermediate tensor), the file's own integer outputs, numpy's
straight-through gradient of a one-layer model, and the rounding rules written out by hand.

The default integer forward (``qat_forward="integer"``) computes every tensor as the
exported file does: LiteRT's tensors equal the simulation's, every one, after training.
The float forward (``qat_forward="fake_quant"``) is checked per operator
(`test_fake_quant`, with the helpers here): each operator of the simulation, fed the integer
model's own inputs to it (teacher forcing, :func:`forced`), gives that operator's LiteRT
output within one step of the output's grid (both round a real value that lies near a
rounding boundary, from float32 and from 32-bit fixed point). End to end its steps compound
through the layers; the bound asserted there is the measured one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.graph.quantization import QParams
from circle_jax.ops import fake_quant as fq
from tests.conformance import run_litert_all

DATA = Path(__file__).parents[1] / "data" / "quantized"


def _litert(data: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    """Every tensor LiteRT computes for input ``x``, by name."""
    return run_litert_all(data, [x])[1]


def _as_input(model: cj.Model, x: np.ndarray) -> np.ndarray:
    """Real-valued ``x`` quantized with the integer file's input parameters (int inputs),
    ties away from zero as LiteRT's QUANTIZE and the simulation round."""
    sg = model.simulated.main
    t = sg.tensors[sg.inputs[0]]
    if t.dtype == "float32":
        return x
    q, info = t.quantization, np.iinfo(t.dtype)
    v = np.float32(x) / np.float32(q.scale[0])
    v = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    return np.clip(v + q.zero_point[0], info.min, info.max).astype(t.dtype)


def forced(tensors: Any, params: dict, x: np.ndarray, want: dict[int, np.ndarray],
           depth: int) -> dict[int, np.ndarray]:
    """Each tensor of ``want`` (real values by tensor index) as the simulation
    (``tensors``: a model's jitted ``tensors``) computes it from its operator's inputs set to
    ``want``: taps hold every tensor at its wanted value, found by iterating ``depth`` times
    (the graph's depth at most)."""
    _, got = tensors(params, x, taps={i: jnp.zeros(v.shape) for i, v in want.items()})
    taps = {i: jnp.asarray(want[i] - np.asarray(got[i])) for i in want}
    for _ in range(depth):
        _, got = tensors(params, x, taps=taps)
        own = {i: np.asarray(got[i]) - np.asarray(taps[i]) for i in want}
        taps = {i: jnp.asarray(want[i] - own[i]) for i in want}
    return own


def _train(model: cj.Model, steps: int = 4, lr: float = 0.05) -> dict:
    """``steps`` SGD steps, one digit each (cross-entropy of the softmax output)."""
    d = np.load(Path(cj.__file__).parent / "examples" / "digits.npz")
    x = d["images"][:steps].astype(np.float32).reshape(-1, 1, 8, 8, 1) / 16.0
    y = np.eye(10, dtype=np.float32)[d["labels"][:steps]]
    train = sorted(model.trainable_params)

    @jax.jit
    def step(params: dict, x: jax.Array, y: jax.Array) -> dict:
        def loss(p: dict) -> jax.Array:
            out = model.apply({**params, **p}, x)[0].reshape(-1)
            return -jnp.sum(y * jnp.log(out + 1e-6))

        g = jax.grad(loss)({k: params[k] for k in train})
        return {**params, **{k: params[k] - lr * g[k] for k in train}}

    params = dict(model.params)
    for xi, yi in zip(x, y):
        params = step(params, xi, yi)
    return params


def _real(t: Any, q: np.ndarray) -> np.ndarray:
    """The real values of integers ``q`` of quantized tensor ``t``."""
    p = t.quantization
    return (q.astype(np.float32) - p.zero_point[0]) * np.float32(p.scale[0])


def _producer(sg: Any, i: int) -> str:
    return next((op.key for op in sg.operators if i in op.outputs), "")


#: End to end on the 8 recorded digits, the largest difference of the model output in steps
#: of its grid, measured over several weight states (benchmarks/README.md, QAT): int8 0-5,
#: int16 3-10 (here, after 4 SGD steps: 0 and 3); bounded with margin.
END_TO_END = {"int8": 6, "int16": 40}


def _litert_reals(model: cj.Model, exported: bytes, x: np.ndarray) -> dict[int, np.ndarray]:
    """LiteRT's tensors of the exported file for real input ``x``, as real values by tensor
    index (float tensors as they are)."""
    sg = read_model(exported).main
    lite = _litert(exported, _as_input(model, x))
    return {t.index: _real(t, lite[t.name]) if t.quantization is not None else lite[t.name]
            for t in sg.tensors if t.data is None and t.name in lite}


# full_int8 (int8 I/O) and int16x8 (float I/O through QUANTIZE and DEQUANTIZE, a requantizing
# QUANTIZE inside); full_int8_float_io differs from full_int8 only by its I/O.
@pytest.mark.parametrize("name", ["full_int8", "int16x8"])
@pytest.mark.slow
def test_integer_forward_is_the_exported_model(name: str) -> None:
    """After SGD steps of the integer forward (weights moved: new scales and integers),
    LiteRT on the export computes the simulation's forward: on 8 digits the outputs and
    every other tensor of the graph equal (0 LSB; float32 holds the real values, tolerance
    1e-3 of a step), except within 1 step: an ADD's output (docs/quantized.md's known difference
    of LiteRT's optimized ADD, about 1 output in 1,000; measured here: one int16 value), and
    int16x8's tensors from its FULLY_CONNECTED with an int64 bias on, which LiteRT rescales in
    double and the simulation, whose scales are traced, in float32 (the export itself is
    exact: tests/ops/test_ops_integer_wide.py)."""
    model = cj.load(DATA / f"{name}.tflite", qat=True)
    assert model.qat_forward == "integer"
    params = _train(model)
    assert all(np.isfinite(np.asarray(v)).all() for v in params.values())
    exported = model.export(params)
    assert exported != model.export()
    x = np.load(DATA / "inputs.npz")["x"]
    # every tensor of each digit alone (batch 1, as LiteRT runs it)
    outputs, tensors = jax.jit(jax.vmap(lambda xi: model.tensors(params, xi[None])))(x)
    sg = model.simulated.main
    out = sg.tensors[sg.outputs[0]]
    step = (out if out.quantization is not None else sg.tensors[next(
        op.inputs[0] for op in sg.operators if out.index in op.outputs)]).quantization.scale[0]
    for n in range(len(x)):
        lite = _litert_reals(model, exported, x[n:n + 1])
        diff = np.abs(np.asarray(outputs[0][n]) - lite[out.index]).max()
        assert diff <= (1 if name == "int16x8" else 0) * step + 1e-3 * step, (name, n, diff / step)
        compared = [i for i in lite if i in tensors]
        assert len(compared) >= len(sg.operators)
        for i in compared:
            q = sg.tensors[i].quantization
            steps = np.abs(np.asarray(tensors[i][n]) - lite[i]).max() / (q.scale[0] if q
                                                                         else step)
            bound = 1 if _producer(sg, i) == "ADD" or name == "int16x8" else 0
            assert steps <= bound + 1e-3, (name, n, sg.tensors[i].name, steps)


def test_qat_model_is_float_with_the_files_weights() -> None:
    data = (DATA / "full_int8.tflite").read_bytes()
    model = cj.load(data, qat=True)
    assert model.inputs[0].dtype == "float32" and model.simulated is not None
    assert model.trainable_params and all(
        v.dtype == jnp.float32 for v in model.params.values())
    # untrained, the export holds the file's integers: LiteRT gives the file's outputs
    x = np.load(DATA / "inputs.npz")["x"][:2]
    exported = model.export()
    computed = [t.name for t in model.simulated.main.tensors if t.data is None]
    for xi in _as_input(model, x):
        a, b = _litert(data, xi[None]), _litert(exported, xi[None])
        assert all(np.array_equal(a[k], b[k]) for k in computed if k in a)
    # a model without quantized activations: qat=True is refused (nothing to simulate;
    # before, it trained as float without a word), "auto" (the command line's) loads it as
    # it is, and QAT options with it are refused
    with pytest.raises(cj.ConfigError, match="qat=True: the model has no quantized act"):
        cj.load(DATA / "float16.tflite", qat=True)
    assert cj.load(DATA / "float16.tflite", qat="auto").simulated is None
    with pytest.raises(cj.ConfigError, match="qat_forward is an option of quantization-aw"):
        cj.load(DATA / "float16.tflite", qat="auto", qat_forward="fake_quant")
    for bad, message in ((dict(qat=True, dequantize=True), "dequantize=True makes the model"),
                         (dict(qat=False, qat_ranges="ema"), "qat_ranges is a QAT option"),
                         (dict(qat=True, qat_range_decay=0.9), "only with qat_ranges='ema'"),
                         (dict(qat="yes"), "expected True, False, None or 'auto'"),
                         (dict(qat_forward="fake_quant"), r"this load does not do \(qat=None")):
        with pytest.raises(cj.ConfigError, match=message):
            cj.load(data, **bad)


def test_fake_quant_rounds_and_passes_gradient_inside_only() -> None:
    x = jnp.array([-3.0, -0.26, 0.24, 0.26, 1.0, 3.0])
    y = fq.fake_quant(x, 0.5, 1, -4, 3)  # grid 0.5 * (q - 1), q in [-4, 3]: [-2.5, 1.0]
    np.testing.assert_array_equal(np.asarray(y), [-2.5, -0.5, 0.0, 0.5, 1.0, 1.0])
    g = jax.grad(lambda v: jnp.sum(fq.fake_quant(v, 0.5, 1, -4, 3) * jnp.arange(6.0)))(x)
    np.testing.assert_array_equal(np.asarray(g), [0, 1, 2, 3, 4, 0])


def test_weights_requantized_with_the_files_scheme() -> None:
    w = np.array([[0.5, -1.0, 0.25], [0.1, 0.2, -0.05]], np.float32)
    per_channel = QParams("int8", (0.01, 0.01), (0, 0), 0)
    q, scale, zero = fq.quantize_weight(jnp.asarray(w), per_channel)
    np.testing.assert_allclose(np.asarray(scale), [1.0 / 127, 0.2 / 127], rtol=1e-7)
    np.testing.assert_array_equal(np.asarray(q)[:, 1], [-127, 127])
    assert np.all(np.asarray(zero) == 0)
    asymmetric = QParams("uint8", (0.01,), (128,), 0)
    q, scale, zero = fq.quantize_weight(jnp.asarray(w), asymmetric)
    np.testing.assert_allclose(float(scale), 1.5 / 255, rtol=1e-6)
    assert int(zero) == 170 and int(q.min()) == 0 and int(q.max()) == 255


def _fc_model() -> bytes:
    """FULLY_CONNECTED on int8 (per-channel weights, int32 bias), its output clamped by
    the output's range."""
    b = cj.Builder()
    x = b.input("x", (1, 4), "int8", quantization=(0.05, 3))
    rng = np.random.default_rng(0)
    w = b.constant("w", rng.integers(-127, 128, (3, 4)).astype(np.int8),
                   quantization=((0.01, 0.02, 0.005), (0, 0, 0), 0))
    bias = b.constant("b", np.array([10, -20, 30], np.int32),
                      quantization=((0.0005, 0.001, 0.00025), (0, 0, 0), 0))
    y = b.op("FULLY_CONNECTED", [x, w, bias], quantization=[(0.02, -2)])
    b.output(y)
    return b.to_bytes("tflite")


def _numpy_ste(model: cj.Model, xv: np.ndarray, cot_of: Any) -> tuple[np.ndarray, ...]:
    """numpy's forward and straight-through gradients of :func:`_fc_model`'s QAT model:
    x and w on their grids, the output rounded and clamped (no gradient outside)."""
    xq = (np.clip(np.round(xv / 0.05) + 3, -128, 127) - 3) * 0.05
    wf = np.asarray(model.params["w"], np.float64)
    s = np.abs(wf).max(axis=1, keepdims=True) / 127
    wq = np.round(wf / s) * s
    bq = np.asarray(model.params["b"], np.float64)
    acc = xq @ wq.T + bq
    v = acc / 0.02 - 2
    out = (np.clip(np.round(v), -128, 127) + 2) * 0.02
    g_out = cot_of(out) * ((v >= -128) & (v <= 127))
    return out, g_out.T @ xq, g_out[0]


def test_qat_gradient_of_one_layer_is_the_straight_through_estimator() -> None:
    model = cj.load(_fc_model(), qat=True)
    xv = np.array([[0.5, -1.0, 2.0, 4.0]], np.float32)  # 4.0 is past the input's range
    cot = np.array([[1.0, -2.0, 0.5]], np.float32)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, xv)[0] * cot)))(model.params)
    out, gw, gb = _numpy_ste(model, xv, lambda out: cot)
    np.testing.assert_allclose(np.asarray(jax.jit(model.apply)(model.params, xv)[0]), out,
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grads["w"]), gw, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grads["b"]), gb, rtol=1e-6)


def test_qat_trains_under_a_half_compute_policy() -> None:
    """``precision="p=f32,c=f16,o=f32"``: the integer forward's values rounded to float16
    where the float operators compute, float32 masters; Adam steps give finite losses and
    weights that moved."""
    model = cj.load(_uint8_conv_model(), qat=True)
    rng = np.random.default_rng(2)
    x = rng.uniform(-2.5, 2.5, (16, 4, 4, 2)).astype(np.float32)
    y = rng.uniform(0, 5, (16, 2, 2, 3)).astype(np.float32)
    r = cj.fit(model, x, y, epochs=2, batch_size=4, loss="mse", optimizer="adam",
               learning_rate=1e-2, precision="p=f32,c=f16,o=f32")
    assert np.isfinite(r.history.loss).all()
    assert all(np.asarray(v).dtype == np.float32 and np.isfinite(np.asarray(v)).all()
               for v in r.params.values())
    assert any(not np.array_equal(np.asarray(r.params[k]), np.asarray(v))
               for k, v in model.params.items())


def test_loss_from_logits_reads_the_simulated_logits() -> None:
    """The keras profile's CCE reads the SOFTMAX's input logits (a variant of the graph):
    on a QAT model that variant keeps the QAT forward, its logits the integer forward's
    tensor, not the float model's."""
    from circle_jax.train.numerics import softmax_input, softmax_logits_apply

    b = cj.Builder()
    x = b.input("x", (1, 4), "int8", quantization=(0.05, 3))
    w = b.constant("w", np.random.default_rng(0).integers(-127, 128, (3, 4)).astype(np.int8),
                   quantization=((0.01, 0.02, 0.005), (0, 0, 0), 0))
    y = b.op("FULLY_CONNECTED", [x, w, -1], quantization=[(0.02, -2)])
    b.output(b.op("SOFTMAX", [y], {"beta": 1.0}, quantization=[(1 / 256, -128)]))
    model = cj.load(b.to_bytes("tflite"), qat=True)
    xv = np.array([[0.5, -1.0, 2.0, 4.0]], np.float32)
    index, beta = softmax_input(model)
    logits = np.asarray(jax.jit(softmax_logits_apply(model))(model.params, xv)[0])
    tensors = jax.jit(model.tensors)(model.params, xv)[1]
    np.testing.assert_array_equal(logits, np.asarray(tensors[index]))
    on_grid = logits / 0.02 - 2
    assert np.abs(on_grid - np.round(on_grid)).max() < 1e-3  # the int8 grid
    plain = cj.load(b.to_bytes("tflite"), qat=False)  # the dequantized model
    assert not np.array_equal(np.asarray(softmax_logits_apply(plain)(plain.params, xv)[0]),
                              logits)


def test_qat_flag() -> None:
    from circle_jax.cli import build_parser
    from circle_jax.cli.config import load_options

    for argv, want in (([], "auto"), (["--qat", "on"], True), (["--qat", "off"], False),
                       (["--dequantize"], None)):
        ns = build_parser().parse_args(["train", "m.circle", *argv])
        assert load_options(ns)["qat"] is want
        assert load_options(ns)["qat_forward"] is None  # load's: integer with file ranges
    ns = build_parser().parse_args(["train", "m.circle", "--qat_forward", "fake_quant"])
    assert load_options(ns)["qat_forward"] == "fake_quant"
    with pytest.raises(ValueError, match="quantization-aware") as e:
        cj.load(_fc_model(), qat=True).personalize(new_head=2)
    assert "\n" not in str(e.value)


def test_golden_of_a_quantized_model(tmp_path: Path) -> None:
    """`circle-jax golden`: integer tensors with their parameters as h5 attributes
    (LiteRT's values), and the QAT step's float gradients (numpy's straight-through ones)."""
    from circle_jax.cli import main
    from circle_jax.oracle.h5 import read_h5

    data = _fc_model()
    model = cj.load(data, qat=True)
    xv = np.array([[0.5, -1.0, 2.0, 4.0]], np.float32)
    target = np.array([[0.1, 0.2, -0.3]], np.float32)
    (tmp_path / "m.tflite").write_bytes(data)
    xq = _as_input(model, xv)
    np.save(tmp_path / "x.npy", xq)  # an int8 input takes its stored integers, as run does
    np.save(tmp_path / "y.npy", target)
    argv = ["golden", str(tmp_path / "m.tflite"), "--input", str(tmp_path / "x.npy"),
            "--expected", str(tmp_path / "y.npy"), "-o", str(tmp_path)]  # --qat on: default
    assert main(argv) == 0
    tensors = {e.name: e for e in read_h5(tmp_path / "tensors.h5")[0]}
    exported = model.export()  # the weights re-quantized from the masters, as the step's
    lite = _litert(exported, xq)
    sg = read_model(exported).main
    for t in sg.tensors:
        e = tensors[t.name]
        assert e.value.dtype == np.dtype(t.dtype) and np.array_equal(e.value, lite[t.name])
        np.testing.assert_array_equal(e.attrs["scale"], np.float32(t.quantization.scale))
        np.testing.assert_array_equal(e.attrs["zero_point"], t.quantization.zero_point)
    (x_in,), _ = read_h5(tmp_path / "input.h5")
    assert np.array_equal(x_in.value, xq) and x_in.attrs["scale"].tolist() == [np.float32(0.05)]
    # MSE over the batch's 3 outputs: dLoss/dout = 2 (out - target) / 3
    _, gw, gb = _numpy_ste(model, xv, lambda out: 2 * (out - target) / 3)
    grads, attrs = read_h5(tmp_path / "gradients.h5")
    by_name = {e.name: e.value for e in grads}
    np.testing.assert_allclose(by_name["w"], gw, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(by_name["b"], gb, rtol=1e-5, atol=1e-7)
    assert attrs["loss"] > 0


def _uint8_conv_model() -> bytes:
    """ONE-style uint8: CONV_2D (asymmetric per-tensor weights, RELU) and MAX_POOL_2D."""
    b = cj.Builder()
    x = b.input("x", (1, 4, 4, 2), "uint8", quantization=(0.02, 128))
    rng = np.random.default_rng(1)
    w = b.constant("w", rng.integers(0, 256, (3, 3, 3, 2)).astype(np.uint8),
                   quantization=(0.01, 120))
    bias = b.constant("b", rng.integers(-500, 500, 3).astype(np.int32),
                      quantization=(0.0002, 0))
    y = b.op("CONV_2D", [x, w, bias], {"padding": "SAME", "stride_w": 1, "stride_h": 1,
                                       "fused_activation_function": "RELU"},
             quantization=[(0.05, 10)])
    y = b.op("MAX_POOL_2D", [y], {"padding": "VALID", "filter_width": 2, "filter_height": 2,
                                  "stride_w": 2, "stride_h": 2}, quantization=[(0.05, 10)])
    b.output(y)
    return b.to_bytes("tflite")


def test_builder_made_uint8_model_exports_what_it_simulates() -> None:
    """ONE-style uint8: asymmetric per-tensor weights re-quantized with a zero point (traced
    in the integer forward); after SGD steps LiteRT on the export computes every tensor the
    simulation does."""
    model = cj.load(_uint8_conv_model(), qat=True)
    rng = np.random.default_rng(1)
    xs = rng.uniform(-2.5, 2.5, (3, 1, 4, 4, 2)).astype(np.float32)
    target = rng.uniform(0, 5, (1, 2, 2, 3)).astype(np.float32)

    @jax.jit
    def step(p: dict, xi: jax.Array) -> dict:
        g = jax.grad(lambda q: jnp.sum((model.apply(q, xi)[0] - target) ** 2))(p)
        return {k: p[k] - 0.01 * g[k] for k in p}

    params = dict(model.params)
    for xi in xs:
        params = step(params, xi)
    exported = model.export(params)
    sg = read_model(exported).main
    assert sg.tensors[1].quantization.zero_point != (120,)  # re-quantized asymmetric
    want = _litert_reals(model, exported, xs[0])
    got = jax.jit(model.tensors)(params, xs[0])[1]
    compared = [i for i in want if i in got]
    assert len(compared) == 3  # the input, CONV_2D's and MAX_POOL_2D's outputs
    for i in compared:
        steps = np.abs(np.asarray(got[i]) - want[i]) / sg.tensors[i].quantization.scale[0]
        assert steps.max() <= 1e-3, (sg.tensors[i].name, steps.max())


def test_qat_forward_option_and_refusals() -> None:
    """An unknown ``qat_forward`` is refused in one line. An ADD's quantized constant operand
    is a grid constant both forwards train (`circle_jax.passes.fake_quant`); one a
    FULLY_CONNECTED also reads as its weight, which the integer forward cannot give both
    ways, is refused in one line there; the float forward takes it."""
    with pytest.raises(ValueError, match="qat_forward 'int8'") as e:
        cj.load(_fc_model(), qat=True, qat_forward="int8")
    b = cj.Builder()
    x = b.input("x", (1, 4), "int8", quantization=(0.05, 3))
    c = b.constant("c", np.arange(4, dtype=np.int8).reshape(1, 4), quantization=(0.1, 0))
    b.output(b.op("ADD", [x, c], quantization=[(0.1, -1)]))
    model = cj.load(b.to_bytes("tflite"), qat=True)
    assert model.qat_forward == "integer" and "c" in model.trainable_params
    b = cj.Builder()
    x = b.input("x", (4, 4), "int8", quantization=(0.05, 3))
    w = b.constant("w", np.arange(16, dtype=np.int8).reshape(4, 4), quantization=(0.1, 0))
    y = b.op("FULLY_CONNECTED", [x, w, -1], quantization=[(0.2, 0)])
    b.output(b.op("ADD", [y, w], quantization=[(0.3, 0)]))
    with pytest.raises(cj.UnsupportedOperatorError, match="operator 1 .ADD. reads quantized "
                       "constant 'w'") as e2:
        cj.load(b.to_bytes("tflite"), qat=True)
    assert "\n" not in str(e.value) + str(e2.value)
    model = cj.load(b.to_bytes("tflite"), qat=True, qat_forward="fake_quant")
    assert model.qat_forward == "fake_quant"


def test_eval_scores_the_integer_model_unless_told_qat(tmp_path: Path, capsys,
                                                       monkeypatch) -> None:
    """``circle-jax eval`` on a full-integer file runs its integer kernels (exact to LiteRT),
    not the QAT simulation training uses; ``--qat on`` asks for the simulation."""
    from circle_jax.cli import common, main
    from circle_jax.train import Trainer

    loaded = []
    load_model = common.load_model
    monkeypatch.setattr(common, "load_model", lambda *a, **k: loaded.append(load_model(*a, **k))
                        or loaded[-1])
    path = str(DATA / "full_int8_float_io.tflite")
    x = np.load(DATA / "inputs.npz")["x"].astype(np.float32)
    y = np.eye(10, dtype=np.float32)[np.arange(len(x)) % 10]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    printed = {}
    for qat, model in ((None, cj.load(path)), ("on", cj.load(path, qat=True))):
        flags = ["--qat", qat] if qat else []
        assert main(["eval", path, "--load_input", str(tmp_path / "x.npy"), "--load_expected",
                     str(tmp_path / "y.npy"), "--loss", "cce", *flags]) == 0
        printed[qat] = capsys.readouterr().out.strip()
        loss, accuracy = Trainer(model, loss="cce").evaluate(model.params, x, y)
        assert printed[qat].startswith(f"loss: {loss:.4f} - categorical_accuracy: "
                                       f"{accuracy:.4f}"), printed[qat]
    assert loaded[0].simulated is None and loaded[1].simulated is not None
