"""Shape operators (circle_jax/ops/shape.py): LiteRT conformance rows and gradient checks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.errors import DataError
from tests.conformance import Const, check_op, check_op_grads, one_op_model, run_litert

RNG = np.random.default_rng(20240611)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i32(values: Any) -> Const:
    return Const(np.asarray(values, np.int32))


def check_folded(op: str, inputs: list, options: dict | None = None, **kw: Any) -> None:
    """Every input constant: circle-jax folds the op at lowering time.

    Under x64, jit keeps int64 outputs (check_op); with x64 off the folded numpy value must
    still carry LiteRT's dtype exactly (jnp would have turned int64 into int32).
    """
    with jax.enable_x64(True):
        check_op(op, inputs, options, **kw)
    b, feeds = one_op_model(op, inputs, options, **kw)
    want = run_litert(b.to_bytes("tflite"), feeds)
    m = cj.load(b.to_bytes("circle"))
    got = m.apply(m.params, *feeds)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray) and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------- RESHAPE and friends

X234 = f32(2, 3, 4)


@pytest.mark.parametrize("inputs, options", [
    ([X234, i32([6, 4])], {"new_shape": [6, 4]}),
    ([X234, i32([-1, 4])], {}),
    ([X234, i32([2, -1, 2])], {}),
    ([X234], {"new_shape": [4, 6]}),                     # shape from the options only
    ([X234], {"new_shape": [24, -1]}),
    ([f32(1, 1)], {"new_shape": []}),                    # to a scalar
    ([np.arange(12, dtype=np.int32).reshape(3, 4), i32([4, 3])], {}),
], ids=["input", "infer", "infer-mid", "options", "options-infer", "scalar", "int32"])
def test_reshape(inputs: list, options: dict) -> None:
    check_op("RESHAPE", inputs, options)


def test_reshape_follows_batch() -> None:
    """onert's convention: a batch-1 model runs at any batch; RESHAPE [1, 32] follows it."""
    b = Builder()
    x = b.input("x", (1, 4, 4, 2))
    y = b.op("RESHAPE", [x, b.constant("shape", np.array([1, 32], np.int32))], {})
    b.output(b.op("FULLY_CONNECTED", [y, b.constant("w", f32(3, 32)), -1], {}))
    m = cj.load(b.to_bytes("circle"))
    xs = f32(8, 4, 4, 2)
    want = xs.reshape(8, 32) @ np.asarray(m.params["w"]).T
    for fn in (m.apply, jax.jit(m.apply)):
        out = fn(m.params, xs)[0]
        assert out.shape == (8, 3)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    inter = m.intermediates(m.params, xs)
    assert inter[m.ir.main.tensors[m.ir.main.operators[0].outputs[0]].name].shape == (8, 32)
    # the declared batch still works, and a shape that cannot follow is an error
    assert m.apply(m.params, xs[:1])[0].shape == (1, 3)
    with pytest.raises(DataError, match=r"input 'x': .* \[3, 4, 4, 1\], .* \[N, 4, 4, 2\]"):
        m.apply(m.params, f32(3, 4, 4, 1))  # named before any operator runs


def test_reshape_needs_static_shape() -> None:
    b = Builder()
    x = b.input("x", (2, 6))
    s = b.input("s", (2,), "int32")
    b.output(b.op("RESHAPE", [x, s], {}, shapes=[(3, 4)]))
    m = cj.load(b.to_bytes("circle"))
    with pytest.raises(ValueError, match="constant known when the model is lowered"):
        jax.jit(m.apply)(m.params, f32(2, 6), np.array([3, 4], np.int32))


@pytest.mark.parametrize("x, dims", [
    (f32(1, 3, 1, 2), [0, 2]), (f32(1, 3, 1, 2), [-2]), (f32(1, 3, 1, 2), []),
])
def test_squeeze(x: np.ndarray, dims: list) -> None:
    check_op("SQUEEZE", [x], {"squeeze_dims": dims})


@pytest.mark.parametrize("axis", [0, 3, -4, [1]])
def test_expand_dims(axis: Any) -> None:
    check_op("EXPAND_DIMS", [X234, i32(axis)])


def test_expand_dims_int64_axis() -> None:
    check_op("EXPAND_DIMS", [X234, Const(np.array(1, np.int64))])


@pytest.mark.parametrize("x, perm", [
    (X234, [2, 0, 1]), (X234, [0, 2, 1]), (f32(2, 3, 4, 5), [0, 3, 1, 2]), (f32(3, 5), [1, 0]),
])
def test_transpose(x: np.ndarray, perm: list) -> None:
    check_op("TRANSPOSE", [x, i32(perm)])


