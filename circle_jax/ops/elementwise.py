"""Elementwise operators: arithmetic, unary math, activations, comparisons, logic, select, cast.

Binary operators broadcast numpy-style (as TFLite's broadcasting kernels do). Gradients follow
TF's rules where a function has a kink or a tie:

- RELU, RELU6, RELU_N1_TO_1, RELU_0_TO_1 and the fused activations pass the gradient only
  strictly inside their linear range (0 at x = 0 for RELU, at 0 and 6 for RELU6).
- ABS has gradient sign(x): 0 at x = 0 (``jnp.abs`` would give 1).
- MAXIMUM gives the whole gradient of a tie x == y to x (TF masks with ``x >= y``); MINIMUM
  also gives ties to x (TF masks with ``x <= y``). ``jnp.maximum`` would split it 0.5 / 0.5.
- LEAKY_RELU at 0 has gradient alpha (TF: ``x > 0 ? 1 : alpha``).
- PRELU is Keras' ``relu(x) - alpha * relu(-x)``: at x = 0 both gradients are 0.
- POW's gradient w.r.t. the exponent is ``log(x) * x**y`` where x > 0 and 0 elsewhere (TF's
  rule, which avoids NaN for negative bases); w.r.t. the base it is ``y * x**(y-1)``, 0 where
  y == 0.
- FLOOR, CEIL, ROUND, SIGN, FLOOR_DIV, comparisons and casts to integers have zero gradient.

Fused activations of ADD/SUB/MUL/DIV follow LiteRT's kernels, which clamp for RELU, RELU6 and
RELU_N1_TO_1 (float and int32) and leave the result unchanged for TANH and SIGN_BIT.
int64 tensors are out of reach: JAX runs without 64-bit types here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir
from .common import clip_tf, fused_activation, output_dtype
from .registry import OpContext, register

Array = Any  # a jax array, or a numpy array for static inputs

# Clamping ranges of the fused activations LiteRT's arithmetic kernels apply (RELU,
# RELU_N1_TO_1, RELU6); they leave TANH and SIGN_BIT outputs unchanged.
_ACT_RANGES = {ir.ACT_RELU: (0, None), ir.ACT_RELU_N1_TO_1: (-1, 1), ir.ACT_RELU6: (0, 6)}


def is_int(x: Array) -> bool:
    """True for integer arrays (jax or numpy)."""
    return jnp.issubdtype(jnp.result_type(x), jnp.integer)


def _activate(y: Array, code: int | None) -> Array:
    """A fused activation as LiteRT's ADD/SUB/MUL/DIV kernels apply it: a clamp to the
    activation's range (TF's gradient rule for floats); TANH and SIGN_BIT are no-ops there."""
    if code not in _ACT_RANGES:
        return y
    if not is_int(y):
        return fused_activation(y, code)
    lo, hi = _ACT_RANGES[code]
    return jnp.clip(y, lo, hi)


def _broadcast(*xs: Array) -> list[jax.Array]:
    return jnp.broadcast_arrays(*(jnp.asarray(x) for x in xs))


def exact_divide(x: Array, y: Array) -> jax.Array:
    """x / y, correctly rounded.

    XLA rewrites a division by a broadcast operand into a multiplication by its reciprocal,
    which can be 1 ulp off; the barrier keeps the true division. It matters where the quotient
    is then rounded to an integer (FLOOR_DIV, QUANTIZE): 1 ulp can change the result by 1.
    """
    x, y = _broadcast(x, y)
    return jnp.divide(x, lax.optimization_barrier(y))


# --------------------------------------------------------------------------------------------
# Binary arithmetic


def _fused_binary(name: str, doc: str, float_fn: Callable, int_fn: Callable | None = None) -> None:
    """Register an arithmetic operator with a fused activation (ADD, SUB, MUL, DIV)."""
    int_fn = int_fn or float_fn

    def op(ctx: OpContext, x: Array, y: Array) -> Array:
        out = (int_fn if is_int(x) else float_fn)(x, y)
        return _activate(out, ctx.options.fused_activation_function)

    op.__name__ = op.__qualname__ = name.lower()
    op.__doc__ = doc
    register(name)(op)


def _int_div(x: Array, y: Array) -> jax.Array:
    """Integer division truncating toward zero (C++ ``/``, what TFLite's int32 DIV does)."""
    return lax.div(*_broadcast(x, y))


_FUSED = "then the fused activation (float32 or int32, broadcasting)"
_fused_binary("ADD", f"x + y, {_FUSED}.", jnp.add)
_fused_binary("SUB", f"x - y, {_FUSED}.", jnp.subtract)
_fused_binary("MUL", f"x * y, {_FUSED}.", jnp.multiply)
_fused_binary("DIV", f"x / y (int32: truncated toward zero), {_FUSED}.", jnp.divide, _int_div)


@jax.custom_jvp
def _float_pow(x: Array, y: Array) -> jax.Array:
    return jnp.power(x, y)


@_float_pow.defjvp
def _float_pow_jvp(primals: tuple, tangents: tuple) -> tuple:
    x, y = primals
    dx, dy = tangents
    out = jnp.power(x, y)
    gx = jnp.where(y == 0, 0.0, y * jnp.power(x, y - 1))
    positive = x > 0
    gy = jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), 0.0) * out
    return out, gx * dx + gy * dy


