"""UNIDIRECTIONAL_SEQUENCE_LSTM (LiteRT oracle), Circle's GRU and ROPE (numpy references).

LiteRT cannot run Circle-only operators (GRU = -5, ROPE = -7), so those are checked against
numpy transcriptions of ONE's kernels instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.formats.schema import schema
from circle_jax.formats.writer import pack
from tests.conformance import (
    ATOL,
    RTOL,
    Const,
    assert_close,
    check_grads_x64,
    check_op_grads,
    one_op_model,
    run_circle_jax,
    run_litert,
)
from tests.paths import shared_model

# ---------------------------------------------------------------- helpers

def _compare(data: bytes, feeds: list[np.ndarray], rtol: float = RTOL, atol: float = ATOL,
             circle: bytes | None = None) -> None:
    """LiteRT on the .tflite bytes vs circle-jax, jit and eager, on the tflite and circle bytes."""
    want = run_litert(data, feeds)
    runs = [(data, True), (data, False)] + ([(circle, True)] if circle else [])
    for blob, jit in runs:
        model = cj.load(blob)
        fn = jax.jit(model.apply) if jit else model.apply
        got = [np.asarray(g) for g in fn(model.params, *feeds)]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            assert_close(g, w, rtol, atol, f"jit={jit}")


def _lstm_bytes(
    rng: np.random.Generator,
    *,
    n_in: int = 3,
    n_cell: int = 4,
    batch: int = 2,
    steps: int = 5,
    cifg: bool = False,
    peephole: bool = False,
    projection: int = 0,
    proj_bias: bool = True,
    layer_norm: bool = False,
    diagonal: bool = False,
    options: dict[str, Any] | None = None,
) -> tuple[bytes, bytes, list[np.ndarray]]:
    """A one-LSTM model (.tflite, .circle, feeds) with random weights and zero variable states."""
    o = {"fused_activation_function": "TANH", "time_major": False, **(options or {})}
    n_out = projection or n_cell
    b = Builder()
    shape = (steps, batch, n_in) if o["time_major"] else (batch, steps, n_in)
    x = b.input("x", shape)

    def const(name: str, *dims: int, scale: float = 0.5) -> int:
        return b.constant(name, (rng.normal(size=dims) * scale).astype(np.float32))

    gates = "ifco"
    ins = [x]
    ins += [-1 if cifg and g == "i" else const(f"w_x{g}", n_cell, n_in) for g in gates]
    rec_dims = (n_cell,) if diagonal else (n_cell, n_out)
    ins += [-1 if cifg and g == "i" else const(f"w_h{g}", *rec_dims) for g in gates]
    ins += [const(f"peep_{g}", n_cell) if peephole and not (cifg and g == "i") else -1
            for g in "ifo"]
    ins += [-1 if cifg and g == "i" else const(f"bias_{g}", n_cell) for g in gates]
    ins += [const("proj_w", n_out, n_cell) if projection else -1,
            const("proj_b", n_out) if projection and proj_bias else -1]
    h, c = b.tensor("output_state", (batch, n_out)), b.tensor("cell_state", (batch, n_cell))
    ins += [h, c]
    ins += [const(f"ln_{g}", n_cell, scale=1.0) if layer_norm and not (cifg and g == "i")
            else -1 for g in gates]
    if diagonal:
        o["diagonal_recurrent_tensors"] = True
    b.output(b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, o))
    m = b.to_object()
    for t in (h, c):
        m.subgraphs[0].tensors[t].isVariable = True
    feeds = [rng.normal(size=shape).astype(np.float32)]
    return pack(m, "tflite"), pack(m, "circle"), feeds


# ---------------------------------------------------------------- LSTM vs LiteRT

LSTM_CASES = {
    "basic": {},
    "time_major_peephole": {"peephole": True, "options": {"time_major": True}},
    "cifg": {"cifg": True},
    "projection_clip": {"projection": 3, "options": {"proj_clip": 0.3}},
    "projection_no_bias_layer_norm": {"projection": 5, "proj_bias": False, "layer_norm": True},
    "layer_norm_cifg_peephole_proj": {"layer_norm": True, "cifg": True, "peephole": True,
                                      "projection": 2},
    "cell_clip_relu6": {"options": {"cell_clip": 0.4, "fused_activation_function": "RELU6"}},
    "relu": {"options": {"fused_activation_function": "RELU"}},
    "batch1_long": {"batch": 1, "steps": 28, "n_in": 7, "n_cell": 6},
}


@pytest.mark.parametrize("case", list(LSTM_CASES))
def test_lstm_vs_litert(case: str) -> None:
    tfl, cir, feeds = _lstm_bytes(np.random.default_rng(len(case)), **LSTM_CASES[case])
    _compare(tfl, feeds, circle=cir)


def _lstm_numpy(model: cj.Model, x: np.ndarray, act: Any) -> np.ndarray:
    """A plain float64 LSTM (no CIFG, peephole, projection, clip; batch-major)."""
    p = {k: np.asarray(v, np.float64) for k, v in model.params.items()}
    h = np.zeros((x.shape[0], p["w_hi"].shape[1]))
    c = np.zeros((x.shape[0], p["w_xi"].shape[0]))
    ys = []
    for t in range(x.shape[1]):
        z = {g: x[:, t] @ p[f"w_x{g}"].T + h @ p[f"w_h{g}"].T + p[f"bias_{g}"] for g in "ifco"}
        c = _sigmoid(z["f"]) * c + _sigmoid(z["i"]) * act(z["c"])
        h = _sigmoid(z["o"]) * act(c)
        ys.append(h)
    return np.stack(ys, axis=1)


@pytest.mark.parametrize("act", ["NONE", "TANH"])
def test_lstm_vs_numpy(act: str) -> None:
    """Activation NONE is checked against numpy only: LiteRT's kernel leaves its output scratch
    buffer unwritten for kTfLiteActNone (ApplyActivationToVector returns early), so its output
    is garbage; the intended meaning is the identity."""
    _, cir, feeds = _lstm_bytes(np.random.default_rng(16),
                                options={"fused_activation_function": act})
    model = cj.load(cir)
    want = _lstm_numpy(model, feeds[0].astype(np.float64), np.tanh if act == "TANH" else
                       (lambda v: v))
    for fn in (jax.jit(model.apply), model.apply):
        np.testing.assert_allclose(np.asarray(fn(model.params, *feeds)[0]), want,
                                   rtol=1e-5, atol=1e-6)


def test_lstm_diagonal_recurrent_weights() -> None:
    """diagonal_recurrent_tensors: recurrent weights are [n_cell] vectors, used elementwise."""
    tfl, cir, feeds = _lstm_bytes(np.random.default_rng(11), diagonal=True)
    _compare(tfl, feeds, circle=cir)


@pytest.mark.parametrize("case", ["basic", "everything"])
def test_lstm_gradients(case: str) -> None:
    kwargs: dict[str, Any] = {"n_in": 2, "n_cell": 2, "batch": 1}  # small: eager runs too
    if case == "everything":  # clips far from the values reached (no kinks in the FD range)
        kwargs = {"layer_norm": True, "cifg": True, "peephole": True, "projection": 2,
                  "options": {"cell_clip": 5.0, "proj_clip": 5.0}}
    _, cir, feeds = _lstm_bytes(np.random.default_rng(12), steps=2, **kwargs)
    check_grads_x64(cj.load(cir), feeds, eager=case == "basic")


def test_lstm_cell_clip_gradient_rule() -> None:
    """At and beyond cell_clip the cell state passes no gradient (TF's clip rule)."""
    _, cir, feeds = _lstm_bytes(np.random.default_rng(13), steps=1,
                                options={"cell_clip": 1e-3})
    model = cj.load(cir)
    x = feeds[0] * 50  # saturate every cell
    g = jax.jit(jax.grad(lambda p: model.apply(p, x)[0].sum()))(model.params)
    assert float(np.abs(np.asarray(g["w_xc"])).max()) == 0.0
    assert float(np.abs(np.asarray(g["w_xo"])).max()) > 0.0


def test_mnist_lstm_model_vs_litert() -> None:
    """TFLM's MNIST LSTM (LSTM -> RESHAPE -> FULLY_CONNECTED -> SOFTMAX), whole model."""
    data = Path(shared_model("tflm_mnist_lstm_float.tflite")).read_bytes()
    x = np.random.default_rng(14).uniform(0, 1, (1, 28, 28)).astype(np.float32)
    _compare(data, [x])


def test_mnist_lstm_model_loads_unmodified() -> None:
    data = Path(shared_model("tflm_mnist_lstm_float.tflite")).read_bytes()
    model = cj.load(data)
    x = np.random.default_rng(15).uniform(0, 1, (1, 28, 28)).astype(np.float32)
    (want,) = run_litert(data, [x])
    assert_close(np.asarray(jax.jit(model.apply)(model.params, x)[0]), want, RTOL, ATOL, "mnist")


# ---------------------------------------------------------------- GRU (numpy reference)

def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _gru_numpy(x, w_x, b_x, w_h, b_h, h, return_sequences):
    """onert-micro's GRU step loop (float64): z, r from summed projections, reset after."""
    hs = []
    for t in range(x.shape[0]):
        a = h @ w_h.T + (0 if b_h is None else b_h)
        bx = x[t] @ w_x.T + (0 if b_x is None else b_x)
        a0, a1, a2 = np.split(a, 3, axis=-1)
        b0, b1, b2 = np.split(bx, 3, axis=-1)
        z, r = _sigmoid(a0 + b0), _sigmoid(a1 + b1)
        h = z * h + (1 - z) * np.tanh(b2 + r * a2)
        hs.append(h)
    return np.stack(hs) if return_sequences else h


def _gru_inputs(rng: np.random.Generator, steps: int, batch: int, n_in: int, hidden: int,
                biases: bool, state_input: bool) -> list[Any]:
    def w(*dims: int) -> Any:
        return Const((rng.normal(size=dims) * 0.5).astype(np.float32))

    state = (rng.normal(size=(batch, hidden)) * 0.5).astype(np.float32)
    return [
        rng.normal(size=(steps, batch, n_in)).astype(np.float32),
        w(3 * hidden, n_in), w(3 * hidden) if biases else None,
        w(3 * hidden, hidden), w(3 * hidden) if biases else None,
        state if state_input else Const(np.zeros((batch, hidden), np.float32)),
    ]


GRU_CASES = {
    "last_state": dict(steps=5, batch=1, n_in=3, hidden=4, biases=True, state_input=False,
                       return_sequences=False),
    "sequences_batch2": dict(steps=4, batch=2, n_in=2, hidden=3, biases=True,
                             state_input=True, return_sequences=True),
    "no_biases": dict(steps=3, batch=1, n_in=4, hidden=2, biases=False, state_input=True,
                      return_sequences=False),
}


@pytest.mark.parametrize("case", list(GRU_CASES))
def test_gru_vs_numpy(case: str) -> None:
    """LiteRT cannot run Circle's GRU (code -5): compare with a numpy transcription."""
    kw = dict(GRU_CASES[case])
    rs = kw.pop("return_sequences")
    inputs = _gru_inputs(np.random.default_rng(20), **kw)
    b, feeds = one_op_model("GRU", inputs, {"return_sequences": rs})
    vals = [None if v is None else np.asarray(v.value if isinstance(v, Const) else v, np.float64)
            for v in inputs]
    want = _gru_numpy(*vals, rs)
    for data in (b.to_bytes("circle"), b.to_bytes("tflite")):
        for jit in (True, False):
            (got,) = run_circle_jax(data, feeds, jit=jit)
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gru_gradients() -> None:
    kw = dict(GRU_CASES["no_biases"])
    rs = kw.pop("return_sequences")
    check_op_grads("GRU", _gru_inputs(np.random.default_rng(21), **kw), {"return_sequences": rs})


def test_gru_gradients_sequences_jit() -> None:
    """The batch-2, return_sequences case, jitted only (eager runs are covered above)."""
    kw = dict(GRU_CASES["sequences_batch2"])
    rs = kw.pop("return_sequences")
    b, feeds = one_op_model("GRU", _gru_inputs(np.random.default_rng(23), **kw),
                            {"return_sequences": rs})
    check_grads_x64(cj.load(b.to_bytes("circle")), feeds, eager=False)


def test_gru_rejects_other_activations() -> None:
    inputs = _gru_inputs(np.random.default_rng(22), 2, 1, 2, 2, True, False)
    with pytest.raises(NotImplementedError, match="tanh"):
        one_op_model("GRU", inputs, {"fused_activation_function": "RELU"})


# ---------------------------------------------------------------- ROPE (numpy reference)

def _rope_numpy(x: np.ndarray, sin: np.ndarray, cos: np.ndarray, mode: str) -> np.ndarray:
    """ONE's GPT_NEOX kernel loop (rotate halves); GPT_J rotates adjacent pairs."""
    out = np.empty_like(x)
    d = x.shape[-1]
    sin, cos = np.broadcast_to(sin, x.shape), np.broadcast_to(cos, x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        v, s, c = x[idx], sin[idx], cos[idx]
        pairs = [(i, i + d // 2) for i in range(d // 2)] if mode == "GPT_NEOX" else \
            [(2 * i, 2 * i + 1) for i in range(d // 2)]
        for a, b in pairs:
            out[idx + (a,)] = v[a] * c[a] - v[b] * s[a]
            out[idx + (b,)] = v[a] * s[b] + v[b] * c[b]
    return out


def _rope_inputs(rng: np.random.Generator, shape: tuple[int, ...],
                 table_shape: tuple[int, ...]) -> list[Any]:
    d = shape[-1]
    pos = np.arange(int(np.prod(table_shape[:-1]))).reshape(table_shape[:-1] + (1,)) + 1
    theta = pos * (10000.0 ** (-np.arange(d // 2) * 2 / d))
    angles = np.concatenate([theta, theta], -1).astype(np.float32)
    return [rng.normal(size=shape).astype(np.float32),
            Const(np.sin(angles)), Const(np.cos(angles))]


# RoPEOptions.mode by value (the builder reads the option name "mode" as MirrorPadMode).
ROPE_MODES = {name: getattr(schema.RoPEMode.RoPEMode, name) for name in ("GPT_NEOX", "GPT_J")}

ROPE_CASES = [
    ("GPT_NEOX", (1, 2, 1, 8), (1, 1, 1, 8)),  # one token: what ONE's kernel supports
    ("GPT_NEOX", (2, 3, 4, 6), (1, 1, 4, 6)),  # a table row per position, broadcast on heads
    ("GPT_J", (1, 2, 3, 4), (1, 1, 3, 4)),
]


@pytest.mark.parametrize("mode,shape,table", ROPE_CASES)
def test_rope_vs_numpy(mode: str, shape: tuple[int, ...], table: tuple[int, ...]) -> None:
    """LiteRT cannot run Circle's ROPE (code -7): compare with a numpy transcription."""
    inputs = _rope_inputs(np.random.default_rng(30), shape, table)
    b, feeds = one_op_model("ROPE", inputs, {"mode": ROPE_MODES[mode]})
    x, sin, cos = (v.value if isinstance(v, Const) else v for v in inputs)
    want = _rope_numpy(x, sin, cos, mode)
    for jit in (True, False):
        (got,) = run_circle_jax(b.to_bytes("circle"), feeds, jit=jit)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_rope_matches_one_kernel_test_vector() -> None:
    """The expected values of ONE's own RoPE kernel test (luci-interpreter, cker)."""
    b, feeds = one_op_model("ROPE", [np.array([0, 1, 2, 3], np.float32).reshape(1, 1, 1, 4),
                                     Const(np.array([[[[0.5, 1.0, 1.0, 0.5]]]], np.float32)),
                                     Const(np.array([[[[1.0, 0.5, 0.5, 1.0]]]], np.float32))],
                            {"mode": ROPE_MODES["GPT_NEOX"]})
    (got,) = run_circle_jax(b.to_bytes("circle"), feeds)
    np.testing.assert_array_equal(got.ravel(), [-1.0, -2.5, 1.0, 3.5])


@pytest.mark.parametrize("mode,shape,table", ROPE_CASES[1:])
def test_rope_gradients(mode: str, shape: tuple[int, ...], table: tuple[int, ...]) -> None:
    check_op_grads("ROPE", _rope_inputs(np.random.default_rng(31), shape, table),
                   {"mode": ROPE_MODES[mode]})