# ---------------------------------------------------------------- CONCATENATION / PACK / SPLIT

ACTIVATIONS = {
    "RELU": lambda v: np.maximum(v, 0), "RELU6": lambda v: np.clip(v, 0, 6),
    # TFLite applies fused activations as clamp ranges; TANH's range is unbounded.
    "RELU_N1_TO_1": lambda v: np.clip(v, -1, 1), "TANH": lambda v: v,
}


@pytest.mark.parametrize("axis, act", [
    (0, "NONE"), (1, "RELU"), (-1, "RELU6"), (2, "RELU_N1_TO_1"), (-2, "TANH"),
])
def test_concatenation(axis: int, act: str) -> None:
    """LiteRT 2.3 refuses fused activations on CONCATENATION (activation != NONE in
    Prepare): with one, LiteRT's plain concatenation plus the activation in numpy is the
    reference."""
    shapes = [list(X234.shape) for _ in range(3)]
    for s, extra in zip(shapes, (1, 2, 3)):
        s[axis] = extra
    xs = [4 * f32(*s) for s in shapes]
    want = check_op("CONCATENATION", xs, {"axis": axis})[0]
    if act != "NONE":
        b, feeds = one_op_model("CONCATENATION", xs,
                                {"axis": axis, "fused_activation_function": act})
        m = cj.load(b.to_bytes("circle"))
        for fn in (m.apply, jax.jit(m.apply)):
            np.testing.assert_allclose(fn(m.params, *xs)[0], ACTIVATIONS[act](want),
                                       rtol=1e-6, atol=1e-6)


def test_concatenation_mixed_constant_and_int() -> None:
    check_op("CONCATENATION", [f32(2, 3), Const(f32(2, 2))], {"axis": 1})
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    check_op("CONCATENATION", [ints, ints + 10], {"axis": 0})
    check_folded("CONCATENATION", [Const(ints.astype(np.int64)), Const(ints.astype(np.int64))],
                 {"axis": -1})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_pack_unpack(axis: int) -> None:
    xs = [f32(2, 3) for _ in range(3)]
    check_op("PACK", xs, {"values_count": 3, "axis": axis})
    x = f32(3, 2, 3)
    n = x.shape[axis]
    check_op("UNPACK", [x], {"num": n, "axis": axis}, outputs=n)


@pytest.mark.parametrize("axis, n", [(1, 3), (-1, 4), (0, 1), (2, 2)])
def test_split(axis: int, n: int) -> None:
    check_op("SPLIT", [i32(axis), X234], {"num_splits": n}, outputs=n)


@pytest.mark.parametrize("sizes, axis", [([1, -1, 2], 2), ([2, 0, 1], 1), ([2], 0)])
def test_split_v(sizes: list, axis: int) -> None:
    check_op("SPLIT_V", [X234, i32(sizes), i32(axis)], {"num_splits": len(sizes)},
             outputs=len(sizes))


# ---------------------------------------------------------------- SLICE / STRIDED_SLICE

@pytest.mark.parametrize("begin, size", [
    ([0, 1, 1], [2, 2, 3]), ([1, 0, 2], [-1, -1, 2]), ([1, 2, 3], [1, 1, 1]),
    ([0, 0, 0], [2, 3, 4]),
])
def test_slice(begin: list, size: list) -> None:
    check_op("SLICE", [X234, i32(begin), i32(size)])


X345 = f32(3, 4, 5)


def strided(x: np.ndarray, begin: list, end: list, strides: list, begin_dynamic: bool = False,
            **options: Any) -> list:
    b = np.asarray(begin, np.int32)
    return [x, b if begin_dynamic else Const(b), i32(end), i32(strides)], options