@register("POW")
def pow_(ctx: OpContext, x: Array, y: Array) -> Array:
    """x ** y; float gradients as TF (see the module docstring), int32 by repeated product."""
    if is_int(x):
        return jnp.power(*_broadcast(x, y))
    return _float_pow(*_broadcast(x, y))


@register("SQUARED_DIFFERENCE")
def squared_difference(ctx: OpContext, x: Array, y: Array) -> Array:
    d = jnp.subtract(x, y)
    return d * d


@register("MAXIMUM")
def maximum(ctx: OpContext, x: Array, y: Array) -> Array:
    """max(x, y); a tie's gradient goes to x (TF's ``x >= y`` mask)."""
    return jnp.where(jnp.greater_equal(x, y), x, y)


@register("MINIMUM")
def minimum(ctx: OpContext, x: Array, y: Array) -> Array:
    """min(x, y); a tie's gradient goes to x (TF's ``x <= y`` mask)."""
    return jnp.where(jnp.less_equal(x, y), x, y)


@register("FLOOR_DIV")
def floor_div(ctx: OpContext, x: Array, y: Array) -> Array:
    """floor(x / y): float as ``floor`` of the float quotient, int32 rounding toward -inf."""
    if is_int(x):
        return jnp.floor_divide(x, y)
    return jnp.floor(exact_divide(x, y))


@register("FLOOR_MOD")
def floor_mod(ctx: OpContext, x: Array, y: Array) -> Array:
    """x - floor(x / y) * y: the result takes the divisor's sign (TF / Python semantics).

    Computed as the truncated remainder, plus y when it is non-zero and its sign differs from
    y's; the gradient is then 1 for x and -floor(x / y) for y, as TF's.
    """
    x, y = _broadcast(x, y)
    r = lax.rem(x, y)
    adjust = (r != 0) & ((r < 0) != (y < 0))
    return jnp.where(adjust, r + y, r)


@register("ADD_N")
def add_n(ctx: OpContext, *xs: Array) -> Array:
    """The sum of all inputs (same shapes), added left to right."""
    return functools.reduce(jnp.add, xs)


# --------------------------------------------------------------------------------------------
# Unary math and activations


@jax.custom_jvp
def _abs(x: Array) -> jax.Array:
    return jnp.abs(x)


_abs.defjvps(lambda t, ans, x: jnp.sign(x) * t)


def _unary(name: str, fn: Callable[[Array], Array]) -> None:
    """Register a one-input operator computed by ``fn``."""

    def op(ctx: OpContext, x: Array) -> Array:
        return fn(x)

    op.__name__ = op.__qualname__ = name.lower()
    register(name)(op)


_UNARY: dict[str, Callable[[Array], Array]] = {
    "ABS": _abs,  # gradient sign(x): 0 at 0
    "NEG": jnp.negative,
    "EXP": jnp.exp,
    "LOG": jnp.log,
    "SQRT": jnp.sqrt,
    "RSQRT": lax.rsqrt,
    "SQUARE": jnp.square,
    "SIN": jnp.sin,
    "COS": jnp.cos,
    "TANH": jnp.tanh,
    "LOGISTIC": jax.nn.sigmoid,
    "RELU": jax.nn.relu,
    "RELU6": lambda x: clip_tf(x, 0.0, 6.0),
    "RELU_N1_TO_1": lambda x: clip_tf(x, -1.0, 1.0),
    "RELU_0_TO_1": lambda x: clip_tf(x, 0.0, 1.0),
    "ELU": jax.nn.elu,
    "FLOOR": jnp.floor,
    "CEIL": jnp.ceil,
    "ROUND": jnp.round,  # half to even, as TFLite's ROUND
    "SIGN": jnp.sign,
    "LOGICAL_NOT": jnp.logical_not,
}
for _name, _fn in _UNARY.items():
    _unary(_name, _fn)


