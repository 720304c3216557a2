"""Normalizations: L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION and Circle's INSTANCE_NORM
and RMS_NORM (negative builtin codes, run by onert / luci-interpreter, not by LiteRT)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir
from .common import fused_activation
from .registry import OpContext, register

# TFLite's L2_NORMALIZATION divides by max(||x||, 1e-6).
L2_EPSILON = 1e-6


def _float_input(name: str, x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise NotImplementedError(f"{name} of {x.dtype} (quantized) is not supported")
    return x


def _channel_vector(name: str, v: jax.Array | None, channels: int, what: str) -> jax.Array | None:
    """A per-channel scale/offset of shape [C] or [1] (broadcast), or None when omitted."""
    if v is None:
        if what == "gamma":
            raise ValueError(f"{name} needs a gamma input")
        return None
    if np.ndim(v) != 1 or np.shape(v)[0] not in (1, channels):
        raise ValueError(f"{name} {what} must have shape [{channels}] or [1], got {np.shape(v)}")
    return jnp.asarray(v)


@register("L2_NORMALIZATION")
def l2_normalization(ctx: OpContext, x: jax.Array) -> jax.Array:
    """x / max(||x||_2, 1e-6) along the last axis (any rank; no fused activation, which
    LiteRT refuses too).

    Written as ``x / sqrt(max(sum(x^2), 1e-12))`` (the same value) so that an all-zero row has
    a finite gradient.
    """
    x = _float_input("L2_NORMALIZATION", x)
    if ctx.options.fused_activation_function:
        raise ValueError("L2_NORMALIZATION takes no fused activation (TFLite refuses one)")
    squares = jnp.sum(x * x, axis=-1, keepdims=True)
    return x / jnp.sqrt(jnp.maximum(squares, jnp.asarray(L2_EPSILON**2, x.dtype)))


@register("LOCAL_RESPONSE_NORMALIZATION")
def local_response_normalization(ctx: OpContext, x: jax.Array) -> jax.Array:
    """x[c] * (bias + alpha * sum_{|d-c| <= radius} x[d]^2) ** -beta along the last axis.

    TF/TFLite semantics: alpha is not divided by the window size; the window is clipped at
    the channel edges. The window sum is ``2*radius + 1`` shifted slices of the squares.
    """
    x = _float_input("LOCAL_RESPONSE_NORMALIZATION", x)
    o = ctx.options
    channels = x.shape[-1]
    radius = min(int(o.radius), channels - 1)
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {o.radius}")
    sq = jnp.pad(x * x, [(0, 0)] * (x.ndim - 1) + [(radius, radius)])
    accum = functools.reduce(
        jnp.add, [lax.slice_in_dim(sq, d, d + channels, axis=-1) for d in range(2 * radius + 1)]
    )
    base = jnp.asarray(o.bias, x.dtype) + jnp.asarray(o.alpha, x.dtype) * accum
    return x * jnp.power(base, jnp.asarray(-o.beta, x.dtype))


def _normalize(x: jax.Array, axes: tuple[int, ...], eps: float, center: bool) -> jax.Array:
    """(x - mean) / sqrt(var + eps) over ``axes``, or x / sqrt(mean(x^2) + eps) if not center."""
    if center:
        x = x - jnp.mean(x, axis=axes, keepdims=True)
    return x * lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + jnp.asarray(eps, x.dtype))


@register("INSTANCE_NORM")
def instance_norm(
    ctx: OpContext, x: jax.Array, gamma: jax.Array, beta: jax.Array | None = None
) -> jax.Array:
    """Circle INSTANCE_NORM: per sample and channel, normalize over the other axes.

    Rank 4 is NHWC (statistics over H, W; gamma/beta index C = axis 3); rank 3 follows
    luci-interpreter's N x C x D reading (statistics over D; gamma/beta index axis 1).
    gamma/beta have shape [C] or [1]; an omitted beta is 0. Biased variance, then the
    fused activation (RELU, RELU6 or RELU_N1_TO_1 clamps, as in ONE's kernels, which reject
    TANH and SIGN_BIT).
    """
    x = _float_input("INSTANCE_NORM", x)
    act = ctx.options.fused_activation_function
    if act in (ir.ACT_TANH, ir.ACT_SIGN_BIT):
        raise NotImplementedError("INSTANCE_NORM with a TANH or SIGN_BIT fused activation")
    if x.ndim == 4:
        axes, channel_axis = (1, 2), 3
    elif x.ndim == 3:
        axes, channel_axis = (2,), 1
    else:
        raise ValueError(f"INSTANCE_NORM needs a rank-3 or rank-4 input, got rank {x.ndim}")
    channels = x.shape[channel_axis]
    shape = [1] * x.ndim
    shape[channel_axis] = -1
    gamma = _channel_vector("INSTANCE_NORM", gamma, channels, "gamma")
    beta = _channel_vector("INSTANCE_NORM", beta, channels, "beta")
    y = _normalize(x, axes, float(ctx.options.epsilon or 0.0), center=True)
    y = y * gamma.reshape(shape)
    if beta is not None:
        y = y + beta.reshape(shape)
    return fused_activation(y, act)


@register("RMS_NORM")
def rms_norm(
    ctx: OpContext, x: jax.Array, gamma: jax.Array, beta: jax.Array | None = None
) -> jax.Array:
    """Circle RMS_NORM: gamma * x / sqrt(mean(x^2 over the last axis) + epsilon) [+ beta].

    ONE has shipped a 2-input form (input, gamma) and a 3-input form that also adds beta;
    both are accepted (an omitted beta is 0). gamma/beta have shape [C] or [1].
    """
    x = _float_input("RMS_NORM", x)
    channels = x.shape[-1]
    gamma = _channel_vector("RMS_NORM", gamma, channels, "gamma")
    beta = _channel_vector("RMS_NORM", beta, channels, "beta")
    y = _normalize(x, (x.ndim - 1,), float(ctx.options.epsilon or 0.0), center=False) * gamma
    return y if beta is None else y + beta