@pytest.mark.parametrize("args", [
    strided(X345, [1, 0, 1], [3, 4, 5], [1, 2, 2]),
    strided(X345, [-1, -1, -2], [-4, 0, -6], [-1, -2, -1]),                 # backwards
    strided(X345, [5, -9, 1], [-9, 9, 3], [1, 1, 1]),                       # clamped bounds
    strided(X345, [0, 3, 4], [0, 0, 0], [1, -1, -2], begin_mask=0b011),
    strided(X345, [2, 1, 1], [0, 0, 0], [-1, 1, 2], end_mask=0b111),
    strided(X345, [1, -1, 0], [2, 0, 0], [1, 1, 1], shrink_axis_mask=0b011),  # x[1, -1]
    strided(X345, [0, 2, 0], [0, 0, 0], [1, 1, 1], begin_mask=1, end_mask=1,
            shrink_axis_mask=0b010),
    strided(X345, [0, 0, 1], [0, 0, 3], [1, 1, 1], new_axis_mask=0b011),     # x[None, None, 1:3]
    strided(X345, [1, 0, 0], [3, 0, 0], [1, 1, 1], new_axis_mask=0b010),     # x[1:3, None]
    strided(X345, [0, 1], [0, 3], [1, 1], ellipsis_mask=1),                  # x[..., 1:3]
    strided(X345, [1, 0, 2], [2, 0, -1], [1, 1, 1], ellipsis_mask=0b010),    # x[1:2, ..., 2:-1]
    strided(X345, [0, 0, 2], [0, 0, 3], [1, 1, 1], ellipsis_mask=1, new_axis_mask=0b011,
            shrink_axis_mask=0b100),                                          # x[..., None, 2]
    strided(X345, [1, 2], [3, 4], [1, 1]),                                    # trailing axes
    strided(X345, [1, 0, 1], [2, 3, 3], [1, 1, 2], offset=True),
    strided(X345, [-2, 1, 0], [1, 2, 5], [1, 1, 2], offset=True, shrink_axis_mask=1,
            begin_mask=0b100),
    strided(X345, [1, 0, 2], [2, 4, 3], [1, 2, 1], begin_dynamic=True, offset=True),
    strided(np.arange(24, dtype=np.int32).reshape(4, 6), [3, 1], [0, 6], [-2, 2]),
], ids=["strides", "backwards", "clamped", "begin-mask", "end-mask", "shrink",
        "shrink-with-masks", "new-axis", "new-axis-mid", "ellipsis", "ellipsis-mid",
        "ellipsis-new-shrink", "trailing", "offset", "offset-masks", "offset-dynamic", "int32"])
def test_strided_slice(args: tuple) -> None:
    inputs, options = args
    check_op("STRIDED_SLICE", inputs, options)


def test_strided_slice_random_specs_match_litert() -> None:
    """Seeded random specs over every mask (LiteRT vs circle-jax eager, shape and values).

    Shrinking needs an index inside the axis (LiteRT reads out of bounds otherwise) and a
    positive stride (LiteRT 2.3 leaves the element unwritten; circle-jax returns the element
    at begin, checked in test_strided_slice_shrink_negative_stride).
    """
    rng = np.random.default_rng(7)
    checked = 0
    while checked < 40:
        rank = int(rng.integers(1, 5))
        x = rng.standard_normal(rng.integers(1, 6, size=rank)).astype(np.float32)
        n = int(rng.integers(1, rank + 2))
        b, e = rng.integers(-7, 7, size=(2, n)).astype(np.int32)
        s = rng.choice([-3, -2, -1, 1, 2, 3], size=n).astype(np.int32)
        opts = {k: int(rng.integers(0, 2 ** n)) for k in
                ("begin_mask", "end_mask", "shrink_axis_mask", "new_axis_mask")}
        ellipsis = [int(rng.integers(0, n))] if rng.random() < 0.4 else []
        opts["ellipsis_mask"] = sum(1 << i for i in ellipsis)
        new = [i for i in range(n) if opts["new_axis_mask"] >> i & 1 and i not in ellipsis]
        ranges = n - len(new) - len(ellipsis)
        if ranges > rank or (ellipsis and ranges == rank):
            continue
        axis = [0] * n  # input axis of each range entry, to place shrink indices inside it
        pos = 0
        for i in range(n):
            if i in ellipsis:
                pos += rank - ranges
            elif i not in new:
                axis[i], pos = pos, pos + 1
        for i in range(n):
            if opts["shrink_axis_mask"] >> i & 1:
                if i in ellipsis or i in new:
                    continue
                s[i] = abs(s[i])
                b[i] = int(rng.integers(-x.shape[axis[i]], x.shape[axis[i]]))
        model, feeds = one_op_model("STRIDED_SLICE", [x, Const(b), Const(e), Const(s)], opts)
        want = run_litert(model.to_bytes("tflite"), feeds)[0]
        m = cj.load(model.to_bytes("tflite"))
        got = np.asarray(m.apply(m.params, x)[0])
        assert got.shape == want.shape, (x.shape, b, e, s, opts)
        np.testing.assert_array_equal(got, want, err_msg=str((x.shape, b, e, s, opts)))
        checked += 1


