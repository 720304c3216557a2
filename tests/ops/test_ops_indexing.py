"""Indexing operators (circle_jax/ops/indexing.py): LiteRT conformance rows and gradients."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.train import Trainer
from tests.conformance import Const, check_op, check_op_grads, one_op_model, run_litert

RNG = np.random.default_rng(20240612)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i32(values: Any) -> Const:
    return Const(np.asarray(values, np.int32))


def check_folded(op: str, inputs: list, options: dict | None = None, **kw: Any) -> None:
    """Every input constant: folded at lowering; dtypes must survive with x64 on and off."""
    with jax.enable_x64(True):
        check_op(op, inputs, options, **kw)
    b, feeds = one_op_model(op, inputs, options, **kw)
    want = run_litert(b.to_bytes("tflite"), feeds)
    m = cj.load(b.to_bytes("circle"))
    for g, w in zip(m.apply(m.params), want):
        assert isinstance(g, np.ndarray) and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


X = f32(3, 4, 5)


# ---------------------------------------------------------------- GATHER / GATHER_ND

@pytest.mark.parametrize("params, indices, options", [
    (X, np.array([2, 0, 2], np.int32), {"axis": 0}),
    (X, np.array([[3, 1], [0, 0]], np.int32), {"axis": 1}),
    (X, np.array([4, 1], np.int64), {"axis": -1}),
    (X, np.array(2, np.int32), {"axis": 1}),                                 # scalar index
    (X, np.array([[1, 0], [3, 3], [2, 1]], np.int32), {"axis": 1, "batch_dims": 1}),
    (X, np.array([[1], [3], [2]], np.int32), {"axis": 2, "batch_dims": -1}),
    (f32(2, 3, 4), np.array([[[1, 0], [2, 2], [0, 1]], [[2, 1], [0, 0], [1, 1]]], np.int32),
     {"axis": 2, "batch_dims": 2}),
    (np.arange(12, dtype=np.int32).reshape(4, 3), np.array([3, 1], np.int32), {"axis": 0}),
], ids=["axis0", "axis1-2d", "int64-neg-axis", "scalar", "batch1", "batch-neg", "batch2",
        "int32-params"])
def test_gather(params: np.ndarray, indices: np.ndarray, options: dict) -> None:
    check_op("GATHER", [params, indices], options)


def test_gather_folded() -> None:
    check_folded("GATHER", [Const(np.arange(12, dtype=np.int64).reshape(4, 3)),
                            Const(np.array([[3, 0], [1, 1]], np.int64))], {"axis": 0})


def test_gather_embedding_gradient_flows_to_table() -> None:
    """The classic embedding: a float table (a param) gathered by int ids."""
    ids = np.array([[1, 4, 1], [0, 2, 4]], np.int32)
    check_op_grads("GATHER", [Const(f32(5, 3)), ids], {"axis": 0})
    model, _ = one_op_model("GATHER", [Const(f32(5, 3)), ids], {"axis": 0})
    m = cj.load(model.to_bytes("circle"))
    (name,) = m.params
    g = jax.grad(lambda p: jnp.sum(m.apply(p, ids)[0]))(m.params)[name]
    np.testing.assert_array_equal(g[:, 0], [1, 2, 1, 0, 2])  # rows count how often they're used


# ---------------------------------------------------------------- EMBEDDING_LOOKUP

def test_embedding_lookup() -> None:
    """Rows of the table at rank-1 ids, as LiteRT's kernel; the table is a trainable param
    (its gradient: float64 finite differences) and a batch of ids runs as one graph."""
    ids, table = np.array([1, 4, 1, 0], np.int32), f32(5, 2, 3)
    kw = {"shapes": [(4, 2, 3)], "dtypes": ["float32"]}
    check_op("EMBEDDING_LOOKUP", [ids, Const(table)], **kw)
    check_op_grads("EMBEDDING_LOOKUP", [ids, Const(table)], **kw)
    b, _ = one_op_model("EMBEDDING_LOOKUP", [ids, Const(table)], **kw)
    m = cj.load(b.to_bytes("circle"))
    assert [r.reason for r in m.param_roles.values()] == [
        "embedding table of EMBEDDING_LOOKUP #0"] and m.batch_blocker is None
    # the keras profile's Adam takes its per-occurrence squared gradients (test_numerics)
    assert Trainer(m, batch_size=4, optimizer="adam", numerics="keras").row_squares == set(
        m.params)


@pytest.mark.parametrize("ids, table, dtype, message", [
    (np.array([[1, 0]], np.int32), f32(5, 3), "float32", "ids must be rank 1"),
    (np.array([1, 0], np.int32), f32(5), "float32", "table must have rank >= 2"),
    (np.array([1, 0], np.int32), np.ones((5, 3), np.uint8), "float32", "hybrid"),
], ids=["ids-rank", "table-rank", "hybrid"])
def test_embedding_lookup_refusals(ids: np.ndarray, table: np.ndarray, dtype: str,
                                   message: str) -> None:
    shape = (*ids.shape, *table.shape[1:])
    b, _ = one_op_model("EMBEDDING_LOOKUP", [ids, Const(table)], shapes=[shape],
                        dtypes=[dtype])
    with pytest.raises(cj.CircleJaxError, match=message):
        cj.load(b.to_bytes("circle"))


@pytest.mark.parametrize("params, indices", [
    (X, np.array([[0, 1], [2, 3]], np.int32)),
    (X, np.array([[[0, 1, 4]], [[2, 3, 0]]], np.int32)),
    (X, np.array([2, 1], np.int64)),
    (X, np.array([[1], [0]], np.int32)),
])
def test_gather_nd(params: np.ndarray, indices: np.ndarray) -> None:
    check_op("GATHER_ND", [params, indices])


# ---------------------------------------------------------------- SCATTER_ND

@pytest.mark.parametrize("indices, updates, shape", [
    (np.array([[0], [2]], np.int32), f32(2, 4), [3, 4]),
    (np.array([[0, 1], [2, 3], [0, 1]], np.int32), f32(3), [3, 4]),          # duplicates sum
    (np.array([[[1, 0]], [[0, 2]]], np.int32), f32(2, 1, 5), [2, 3, 5]),
], ids=["rows", "duplicates", "nested"])
def test_scatter_nd(indices: np.ndarray, updates: np.ndarray, shape: list) -> None:
    check_op("SCATTER_ND", [indices, updates, i32(shape)])


def test_scatter_nd_folded() -> None:
    check_folded("SCATTER_ND", [i32([[1], [1], [3]]), Const(np.array([5, 6, 7], np.int64)),
                                i32([4])])


# ---------------------------------------------------------------- ONE_HOT

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis: int) -> None:
    indices = np.array([[0, 3, 1], [2, -1, 5]], np.int32)  # -1 and 5 are out of range: all off
    check_op("ONE_HOT", [indices, i32(4), Const(np.float32(2.0)), Const(np.float32(-0.5))],
             {"axis": axis})


def test_one_hot_int_and_runtime_values() -> None:
    indices = np.array([1, 0, 2], np.int64)
    check_op("ONE_HOT", [indices, i32(3), Const(np.int32(1)), Const(np.int32(0))], {"axis": -1})
    check_op("ONE_HOT", [indices, i32(3), np.array(4.0, np.float32),
                         np.array(1.0, np.float32)], {"axis": 0})


# ---------------------------------------------------------------- CUMSUM

@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [1, -1])
def test_cumsum(exclusive: bool, reverse: bool, axis: int) -> None:
    check_op("CUMSUM", [X, i32(axis)], {"exclusive": exclusive, "reverse": reverse})


def test_cumsum_int() -> None:
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    check_op("CUMSUM", [x, i32(0)], {"exclusive": True, "reverse": True})


# ---------------------------------------------------------------- TOPK_V2

TIES = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0, 1.0, 2.0]], np.float32)


@pytest.mark.parametrize("x, k", [(TIES, 4), (f32(2, 3, 7), 3), (TIES, 6),
                                  (np.array([5, 1, 5, 7, 1], np.int32), 4)],
                         ids=["ties", "3d", "all", "int32"])
def test_topk_v2(x: np.ndarray, k: int) -> None:
    values, indices = check_op("TOPK_V2", [x, i32(k)], outputs=2)
    assert indices.dtype == np.int32


def test_topk_v2_ties_lower_index_first() -> None:
    model, _ = one_op_model("TOPK_V2", [TIES, i32(4)], outputs=2)
    m = cj.load(model.to_bytes("circle"))
    np.testing.assert_array_equal(m.apply(m.params, TIES)[1], [[1, 2, 4, 3], [0, 1, 2, 3]])


def test_topk_v2_folded() -> None:
    check_folded("TOPK_V2", [Const(np.array([[4, 9, 4, 1], [7, 7, 8, 7]], np.int64)), i32(3)],
                 outputs=2)


# ---------------------------------------------------------------- ARG_MAX / ARG_MIN

@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
@pytest.mark.parametrize("output_type, x64", [("int32", False), ("int64", True),
                                              ("int32", True)])
@pytest.mark.parametrize("axis", [0, -1])
def test_arg_max_min(op: str, output_type: str, x64: bool, axis: int) -> None:
    with jax.enable_x64(x64):
        out = check_op(op, [TIES, i32([axis])], {"output_type": output_type})[0]
    assert out.dtype == np.dtype(output_type)


def test_arg_max_first_wins_and_int_input() -> None:
    x = np.array([[3, 7, 7, 1], [2, 2, -5, -5]], np.int32)
    check_op("ARG_MAX", [x, i32(1)], {"output_type": "int32"})
    check_op("ARG_MIN", [x, i32(1)], {"output_type": "int32"})
    model, _ = one_op_model("ARG_MAX", [TIES, i32(1)], {"output_type": "int32"})
    m = cj.load(model.to_bytes("circle"))
    np.testing.assert_array_equal(m.apply(m.params, TIES)[0], [1, 0])


def test_arg_max_folded() -> None:
    check_folded("ARG_MAX", [Const(np.array([[1, 5, 5], [9, 0, 9]], np.int32)), i32(1)],
                 {"output_type": "int64"})


def test_arg_max_feeds_model_metric() -> None:
    """ARG_MAX downstream of a float op inside one model (the categorical-accuracy pattern)."""
    b = Builder()
    x = b.input("x", (4, 3))
    y = b.op("ADD", [x, b.constant("bias", f32(3))], {})
    b.output(b.op("ARG_MAX", [y, b.constant("axis", np.array(1, np.int32))],
                  {"output_type": "int32"}))
    m = cj.load(b.to_bytes("circle"))
    xs = f32(4, 3)
    want = np.argmax(xs + np.asarray(m.params["bias"]), axis=1)
    np.testing.assert_array_equal(jax.jit(m.apply)(m.params, xs)[0], want)


# ---------------------------------------------------------------- gradients

GRADS = [
    ("GATHER", [X, np.array([[1, 0], [3, 3], [2, 1]], np.int32)],
     {"axis": 1, "batch_dims": 1}, 1),
    ("GATHER_ND", [X, np.array([[0, 1], [2, 3], [0, 1]], np.int32)], {}, 1),
    ("SCATTER_ND", [np.array([[0, 1], [2, 3], [0, 1]], np.int32), f32(3, 5), i32([3, 4, 5])],
     {}, 1),
    ("ONE_HOT", [np.array([0, 2, 1], np.int32), i32(3), Const(np.float32(2.0)),
                 Const(np.float32(-0.5))], {"axis": -1}, 1),
    ("CUMSUM", [X, i32(1)], {"exclusive": True, "reverse": True}, 1),
    ("CUMSUM", [X, i32(2)], {}, 1),
    ("TOPK_V2", [f32(2, 6), i32(3)], {}, 2),
]


@pytest.mark.parametrize("op, inputs, options, n", GRADS,
                         ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_gradients(op: str, inputs: list, options: dict, n: int) -> None:
    check_op_grads(op, inputs, options, outputs=n)
