"""Elementwise operators: LiteRT conformance, float64 finite-difference gradients, TF kink rules."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import circle_jax as cj
from circle_jax.build import Builder
from tests.conformance import Const, check_op, check_op_grads, one_op_model

rng = np.random.default_rng(20261122)

ACTIVATIONS = ["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH", "SIGN_BIT"]
# (x shape, y shape) pairs: equal shapes, trailing, two-sided and scalar broadcasting, rank 6.
BROADCASTS = [
    ((3, 4, 5), (3, 4, 5)),
    ((3, 4, 5), (5,)),
    ((3, 1, 5), (1, 4, 1)),
    ((), (2, 3)),
    ((2, 1, 3, 1, 2, 3), (1, 2, 1, 4, 1, 3)),
]


def normal(*shape: int, scale: float = 2.0) -> np.ndarray:
    return (rng.normal(size=shape) * scale).astype(np.float32)


def away_from(x: np.ndarray, points: tuple[float, ...], gap: float = 0.05) -> np.ndarray:
    """x with every element pushed at least ``gap`` away from each kink in ``points``."""
    x = x.copy()
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + np.where(x[near] >= p, gap, -gap)
    return x.astype(np.float32)


def nonzero_ints(*shape: int) -> np.ndarray:
    return (rng.integers(1, 9, shape) * rng.choice([-1, 1], shape)).astype(np.int32)


def ints(*shape: int, lo: int = -9, hi: int = 10) -> np.ndarray:
    return rng.integers(lo, hi, shape).astype(np.int32)


# ---------------------------------------------------------------------------------- conformance


# Every activation on every arithmetic op, and every op with every broadcasting pattern, in a
# Latin-square style: each row is one LiteRT model.
ARITHMETIC = ["ADD", "SUB", "MUL", "DIV"]


@pytest.mark.parametrize("op", ARITHMETIC)
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_arithmetic_fused_activation(op: str, act: str) -> None:
    # LiteRT's arithmetic kernels only clamp for RELU/RELU6/RELU_N1_TO_1: TANH and SIGN_BIT
    # leave the result unchanged, and circle-jax matches that. The shapes rotate through the
    # broadcasting patterns.
    xs, ys = BROADCASTS[(ARITHMETIC.index(op) + ACTIVATIONS.index(act)) % len(BROADCASTS)]
    y = away_from(normal(*ys), (0.0,), 0.5)
    check_op(op, [normal(*xs), y], {"fused_activation_function": act})


@pytest.mark.parametrize("op,act", [("ADD", "NONE"), ("ADD", "RELU"), ("SUB", "NONE"),
                                    ("SUB", "RELU6"), ("MUL", "NONE"), ("MUL", "RELU_N1_TO_1"),
                                    ("DIV", "NONE"), ("DIV", "RELU6")])
def test_arithmetic_int32(op: str, act: str) -> None:
    # int32 DIV truncates toward zero (C++ division); the divisors are never zero.
    check_op(op, [ints(3, 4), nonzero_ints(4)], {"fused_activation_function": act})


def test_arithmetic_constant_operand() -> None:
    check_op("MUL", [normal(2, 3), Const(normal(3))], {"fused_activation_function": "RELU"})


@pytest.mark.parametrize("op", ["POW", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM"])
@pytest.mark.parametrize("shapes", BROADCASTS[1:3], ids=str)
def test_binary_float(op: str, shapes: tuple) -> None:
    x, y = normal(*shapes[0]), normal(*shapes[1])
    if op == "POW":
        x = np.abs(x) + 0.1
    x[(0,) * x.ndim] = y[(0,) * y.ndim]  # a tie for MAXIMUM / MINIMUM
    check_op(op, [x, y])


def test_pow_negative_base_integer_exponent() -> None:
    check_op("POW", [normal(3, 4), np.array([0, 1, 2, 3], np.float32)])


@pytest.mark.parametrize("op", ["POW", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM"])
def test_binary_int32(op: str) -> None:
    y = ints(4, lo=0, hi=4) if op == "POW" else ints(4)  # LiteRT's int POW: exponents >= 0
    check_op(op, [ints(3, 4), y])


@pytest.mark.parametrize("op", ["FLOOR_DIV", "FLOOR_MOD"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_floor_div_mod_signs(op: str, dtype: str) -> None:
    # Every sign combination, exact multiples included: the result of FLOOR_MOD takes the
    # divisor's sign, FLOOR_DIV rounds toward -inf.
    x = np.array([7, -7, 7, -7, 6, -6, 0, 5], dtype)
    y = np.array([3, 3, -3, -3, 3, -3, 4, 7], dtype)
    if dtype == "float32":
        x, y = x * 0.75, y * 0.75
        x[-1] += 0.3
    check_op(op, [x, y])


@pytest.mark.parametrize("op", ["FLOOR_DIV", "FLOOR_MOD"])
def test_floor_div_mod_broadcast(op: str) -> None:
    check_op(op, [normal(3, 4) * 4, away_from(normal(4), (0.0,), 0.5)])
    check_op(op, [ints(3, 4, lo=-50, hi=50), nonzero_ints(3, 1)])


def test_floor_div_by_broadcast_scalar_is_true_division() -> None:
    # 21.699999 / 0.7 = 30.999998 but 21.699999 * (1 / 0.7) rounds to 31: XLA's rewrite of a
    # division by a broadcast scalar into a reciprocal multiply must not reach FLOOR_DIV.
    out = check_op("FLOOR_DIV", [np.float32([21.699999, 43.399998, 7.0]), np.float32([0.7])])
    np.testing.assert_array_equal(out[0], [30, 61, 10])


def test_add_n() -> None:
    check_op("ADD_N", [normal(2, 3), normal(2, 3), Const(normal(2, 3))])
    check_op("ADD_N", [ints(2, 3), ints(2, 3)])


UNARY = ["ABS", "NEG", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "SIN", "COS", "TANH", "LOGISTIC",
         "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "ELU", "HARD_SWISH", "FLOOR", "CEIL",
         "SIGN", "LOG_SOFTMAX"]
POSITIVE = {"LOG", "SQRT", "RSQRT"}
STEPS = ("FLOOR", "CEIL", "ROUND", "SIGN")


@pytest.mark.parametrize("op", UNARY)
def test_unary_float(op: str) -> None:
    x = normal(3, 4, 5, scale=4.0)
    x.flat[:3] = [0.0, 6.0, -3.0]  # kinks of RELU/RELU6/HARD_SWISH, SIGN of 0
    check_op(op, [np.abs(x) + 0.05 if op in POSITIVE else x])


@pytest.mark.parametrize("op", ["ABS", "NEG", "SIGN"])
def test_unary_int32(op: str) -> None:
    check_op(op, [np.append(ints(11), 0).astype(np.int32)])


def test_round_half_to_even() -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.49, 0.51, 7.2], np.float32)
    out = check_op("ROUND", [x])[0]
    np.testing.assert_array_equal(out[:7], [-2, -2, 0, 0, 2, 2, 4])


@pytest.mark.parametrize("alpha", [0.2, 0.0, 1.5, -0.3])
def test_leaky_relu(alpha: float) -> None:
    check_op("LEAKY_RELU", [normal(3, 5)], {"alpha": alpha})


@pytest.mark.parametrize("alpha_shape", [(5,), (4, 5), (3, 1, 5), (1,), (3, 4, 1)], ids=str)
def test_prelu_alpha_broadcast(alpha_shape: tuple) -> None:
    check_op("PRELU", [normal(3, 4, 5), Const(normal(*alpha_shape, scale=0.5))])


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu(approximate: bool) -> None:
    check_op("GELU", [normal(3, 4, 5)], {"approximate": approximate})


@pytest.mark.parametrize("shape,beta", [((7,), 1.0), ((4, 7), 0.5), ((2, 3, 7), 2.0),
                                        ((2, 1, 2, 3, 7), 1.0)], ids=str)
def test_softmax(shape: tuple, beta: float) -> None:
    check_op("SOFTMAX", [normal(*shape)], {"beta": beta})


def test_log_softmax_rank2() -> None:
    check_op("LOG_SOFTMAX", [normal(4, 7)])


CASTS = [("float32", "int32"), ("float32", "uint8"), ("float32", "int8"), ("float32", "bool"),
         ("float32", "float16"), ("float16", "float32"), ("int32", "float32"), ("int32", "uint8"),
         ("int32", "int16"), ("int32", "int8"), ("int32", "bool"), ("uint8", "int32"),
         ("int8", "int32"), ("int16", "int32"), ("bool", "float32"), ("bool", "int32")]


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda v: str(v))
def test_cast(src: str, dst: str) -> None:
    # float -> int truncates toward zero; int -> narrower int wraps; values stay inside the
    # destination's range for float sources (C++ leaves out-of-range conversions undefined).
    if src == "bool":
        x = rng.random((3, 5)) > 0.5
    elif src.startswith("float"):
        x = normal(3, 5, scale=4.0)
        x = np.abs(x) if dst == "uint8" else x
        x.flat[:2] = 0.0, -0.0
    else:
        info = np.iinfo(src)
        x = rng.integers(max(info.min, -300), min(info.max, 300) + 1, (3, 5)).astype(src)
        x.flat[0] = 0
    check_op("CAST", [x.astype(src)], {"in_data_type": src, "out_data_type": dst}, dtypes=[dst])


COMPARISONS = ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"]


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_comparison(op: str, dtype: str) -> None:
    x, y = ints(3, 4, lo=-3, hi=3).astype(dtype), ints(4, lo=-3, hi=3).astype(dtype)  # ties
    check_op(op, [x, y])


@pytest.mark.parametrize("op", ["EQUAL", "NOT_EQUAL", "LOGICAL_AND", "LOGICAL_OR"])
def test_bool_binary(op: str) -> None:
    check_op(op, [rng.random((3, 4)) > 0.5, rng.random((1, 4)) > 0.5])


def test_logical_not() -> None:
    check_op("LOGICAL_NOT", [rng.random((3, 4)) > 0.5])


@pytest.mark.parametrize("cond_shape", [(3, 4, 5), (3,), ()], ids=str)
def test_select(cond_shape: tuple) -> None:
    # SELECT (v1): condition of x's shape, a scalar, or rank 1 choosing slices of dim 0.
    cond = rng.random(cond_shape) > 0.5
    check_op("SELECT", [np.asarray(cond), normal(3, 4, 5), normal(3, 4, 5)])


def test_select_int32_rank1_over_matrix() -> None:
    check_op("SELECT", [rng.random(3) > 0.5, ints(3, 4), ints(3, 4)])


def test_select_rejects_broadcasting() -> None:
    # LiteRT refuses this too (select.cc: "has_low_rank_input_condition was not true").
    with pytest.raises(ValueError, match="SELECT_V2 broadcasts"):
        one_op_model("SELECT", [rng.random((3, 4, 1)) > 0.5, normal(3, 4, 5), normal(3, 4, 5)])


@pytest.mark.parametrize(
    "shapes", [((4, 1), (3, 1, 5), (1, 4, 1)), ((3, 4, 5), (5,), (1,)), ((), (3, 5), (3, 5))],
    ids=str,
)
def test_select_v2_broadcast(shapes: tuple) -> None:
    c, x, y = shapes
    check_op("SELECT_V2", [np.asarray(rng.random(c) > 0.5), normal(*x), normal(*y)])


# ------------------------------------------------------------------------------------ gradients


Row = tuple[str, list, dict]


def _many_ops_model(rows: list[Row]) -> tuple[Any, list[np.ndarray]]:
    """One model holding one independent operator per row (inputs: arrays or ``Const``)."""
    b = Builder()
    feeds, outs = [], []
    for k, (op, inputs, options) in enumerate(rows):
        idx = []
        for j, v in enumerate(inputs):
            if isinstance(v, Const):
                idx.append(b.constant(f"c{k}_{j}", v.value))
            else:
                idx.append(b.input(f"x{k}_{j}", v.shape, v.dtype.name))
                feeds.append(v)
        outs.append(b.op(op, idx, options))
    b.output(*outs)
    return cj.load(b.to_bytes("circle")), feeds


def _weighted_sum(outs: tuple) -> Any:
    return sum(jnp.sum(o * jnp.cos(k + jnp.arange(o.size).reshape(o.shape)))
               for k, o in enumerate(outs))


def check_grads_many(rows: list[Row]) -> None:
    """``check_op_grads`` for many operators at once: one model, one jitted float64 finite-
    difference check over every float input and constant (one compilation instead of one per
    operator). On failure each row is re-checked alone to name the culprit."""
    model, feeds = _many_ops_model(rows)
    with jax.enable_x64(True):
        params = {k: jnp.asarray(v, jnp.float64) for k, v in model.params.items()}
        is_float = [np.issubdtype(v.dtype, np.floating) for v in feeds]
        floats = [jnp.asarray(v, jnp.float64) for v, f in zip(feeds, is_float) if f]

        def loss(p: dict, *fx: Any) -> Any:
            it = iter(fx)
            args = [next(it) if f else v for v, f in zip(feeds, is_float)]
            return _weighted_sum(model.apply(p, *args))

        try:
            check_grads(jax.jit(loss), [params, *floats], order=1, modes=["rev"], eps=1e-4,
                        atol=1e-5, rtol=1e-5)
        except AssertionError:
            for op, inputs, options in rows:
                check_op_grads(op, inputs, options)
            raise


def test_unary_grads() -> None:
    x = away_from(normal(3, 5, scale=3.0), (-3.0, -1.0, 0.0, 1.0, 3.0, 6.0))
    rows = [(op, [np.abs(x) + 0.2 if op in POSITIVE else x], {}) for op in UNARY
            if op not in STEPS]
    rows += [("SOFTMAX", [x], {"beta": 0.7}), ("LEAKY_RELU", [x], {"alpha": 0.2}),
             ("GELU", [x], {"approximate": False}), ("GELU", [x], {"approximate": True})]
    check_grads_many(rows)


def test_binary_grads() -> None:
    """Every differentiable multi-input operator, w.r.t. inputs and constants (params), with
    broadcasting; inputs keep away from kinks and jumps."""
    rows: list[Row] = []
    for op in ARITHMETIC:  # fused RELU6: x is solved from an output away from 0 and 6
        target = away_from(normal(3, 4, scale=4.0), (0.0, 6.0), 0.1)
        y = away_from(normal(4), (0.0,), 0.5)
        x = {"ADD": target - y, "SUB": target + y, "MUL": target / y, "DIV": target * y}[op]
        rows.append((op, [x, Const(y)], {"fused_activation_function": "RELU6"}))
    x, y = normal(3, 4), away_from(normal(4), (0.0,), 0.5)
    q = x / y  # FLOOR_MOD jumps where x / y is an integer
    x_mod = ((np.floor(q) + np.clip(q - np.floor(q), 0.1, 0.9)) * y).astype(np.float32)
    x_far = np.where(np.abs(x - y) < 0.05, x + 0.2, x).astype(np.float32)  # no ties
    rows += [
        ("POW", [np.abs(x) + 0.2, Const(y)], {}),
        ("SQUARED_DIFFERENCE", [x, Const(y)], {}),
        ("MAXIMUM", [x_far, y], {}),
        ("MINIMUM", [x_far, Const(y)], {}),
        ("FLOOR_MOD", [x_mod, y], {}),
        ("PRELU", [away_from(normal(3, 4, 5), (0.0,)), Const(normal(4, 1))], {}),
        ("SELECT", [rng.random(3) > 0.5, normal(3, 4), normal(3, 4)], {}),
        ("SELECT_V2", [rng.random((4, 1)) > 0.5, normal(3, 1, 5), Const(normal(5))], {}),
        ("ADD_N", [normal(2, 3), normal(2, 3), Const(normal(2, 3))], {}),
    ]
    check_grads_many(rows)


def test_step_functions_have_zero_gradient() -> None:
    # TF registers no gradient for Floor, Ceil, Round, Sign and FloorDiv: they are zero.
    x = normal(3, 5)
    rows = [(op, [x], {}) for op in STEPS] + [("FLOOR_DIV", [x, normal(5) + 5.0], {})]
    model, feeds = _many_ops_model(rows)
    grads = jax.grad(lambda *a: _weighted_sum(model.apply({}, *a)),
                     argnums=tuple(range(len(feeds))))(*feeds)
    for g in grads:
        np.testing.assert_array_equal(g, 0.0)


def test_grads_eager_one_op() -> None:
    # check_grads_many runs jitted only; the oracle's per-op check also runs eagerly.
    check_op_grads("MUL", [normal(2, 3), Const(normal(3))], {"fused_activation_function": "RELU"})


def test_cast_float_grads_pass_through() -> None:
    # Finite differences cannot run through a float32 -> float16 narrowing; the rule is simple
    # enough to assert directly: the gradient of a float -> float CAST is the identity.
    b, feeds = one_op_model("CAST", [normal(2, 3)], dtypes=["float16"])
    model = cj.load(b.to_bytes("circle"))
    g = jax.grad(lambda x: jnp.sum(model.apply({}, x)[0].astype(jnp.float32) * 3.0))(feeds[0])
    np.testing.assert_array_equal(g, np.full((2, 3), 3.0, np.float32))


# ------------------------------------------------------------------------------ TF kink rules


def _grad(op: str, inputs: list[np.ndarray], options: dict | None = None) -> tuple:
    """d sum(op(inputs)) / d inputs, by jax.grad through the loaded one-op model."""
    b, _ = one_op_model(op, inputs, options)
    model = cj.load(b.to_bytes("circle"))
    args = tuple(range(len(inputs)))
    return jax.grad(lambda *xs: jnp.sum(model.apply({}, *xs)[0]), argnums=args)(*inputs)


def f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


@pytest.mark.parametrize(
    "op,x,want",
    [
        ("RELU", f32(-1, 0, 1), [0, 0, 1]),  # TF: gradient only where x > 0
        ("RELU6", f32(-1, 0, 3, 6, 7), [0, 0, 1, 0, 0]),  # only where 0 < x < 6
        ("RELU_N1_TO_1", f32(-2, -1, 0, 1, 2), [0, 0, 1, 0, 0]),
        ("RELU_0_TO_1", f32(-1, 0, 0.5, 1, 2), [0, 0, 1, 0, 0]),
        ("ABS", f32(-2, 0, 2), [-1, 0, 1]),  # sign(x): 0 at 0 (jnp.abs would give 1)
        ("HARD_SWISH", f32(-3, 3), [0, 1]),  # x * relu6(x + 3) / 6 with relu6's rule
        ("ELU", f32(0), [1]),  # TF: outputs + 1 = 1 at 0
    ],
)
def test_unary_kink_rules(op: str, x: np.ndarray, want: list) -> None:
    np.testing.assert_allclose(_grad(op, [x])[0], want, atol=1e-6)


def test_leaky_relu_kink_rule() -> None:
    # TF's LeakyReluGrad: x > 0 ? 1 : alpha, so alpha at 0.
    np.testing.assert_allclose(_grad("LEAKY_RELU", [f32(-1, 0, 1)], {"alpha": 0.25})[0],
                               [0.25, 0.25, 1])


def test_prelu_kink_rule() -> None:
    # Keras' PReLU is relu(x) - alpha * relu(-x): at x = 0 neither x nor alpha gets gradient.
    gx, ga = _grad("PRELU", [f32(-2, 0, 2), f32(0.5, 0.5, 0.5)])
    np.testing.assert_allclose(gx, [0.5, 0, 1])
    np.testing.assert_allclose(ga, [-2, 0, 0])


@pytest.mark.parametrize("op", ["MAXIMUM", "MINIMUM"])
def test_max_min_ties_go_to_x(op: str) -> None:
    # TF's _MaximumGrad masks with x >= y and _MinimumGrad with x <= y: the first input takes
    # the whole gradient of a tie (jnp.maximum would split it 0.5 / 0.5).
    x, y = f32(1, 2, 3), f32(1, 1, 4)
    gx, gy = _grad(op, [x, y])
    if op == "MAXIMUM":
        np.testing.assert_array_equal(gx, [1, 1, 0])
        np.testing.assert_array_equal(gy, [0, 0, 1])
    else:
        np.testing.assert_array_equal(gx, [1, 0, 1])
        np.testing.assert_array_equal(gy, [0, 1, 0])


@pytest.mark.parametrize("act,want", [("RELU", [0, 0, 1, 1]), ("RELU6", [0, 0, 1, 0]),
                                      ("RELU_N1_TO_1", [0, 1, 0, 0])])
def test_fused_activation_kink_rules(act: str, want: list) -> None:
    # x + 0 lands exactly on -1, 0, 1 and 6.
    g = _grad("ADD", [f32(-1, 0, 1, 6), f32(0, 0, 0, 0)], {"fused_activation_function": act})
    np.testing.assert_array_equal(g[0], want)


def test_clip_gradient_reads_the_clipped_output() -> None:
    """clip_tf's backward tests the clipped output, not the input: a layer's gradient keeps
    no mask of its pre-activation (XLA fuses the test into the gradient's consumers). The
    rule is the same (1 strictly inside, 0 at and beyond the bounds), in forward-over-reverse
    too."""
    from circle_jax.ops.common import clip_tf

    x = jnp.asarray(f32(-1, 0, 3, 6, 7))
    jaxpr = jax.make_jaxpr(jax.grad(lambda v: jnp.sum(clip_tf(v * 2.0, 0.0, 6.0))))(x).jaxpr
    clamped = {e.outvars[0] for e in jaxpr.eqns if e.primitive.name == "clamp"}
    tests = [e for e in jaxpr.eqns if e.primitive.name in ("gt", "lt")]
    assert tests and all(e.invars[0] in clamped for e in tests), jaxpr
    g = jax.grad(lambda v: jnp.sum(clip_tf(v, 0.0, 6.0)))
    np.testing.assert_array_equal(g(x), [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(jax.jvp(g, (x,), (jnp.ones_like(x),))[1], np.zeros(5))


def test_pow_exponent_gradient_at_non_positive_base() -> None:
    # TF's _PowGrad: d/dy = x**y * log(x) where x > 0, else 0 (no NaN for negative bases).
    gx, gy = _grad("POW", [f32(-2, 0, 2), f32(2, 2, 2)])
    np.testing.assert_allclose(gx, [-4, 0, 4])
    np.testing.assert_allclose(gy, [0, 0, 4 * np.log(2)], rtol=1e-6)