def test_strided_slice_shrink_negative_stride() -> None:
    """LiteRT 2.3 sizes the output but writes nothing here; the element at begin is meant."""
    model, feeds = one_op_model("STRIDED_SLICE", *strided(X345, [2, -1], [0, 0], [-1, -2],
                                                          shrink_axis_mask=0b11))
    m = cj.load(model.to_bytes("circle"))
    np.testing.assert_array_equal(m.apply(m.params, X345)[0], X345[2, -1])


@pytest.mark.parametrize("args, error, match", [
    (strided(X345, [3], [4], [1], shrink_axis_mask=1), ValueError, "out of range"),
    (strided(X345, [0], [1], [0]), ValueError, "stride 0"),
    (strided(X345, [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]), ValueError, "ranges"),
    (strided(X345, [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], ellipsis_mask=2),
     NotImplementedError, "ellipsis"),
    (strided(X345, [2, 0, 0], [2, 1, 1], [1, 1, 1], offset=True), ValueError, "out of range"),
    (strided(X345, [0, 0, 0], [1, 1, 1], [1, 1, 1], offset=True, end_mask=1),
     NotImplementedError, "offset"),
])
def test_strided_slice_errors(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        one_op_model("STRIDED_SLICE", *args)


# ---------------------------------------------------------------- padding and tiling

PADS = [[0, 1], [2, 0], [1, 2]]


def test_pad() -> None:
    check_op("PAD", [X234, i32(PADS)])
    check_op("PAD", [f32(1, 3, 3, 2), Const(np.array([[0, 0], [1, 1], [2, 1], [0, 0]]))])


@pytest.mark.parametrize("value", [Const(np.float32(-1.5)), np.array(2.5, np.float32)],
                         ids=["constant", "input"])
def test_padv2(value: Any) -> None:
    check_op("PADV2", [X234, i32(PADS), value])


def test_pad_int_folded() -> None:
    ints = Const(np.arange(6, dtype=np.int64).reshape(2, 3))
    check_folded("PADV2", [ints, i32([[1, 0], [0, 2]]), Const(np.int64(7))])


@pytest.mark.parametrize("mode, pads", [
    ("REFLECT", [[0, 1], [2, 0], [1, 3]]), ("SYMMETRIC", [[1, 1], [0, 3], [4, 2]]),
])
def test_mirror_pad(mode: str, pads: list) -> None:
    check_op("MIRROR_PAD", [X234, i32(pads)], {"mode": mode})


def test_mirror_pad_too_large() -> None:
    with pytest.raises(ValueError, match="too large"):
        one_op_model("MIRROR_PAD", [X234, i32([[0, 0], [3, 0], [0, 0]])], {"mode": "REFLECT"})


@pytest.mark.parametrize("multiples", [[1, 2, 3], [2, 1, 1]])
def test_tile(multiples: list) -> None:
    check_op("TILE", [X234, i32(multiples)])


def test_broadcast_to() -> None:
    # LiteRT registers BROADCAST_TO from version 2 on
    check_op("BROADCAST_TO", [f32(3, 1), i32([2, 3, 4])], version=2)
    check_op("BROADCAST_TO", [f32(1, 4), i32([3, 4])], version=2)


def test_broadcast_args() -> None:
    check_folded("BROADCAST_ARGS", [i32([2, 1, 4]), i32([3, 1])])


@pytest.mark.parametrize("axis", [[1], [0, 1], [-1]])
def test_reverse_v2(axis: list) -> None:
    check_op("REVERSE_V2", [X234, i32(axis)])


def test_reverse_v2_non_contiguous_axes() -> None:
    """LiteRT 2.3 rejects non-contiguous axes ("Non-contiguous `axes` not supported")."""
    model, _ = one_op_model("REVERSE_V2", [X234, i32([0, 2])])
    m = cj.load(model.to_bytes("circle"))
    np.testing.assert_array_equal(jax.jit(m.apply)(m.params, X234)[0], X234[::-1, :, ::-1])


# ---------------------------------------------------------------- shapes and constants

@pytest.mark.parametrize("out_type", ["int32", "int64"])
def test_shape(out_type: str) -> None:
    with jax.enable_x64(out_type == "int64"):
        out = check_op("SHAPE", [X234], {"out_type": out_type})[0]
    assert out.dtype == np.dtype(out_type)


def test_shape_is_static_and_follows_batch() -> None:
    b = Builder()
    x = b.input("x", (1, 6))
    shape = b.op("SHAPE", [x], {"out_type": "int32"})
    b.output(b.op("FILL", [shape, b.constant("v", np.float32(3.0))], {}, shapes=[(1, 6)]))
    m = cj.load(b.to_bytes("circle"))
    out = jax.jit(m.apply)(m.params, f32(5, 6))[0]
    np.testing.assert_array_equal(out, np.full((5, 6), 3.0, np.float32))


def test_rank() -> None:
    check_op("RANK", [X234])


@pytest.mark.parametrize("value", [np.array(1.5, np.float32), Const(np.int32(4))],
                         ids=["input", "int"])
def test_fill(value: Any) -> None:
    check_op("FILL", [i32([2, 3]), value])


def test_zeros_like() -> None:
    check_op("ZEROS_LIKE", [X234])
    check_op("ZEROS_LIKE", [np.arange(6, dtype=np.int32).reshape(2, 3)])


@pytest.mark.parametrize("start, limit, delta", [(0, 10, 3), (10, 2, -2), (-3, 4, 1)])
def test_range_int(start: int, limit: int, delta: int) -> None:
    check_op("RANGE", [i32(start), i32(limit), i32(delta)])
    check_folded("RANGE", [Const(np.int64(start)), Const(np.int64(limit)),
                           Const(np.int64(delta))])


def test_range_empty() -> None:
    """LiteRT cannot hand back an empty tensor ("Invalid tensor size"): numpy reference."""
    model, _ = one_op_model("RANGE", [i32(5), i32(5), i32(1)])
    m = cj.load(model.to_bytes("circle"))
    out = m.apply(m.params)[0]
    assert out.shape == (0,) and out.dtype == np.int32


def test_range_float() -> None:
    """Float bounds are static inputs (``params_policy.STATIC_INPUTS``): not params, so the model
    runs under jit too; checked against LiteRT."""
    inputs = [Const(np.float32(0.5)), Const(np.float32(2.0)), Const(np.float32(0.1))]
    model, feeds = one_op_model("RANGE", inputs)
    want = run_litert(model.to_bytes("tflite"), feeds)[0]
    m = cj.load(model.to_bytes("circle"))
    assert m.params == {}
    for got in (m.apply(m.params)[0], jax.jit(m.apply)(m.params)[0]):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)  # same step-by-step float32 accumulation