@register("LEAKY_RELU")
def leaky_relu(ctx: OpContext, x: Array) -> Array:
    """x > 0 ? x : alpha * x (gradient alpha at 0, as TF)."""
    return jnp.where(x > 0, x, ctx.options.alpha * x)


@register("PRELU")
def prelu(ctx: OpContext, x: Array, alpha: Array) -> Array:
    """x >= 0 ? x : alpha * x with alpha broadcast against x; Keras' form for the gradient."""
    return jax.nn.relu(x) - alpha * jax.nn.relu(-x)


@register("GELU")
def gelu(ctx: OpContext, x: Array) -> Array:
    """Exact (erf) GELU, or the tanh approximation when ``approximate`` is set."""
    return jax.nn.gelu(x, approximate=bool(ctx.options.approximate))


@register("HARD_SWISH")
def hard_swish(ctx: OpContext, x: Array) -> Array:
    """x * relu6(x + 3) / 6, with TF's relu6 gradient at x = -3 and x = 3."""
    return x * clip_tf(x + 3.0, 0.0, 6.0) / 6.0


@register("SOFTMAX")
def softmax(ctx: OpContext, x: Array) -> Array:
    """softmax(beta * x) over the last axis."""
    beta = ctx.options.beta
    return jax.nn.softmax(x if beta in (None, 1.0) else x * beta, axis=-1)


@register("LOG_SOFTMAX")
def log_softmax(ctx: OpContext, x: Array) -> Array:
    """log(softmax(x)) over the last axis."""
    return jax.nn.log_softmax(x, axis=-1)


@register("CAST")
def cast(ctx: OpContext, x: Array) -> Array:
    """Convert to the output tensor's dtype: float -> int truncates toward zero, -> bool is
    ``x != 0``, int -> narrower int wraps around (C++ ``static_cast``)."""
    dtype = output_dtype(ctx)
    if dtype == np.bool_:
        return jnp.not_equal(x, 0)
    return jnp.asarray(x).astype(dtype)


# --------------------------------------------------------------------------------------------
# Comparisons, logic, select


def _binary(name: str, fn: Callable[[Array, Array], Array]) -> None:
    """Register a broadcasting two-input operator without options."""

    def op(ctx: OpContext, x: Array, y: Array) -> Array:
        return fn(x, y)

    op.__name__ = op.__qualname__ = name.lower()
    register(name)(op)


for _name, _fn in {
    "LESS": jnp.less,
    "LESS_EQUAL": jnp.less_equal,
    "GREATER": jnp.greater,
    "GREATER_EQUAL": jnp.greater_equal,
    "EQUAL": jnp.equal,
    "NOT_EQUAL": jnp.not_equal,
    "LOGICAL_AND": jnp.logical_and,
    "LOGICAL_OR": jnp.logical_or,
}.items():
    _binary(_name, _fn)


@register("SELECT")
def select(ctx: OpContext, cond: Array, x: Array, y: Array) -> Array:
    """cond ? x : y. x and y have one shape; cond has that shape, is a scalar, or is rank 1
    and picks whole slices along the first dimension (TF's Select)."""
    cond = jnp.asarray(cond)
    shape = np.shape(x)
    if np.shape(y) != shape:
        raise ValueError(f"SELECT needs x and y of one shape, got {shape} and {np.shape(y)}")
    if cond.ndim == 1 and len(shape) > 1 and cond.shape[0] == shape[0]:
        cond = cond.reshape(cond.shape + (1,) * (len(shape) - 1))
    elif cond.shape not in ((), shape):
        raise ValueError(
            f"SELECT condition of shape {cond.shape} must be a scalar, have x's shape {shape} "
            "or be rank 1 over x's first dimension (SELECT_V2 broadcasts)"
        )
    return jnp.where(cond, x, y)


@register("SELECT_V2")
def select_v2(ctx: OpContext, cond: Array, x: Array, y: Array) -> Array:
    """cond ? x : y with numpy broadcasting among all three inputs."""
    return jnp.where(cond, x, y)
