"""IF, WHILE and STABLEHLO_COMPOSITE: builder models with subgraphs, LiteRT vs circle-jax."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flatbuffers import flexbuffers

import circle_jax as cj
from circle_jax.build import Builder, GraphBuilder
from circle_jax.formats.schema import schema
from circle_jax.formats.writer import pack
from tests.conformance import ATOL, RTOL, assert_close, check_grads_x64, run_circle_jax, run_litert
from tests.paths import shared_model

SHAPE = (2, 3)


def _compare(data: bytes, feeds: Sequence[np.ndarray], tflite: bytes | None = None) -> None:
    """LiteRT on the .tflite bytes vs circle-jax (jit and eager) on ``data``."""
    want = run_litert(tflite or data, feeds)
    for jit in (True, False):
        got = run_circle_jax(data, feeds, jit=jit)
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype, f"output {k}: dtype {g.dtype} != LiteRT {w.dtype}"
            assert_close(g, w, RTOL, ATOL, f"jit={jit} output {k}")


# ---------------------------------------------------------------- IF

def _if_model(rng: np.random.Generator, static_cond: bool | None = None) -> Builder:
    """cond ? (x * w + k, x) : (tanh(x) - k, x * x); k is a static int32 operand cast to float."""
    b = Builder()
    then_g, else_g = b.subgraph("then"), b.subgraph("else")
    for g, sign in ((then_g, 1), (else_g, -1)):
        x, k = g.input("x", SHAPE), g.input("k", (), "int32")
        kf = g.op("CAST", [k], {"in_data_type": "int32", "out_data_type": "float32"})
        if sign > 0:
            w = g.constant("w_then", rng.normal(size=SHAPE).astype(np.float32))
            y = g.op("ADD", [g.op("MUL", [x, w]), kf])
            g.output(y, x)
        else:
            y = g.op("SUB", [g.op("TANH", [x]), kf])
            g.output(y, g.op("MUL", [x, x]))
    if static_cond is None:
        c = b.input("cond", (1,), "bool")
    else:
        c = b.constant("cond", np.array([static_cond]))
    x = b.input("x", SHAPE)
    k = b.constant("k", np.int32(3))
    y = b.op("IF", [c, x, k], {"then_subgraph_index": then_g.index,
                               "else_subgraph_index": else_g.index}, outputs=2)
    b.output(*y)
    return b


@pytest.mark.parametrize("cond", [True, False])
def test_if_runtime_condition(cond: bool) -> None:
    rng = np.random.default_rng(0)
    b = _if_model(rng)
    x = rng.normal(size=SHAPE).astype(np.float32)
    _compare(b.to_bytes("tflite"), [np.array([cond]), x])
    _compare(b.to_bytes("circle"), [np.array([cond]), x], b.to_bytes("tflite"))


@pytest.mark.parametrize("cond", [True, False])
def test_if_static_condition_runs_one_branch(cond: bool) -> None:
    rng = np.random.default_rng(1)
    b = _if_model(rng, static_cond=cond)
    x = rng.normal(size=SHAPE).astype(np.float32)
    _compare(b.to_bytes("tflite"), [x])
    # With a constant condition only the chosen branch is traced: no cond in the jaxpr.
    model = cj.load(b.to_bytes("circle"))
    jaxpr = str(jax.make_jaxpr(model.apply)(model.params, x))
    assert "cond[" not in jaxpr and ("tanh" in jaxpr) != cond


@pytest.mark.parametrize("cond", [True, False])
def test_if_gradients(cond: bool) -> None:
    rng = np.random.default_rng(2)
    model = cj.load(_if_model(rng).to_bytes("circle"))
    x = rng.normal(size=SHAPE).astype(np.float32)
    for out in (0, 1):
        check_grads_x64(model, [np.array([cond]), x], out)
    # The untaken branch's parameter gets an exactly zero gradient.
    g = jax.grad(lambda p: model.apply(p, np.array([False]), x)[0].sum())(model.params)
    assert float(jnp.abs(g["w_then"]).max()) == 0.0


# ---------------------------------------------------------------- WHILE

def _scalar_op(g: GraphBuilder, op: str, inputs: list[int], dtype: str = "int32") -> int:
    """An op on scalar tensors. Shapes are given because the builder's shape inference sees
    scalar constants as shape [1] (np.ascontiguousarray makes 0-d data 1-d)."""
    return g.op(op, inputs, shapes=[()], dtypes=[dtype])


def _counted_loop(
    rng: np.random.Generator, n: int, counter_input: bool, extra: Callable | None = None
) -> tuple[Builder, list[np.ndarray]]:
    """for (i = i0; i < n; i++) x = tanh(x * w + b); outputs (i, x)."""
    b = Builder()
    cond_g, body_g = b.subgraph("cond"), b.subgraph("body")
    i, x = cond_g.input("i", (), "int32"), cond_g.input("x", SHAPE)
    cond_g.output(_scalar_op(cond_g, "LESS", [i, cond_g.constant("n", np.int32(n))], "bool"))
    i, x = body_g.input("i", (), "int32"), body_g.input("x", SHAPE)
    w = body_g.constant("w", rng.uniform(0.5, 1.5, SHAPE).astype(np.float32))
    bias = body_g.constant("b", rng.normal(size=(SHAPE[1],)).astype(np.float32) * 0.1)
    y = body_g.op("TANH", [body_g.op("ADD", [body_g.op("MUL", [x, w]), bias])])
    body_g.output(_scalar_op(body_g, "ADD", [i, body_g.constant("one", np.int32(1))]), y)
    feeds = []
    if counter_input:
        i0 = b.input("i0", (), "int32")
        feeds.append(np.int32(1))
    else:
        i0 = b.constant("i0", np.int32(0))
    x0 = b.input("x0", SHAPE)
    feeds.append(rng.normal(size=SHAPE).astype(np.float32))
    out = b.op("WHILE", [i0, x0], {"cond_subgraph_index": cond_g.index,
                                   "body_subgraph_index": body_g.index},
               outputs=2, shapes=[(), SHAPE], dtypes=["int32", "float32"])
    b.output(*out)
    return b, feeds


def _numpy_loop(model: cj.Model, i: int, n: int, x: np.ndarray) -> np.ndarray:
    w, bias = np.asarray(model.params["w"]), np.asarray(model.params["b"])
    while i < n:
        x, i = np.tanh(x * w + bias), i + 1
    return x


@pytest.mark.parametrize("counter_input", [False, True], ids=["static_trips", "runtime_trips"])
def test_while_vs_litert(counter_input: bool) -> None:
    b, feeds = _counted_loop(np.random.default_rng(3), 4, counter_input)
    _compare(b.to_bytes("tflite"), feeds)
    _compare(b.to_bytes("circle"), feeds, b.to_bytes("tflite"))
    model = cj.load(b.to_bytes("circle"))
    np.testing.assert_allclose(
        np.asarray(jax.jit(model.apply)(model.params, *feeds)[1]),
        _numpy_loop(model, int(feeds[0]) if counter_input else 0, 4, feeds[-1]), RTOL, ATOL,
    )


def test_while_static_trip_count_is_a_scan_and_differentiable() -> None:
    b, feeds = _counted_loop(np.random.default_rng(4), 5, counter_input=False)
    model = cj.load(b.to_bytes("circle"))
    jaxpr = str(jax.make_jaxpr(model.apply)(model.params, *feeds))
    assert "scan[" in jaxpr and "while[" not in jaxpr
    check_grads_x64(model, feeds, out=1)


def test_while_runtime_trip_count_is_a_while_loop() -> None:
    b, feeds = _counted_loop(np.random.default_rng(5), 5, counter_input=True)
    model = cj.load(b.to_bytes("circle"))
    jaxpr = str(jax.make_jaxpr(model.apply)(model.params, *feeds))
    assert "while[" in jaxpr
    # Forward-mode differentiation works through lax.while_loop (reverse mode does not).
    _, tangent = jax.jvp(lambda x: model.apply(model.params, feeds[0], x)[1],
                         (feeds[1],), (np.ones(SHAPE, np.float32),))
    assert np.all(np.isfinite(np.asarray(tangent)))


def test_while_zero_trips_returns_inputs() -> None:
    b, feeds = _counted_loop(np.random.default_rng(6), 0, counter_input=False)
    _compare(b.to_bytes("tflite"), feeds)


def test_while_cond_of_shape_one() -> None:
    """The cond subgraph may return a bool tensor of shape [1] instead of []."""
    b = Builder()
    cond_g, body_g = b.subgraph("cond"), b.subgraph("body")
    x = cond_g.input("x", (1,))
    cond_g.output(cond_g.op("LESS", [x, cond_g.constant("lim", np.array([10.0], np.float32))]))
    x = body_g.input("x", (1,))
    body_g.output(body_g.op("MUL", [x, body_g.constant("two", np.array([2.0], np.float32))]))
    x0 = b.input("x0", (1,))
    b.output(b.op("WHILE", [x0], {"cond_subgraph_index": 1, "body_subgraph_index": 2}))
    feeds = [np.array([0.3], np.float32)]
    _compare(b.to_bytes("tflite"), feeds)
    model = cj.load(b.to_bytes("circle"))
    assert float(model(*feeds)[0][0]) == pytest.approx(0.3 * 2**6)


def test_while_unrolls_when_body_needs_static_loop_variable() -> None:
    """A varying loop variable used as a reduction axis must stay static: the loop unrolls.

    LiteRT runs this too, but its MEAN with a run-time axis inside WHILE is not what we want to
    pin down here; the reference is a numpy loop.
    """
    b = Builder()
    cond_g, body_g = b.subgraph("cond"), b.subgraph("body")
    i, a, x = cond_g.input("i", (), "int32"), cond_g.input("a", (1,), "int32"), \
        cond_g.input("x", (3, 3))
    cond_g.output(_scalar_op(cond_g, "LESS", [i, cond_g.constant("n", np.int32(3))], "bool"))
    i, a, x = body_g.input("i", (), "int32"), body_g.input("a", (1,), "int32"), \
        body_g.input("x", (3, 3))
    mean = body_g.op("MEAN", [x, a], {"keep_dims": True}, shapes=[(3, 3)])
    body_g.output(_scalar_op(body_g, "ADD", [i, body_g.constant("one", np.int32(1))]),
                  body_g.op("SUB", [body_g.constant("one_v", np.array([1], np.int32)), a]),
                  body_g.op("SUB", [x, mean], shapes=[(3, 3)]))
    x0 = b.input("x0", (3, 3))
    out = b.op("WHILE", [b.constant("i0", np.int32(0)), b.constant("a0", np.array([0], np.int32)),
                         x0], {"cond_subgraph_index": 1, "body_subgraph_index": 2},
               outputs=3, shapes=[(), (1,), (3, 3)], dtypes=["int32", "int32", "float32"])
    b.output(out[2])
    x = np.random.default_rng(7).normal(size=(3, 3)).astype(np.float32)
    want, axis = x.copy(), 0
    for _ in range(3):
        want, axis = want - want.mean(axis=axis, keepdims=True), 1 - axis
    model = cj.load(b.to_bytes("circle"))
    for fn in (model.apply, jax.jit(model.apply)):
        np.testing.assert_allclose(np.asarray(fn(model.params, x)[0]), want, atol=1e-6)


def test_one_vscode_while_model() -> None:
    """ONE's WHILE test model (CIR0; LiteRT cannot read it, onert fails on it): numpy loop.

    Its loop runs while i == 10 and its body turns x [2,3] into x^T @ c [3,3], so the loop can
    only be followed eagerly (shapes change); under jit with a run-time counter it is refused
    with a clear error.
    """
    path = shared_model("one_vscode_while_000.circle")
    ir = cj.read_model(path)
    assert cj.unsupported_operators(ir) == []
    model = cj.Model(ir)
    c = ir.subgraphs[2].tensors[3].data
    x = np.random.default_rng(8).normal(size=(2, 3)).astype(np.float32)
    for i0 in (3, 10):
        i, xs = i0, x
        while i == 10:
            i, xs = i + 1, xs.T @ c
        (got,) = model.apply(model.params, np.int32(i0), x)
        assert int(got) == i
        # The float loop variable is not a model output: read it among the intermediates.
        got_x = model.intermediates(model.params, np.int32(i0), x)["ofm2"]
        np.testing.assert_allclose(np.asarray(got_x), xs, rtol=1e-6)
    with pytest.raises(ValueError, match="changes the shape"):
        jax.jit(model.apply)(model.params, np.int32(3), x)


# ---------------------------------------------------------------- STABLEHLO_COMPOSITE

def _composite_model(rng: np.random.Generator) -> bytes:
    """A composite whose decomposition computes tanh(x * w) + y."""
    b = Builder()
    dec = b.subgraph("my.composite.impl")
    dx, dy = dec.input("x", SHAPE), dec.input("y", SHAPE)
    w = dec.constant("w", rng.normal(size=SHAPE).astype(np.float32))
    dec.output(dec.op("ADD", [dec.op("TANH", [dec.op("MUL", [dx, w])]), dy]))
    x, y = b.input("x", SHAPE), b.input("y", SHAPE)
    b.output(b.op("STABLEHLO_COMPOSITE", [x, y], shapes=[SHAPE]))
    m = b.to_object()
    op = m.subgraphs[0].operators[0]
    opts = schema.StableHLOCompositeOptions.StableHLOCompositeOptionsT()
    opts.name, opts.decompositionSubgraphIndex, opts.version = "my.composite", dec.index, 1
    opts.compositeAttributes = list(flexbuffers.Dumps({"scale": 0.5}))  # LiteRT requires it
    op.builtinOptions2Type = schema.BuiltinOptions2.BuiltinOptions2.StableHLOCompositeOptions
    op.builtinOptions2 = opts
    return m


def test_stablehlo_composite_vs_litert() -> None:
    rng = np.random.default_rng(9)
    m = _composite_model(rng)
    feeds = [rng.normal(size=SHAPE).astype(np.float32) for _ in range(2)]
    _compare(pack(m, "tflite"), feeds)
    model = cj.load(pack(m, "circle"))
    assert model.ir.main.operators[0].options.decomposition_subgraph_index == 1
    check_grads_x64(model, feeds)


def test_sdpa_composite_model() -> None:
    """ai-edge-torch's scaled-dot-product-attention composite, whole model vs LiteRT."""
    path = shared_model("aeq_sdpa_composite.tflite")
    assert cj.unsupported_operators(cj.read_model(path)) == []
    with open(path, "rb") as f:
        data = f.read()
    x = np.random.default_rng(10).normal(size=(1, 32, 128)).astype(np.float32)
    _compare(data, [x])