def test_range_float_bound_shared_with_a_value_input_trains() -> None:
    """A float constant read both as a RANGE bound and as an ADD operand stays a trainable
    param; RANGE reads its stored value, so the model compiles and differentiates."""
    b = Builder("range shares a constant")
    x = b.input("x", (1, 4))
    one = b.constant("one", np.float32(1.0))
    r = b.op("RANGE", [one, b.constant("limit", np.float32(5.0)), one])  # 1, 2, 3, 4
    b.output(b.op("ADD", [b.op("MUL", [x, r]), one]))
    m = cj.load(b.to_bytes())
    assert sorted(m.params) == ["one"]
    xv = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(jax.jit(m.apply)(m.params, xv)[0], [[2, 3, 4, 5]])
    grad = jax.jit(jax.grad(lambda p: jnp.sum(m.apply(p, xv)[0])))(m.params)
    assert float(grad["one"]) == 4.0  # through ADD only, not through RANGE's bounds


def test_where() -> None:
    cond = Const(RNG.random((3, 4)) > 0.5)
    check_folded("WHERE", [cond])
    check_folded("WHERE", [Const(np.array([0, 2, 0, 1], np.int32))])


def test_where_needs_static_condition() -> None:
    with pytest.raises(ValueError, match="constant known when the model is lowered"):
        one_op_model("WHERE", [np.ones((2, 2), bool)])


# ---------------------------------------------------------------- space <-> depth / batch

@pytest.mark.parametrize("block", [2, 3])
def test_space_to_depth(block: int) -> None:
    check_op("SPACE_TO_DEPTH", [f32(2, 6, 6, 3)], {"block_size": block})


@pytest.mark.parametrize("block", [2, 3])
def test_depth_to_space(block: int) -> None:
    check_op("DEPTH_TO_SPACE", [f32(2, 2, 3, 2 * block * block)], {"block_size": block})


@pytest.mark.parametrize("x, block, pads", [
    (f32(2, 4, 6, 3), [2, 3], [[0, 0], [0, 0]]),
    (f32(1, 3, 5, 2), [2, 2], [[1, 0], [0, 1]]),
    (f32(2, 5, 3), [3], [[1, 0]]),
])
def test_space_to_batch_nd(x: np.ndarray, block: list, pads: list) -> None:
    check_op("SPACE_TO_BATCH_ND", [x, i32(block), i32(pads)])


