"""Helpers shared by operator families: fused activations, static values, padding."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir


def clip_tf(x: jax.Array, lo: float, hi: float) -> jax.Array:
    """Clip to [lo, hi] with TF's gradient rule: 1 strictly inside, 0 at and beyond the bounds.

    The rule reads the clipped output (strictly inside the bounds exactly where the input
    is), so a backward pass needs no copy of the input: XLA fuses the output's test into
    the gradient's consumers instead of keeping a mask of the input (MobileNet 0.25/128's
    training step: 247 -> 220 kernels, benchmarks/README.md). Written with `jax.lax`
    primitives: ``jnp.clip`` and ``jnp.where`` are jitted functions that trace again for
    every new shape."""
    x = jnp.asarray(x)
    return _clip(x, lax.convert_element_type(lo, x.dtype), lax.convert_element_type(hi, x.dtype))


@jax.custom_jvp
def _clip(x: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
    return lax.clamp(lo, x, hi)


@_clip.defjvp
def _clip_jvp(primals: tuple, tangents: tuple) -> tuple:
    (x, lo, hi), t = primals, tangents[0]
    y = lax.clamp(lo, x, hi)
    if t.dtype == jax.dtypes.float0:  # an integer x: no tangent to mask
        return y, t
    inside = lax.bitwise_and(lax.gt(y, lo), lax.lt(y, hi))
    return y, lax.select(inside, t, lax.full_like(t, 0))


def fused_activation(x: jax.Array, code: int | None) -> jax.Array:
    """Apply a fused activation (ActivationFunctionType), with TF's gradients at kinks.

    TFLite's float kernels apply a fused activation as a clamp range (RELU, RELU6,
    RELU_N1_TO_1); for TANH and SIGN_BIT the range is unbounded, so LiteRT leaves the value
    unchanged. circle-jax matches LiteRT, its forward oracle.
    """
    if not code or code in (ir.ACT_TANH, ir.ACT_SIGN_BIT):
        return x
    if code == ir.ACT_RELU:
        return jax.nn.relu(x)
    if code == ir.ACT_RELU6:
        return clip_tf(x, 0.0, 6.0)
    if code == ir.ACT_RELU_N1_TO_1:
        return clip_tf(x, -1.0, 1.0)
    raise ValueError(f"unknown fused activation {code}")


def activation_function(x: jax.Array, code: int | None) -> jax.Array:
    """An ActivationFunctionType applied as a function (recurrent cells: TANH is tanh)."""
    return jnp.tanh(x) if code == ir.ACT_TANH else fused_activation(x, code)


def is_static(x: Any) -> bool:
    """True for values known at lowering time (numpy arrays and Python scalars)."""
    return isinstance(x, (np.ndarray, np.generic, int, float, bool))


def static(x: Any, what: str = "value") -> np.ndarray:
    """The numpy value of a static input, or a clear error if it is only known at run time."""
    if x is None:
        raise ValueError(f"{what} is missing")
    if not is_static(x):
        try:  # concrete jax arrays (e.g. folded constants) are fine
            return np.asarray(x)
        except Exception:  # a tracer
            raise ValueError(
                f"{what} must be a constant known when the model is lowered "
                "(dynamic shapes are not supported)"
            ) from None
    return np.asarray(x)


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TFLite SAME padding (the extra pixel goes at the end)."""
    effective = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def padding_pairs(
    padding: int, sizes: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
    dilations: tuple[int, ...] | None = None,
) -> list[tuple[int, int]]:
    """Explicit (before, after) pairs for SAME (0) or VALID (1) padding per spatial dim."""
    dilations = dilations or (1,) * len(sizes)
    if padding == ir.PAD_VALID:
        return [(0, 0)] * len(sizes)
    return [same_padding(*a) for a in zip(sizes, kernel, strides, dilations)]


def output_dtype(ctx: Any, index: int = 0) -> np.dtype:
    """The declared dtype of an operator output."""
    return ir.as_numpy_dtype(ctx.outputs[index].dtype)


def check_padding(padding: Any) -> None:
    """Refuse a padding code other than SAME (0) or VALID (1)."""
    if padding not in (None, ir.PAD_SAME, ir.PAD_VALID):
        raise ValueError(f"padding {padding} is not SAME (0) or VALID (1)")


def check_float_input(ctx: Any, index: int, what: str) -> None:
    """Refuse a non-float tensor at input ``index`` (quantized or hybrid weights)."""
    t = ctx.inputs[index] if index < len(ctx.inputs) else None
    if t is not None and not np.issubdtype(ir.as_numpy_dtype(t.dtype), np.floating):
        raise NotImplementedError(
            f"{what} of dtype {t.dtype} (quantized/hybrid weights) is not supported; "
            "load with dequantize=True (--dequantize)")


def positive(values: dict[str, Any]) -> None:
    """Refuse negative strides, dilations or filter sizes (0 or absent reads as 1)."""
    bad = {k: v for k, v in values.items() if v is not None and int(v) < 0}
    if bad:
        raise ValueError("must be positive: " + ", ".join(f"{k}={v}" for k, v in bad.items()))