@pytest.mark.parametrize("x, block, crops", [
    (f32(6, 2, 2, 3), [2, 3], [[0, 0], [0, 0]]),
    (f32(8, 2, 3, 2), [2, 2], [[1, 0], [0, 1]]),
    (f32(6, 2, 3), [3], [[1, 2]]),
])
def test_batch_to_space_nd(x: np.ndarray, block: list, crops: list) -> None:
    check_op("BATCH_TO_SPACE_ND", [x, i32(block), i32(crops)])


def test_space_batch_round_trip() -> None:
    b = Builder()
    x = b.input("x", (2, 4, 6, 3))
    block, pads = b.constant("block", np.array([2, 3], np.int32)), b.constant(
        "pads", np.array([[1, 1], [0, 3]], np.int32))
    y = b.op("SPACE_TO_BATCH_ND", [x, block, pads], {})
    b.output(b.op("BATCH_TO_SPACE_ND", [y, block, pads], {}))
    m = cj.load(b.to_bytes("circle"))
    xs = f32(2, 4, 6, 3)
    np.testing.assert_array_equal(m.apply(m.params, xs)[0], xs)


# ---------------------------------------------------------------- gradients

GRADS = [
    ("RESHAPE", [X234, i32([4, -1])], {}, 0),
    ("SQUEEZE", [f32(1, 3, 1)], {"squeeze_dims": []}, 0),
    ("EXPAND_DIMS", [X234, i32(1)], {}, 0),
    ("TRANSPOSE", [X234, i32([2, 0, 1])], {}, 0),
    ("CONCATENATION", [f32(2, 2) + 3, Const(f32(2, 3) + 3)],
     {"axis": 1, "fused_activation_function": "RELU"}, 0),
    ("SPLIT", [i32(2), X234], {"num_splits": 2}, 1),
    ("SPLIT_V", [X234, i32([1, -1]), i32(1)], {"num_splits": 2}, 1),
    ("SLICE", [X234, i32([1, 0, 1]), i32([1, -1, 2])], {}, 0),
    ("STRIDED_SLICE", *strided(X345, [-1, 0, 4], [0, 4, 0], [-2, 3, -2], end_mask=1), 0),
    ("STRIDED_SLICE", *strided(X345, [1, 0, 0], [2, 3, 3], [1, 1, 2], offset=True), 0),
    ("PACK", [f32(2, 3), Const(f32(2, 3))], {"values_count": 2, "axis": 1}, 0),
    ("UNPACK", [X234], {"num": 3, "axis": 1}, 2),
    ("PAD", [X234, i32(PADS)], {}, 0),
    ("PADV2", [X234, i32(PADS), np.array(0.7, np.float32)], {}, 0),
    ("MIRROR_PAD", [X234, i32([[1, 0], [2, 2], [0, 3]])], {"mode": "REFLECT"}, 0),
    ("MIRROR_PAD", [X234, i32([[1, 2], [3, 0], [0, 4]])], {"mode": "SYMMETRIC"}, 0),
    ("TILE", [X234, i32([2, 1, 2])], {}, 0),
    ("BROADCAST_TO", [f32(3, 1), i32([2, 3, 4])], {}, 0),
    ("FILL", [i32([2, 3]), np.array(1.5, np.float32)], {}, 0),
    ("REVERSE_V2", [X234, i32([0, 2])], {}, 0),
    ("SPACE_TO_DEPTH", [f32(1, 4, 4, 2)], {"block_size": 2}, 0),
    ("DEPTH_TO_SPACE", [f32(1, 2, 2, 8)], {"block_size": 2}, 0),
    ("SPACE_TO_BATCH_ND", [f32(1, 3, 4, 2), i32([2, 2]), i32([[1, 0], [0, 0]])], {}, 0),
    ("BATCH_TO_SPACE_ND", [f32(4, 2, 2, 1), i32([2, 2]), i32([[1, 0], [0, 1]])], {}, 0),
]


@pytest.mark.parametrize("op, inputs, options, out", GRADS,
                         ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_gradients(op: str, inputs: list, options: dict, out: int) -> None:
    n = {"SPLIT": 2, "SPLIT_V": 2, "UNPACK": 3}.get(op, 1)
    check_op_grads(op, inputs, options, output_index=out, outputs=n)
