"""Fake quantization: float values rounded to an integer grid, with straight-through
gradients, as quantization-aware training simulates an integer model.

``fake_quant(x) = scale * (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point)``,
rounding half away from zero (as LiteRT quantizes). Its gradient is the clipped straight-through
estimator: 1 where ``x / scale + zero_point`` lies inside ``[qmin, qmax]``, 0 outside (the
clamp passes no gradient). Scales and zero points are never differentiated.

:func:`quantize_weight` re-quantizes a weight from its float value with the file's scheme
(its `circle_jax.graph.quantization.QParams`: symmetric or asymmetric, per tensor or per
channel); :func:`quantize_bias` a bias at ``s_input * s_weight``. Both return the integers
and their parameters, so the simulation and the exported integer file hold the same values.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..graph.quantization import QParams, quantize, round_half_away

Array = Any


def _xp(x: Array) -> Any:
    """numpy for numpy arrays (the export), jax.numpy otherwise: the same float32
    operations either way, so both give the same integers."""
    return np if isinstance(x, (np.ndarray, np.generic)) else jnp


def _constant(x: Array) -> Array:
    """``x`` without gradient (numpy stays numpy)."""
    return x if _xp(x) is np else jax.lax.stop_gradient(x)


def _round(v: Array) -> Array:
    """`circle_jax.graph.quantization`'s rule: to nearest, ties away from zero."""
    return round_half_away(v, _xp(v))


def _channels(values: Array, ndim: int, axis: int | None) -> Array:
    """Per-channel values laid along ``axis`` of a rank-``ndim`` tensor (None: a scalar)."""
    if axis is None:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return values.reshape(shape)


def fake_quant(x: Array, scale: Array, zero_point: Array, qmin: float, qmax: float) -> Array:
    """``x`` rounded to the grid (see the module docstring), with the clipped
    straight-through gradient; integer ``x`` (data given to a QAT model's float input in
    another dtype than the stored one, which `circle_jax.Model.apply` dequantizes) is read
    as the numbers it holds, in float32 (in its own type the scale would truncate to an
    integer: NaN or garbage)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = jnp.asarray(x, jnp.float32)
    scale = jax.lax.stop_gradient(jnp.asarray(scale, x.dtype))
    zero = jax.lax.stop_gradient(jnp.asarray(zero_point, x.dtype))
    v = x / scale + zero
    q = jnp.clip(_round(v), qmin, qmax)
    out = jax.lax.stop_gradient((q - zero) * scale)
    inside = (v >= qmin) & (v <= qmax)
    return jnp.where(inside, x + jax.lax.stop_gradient(out - x), out)


def weight_params(w: Array, g: QParams) -> tuple[Array, Array]:
    """(scales, zero points) of float weight ``w`` re-quantized with ``g``'s scheme: one per
    index of ``g.axis`` when the file has per-channel parameters, else one; a channel that is
    all zero keeps the file's scale."""
    xp, w = _xp(w), _constant(w)
    axes = tuple(d for d in range(w.ndim) if d != g.axis) if g.per_channel else None
    file_scale = np.asarray(g.scale, np.float32).reshape(-1 if g.per_channel else ())
    if g.symmetric:
        scale = xp.max(xp.abs(w), axis=axes) / np.float32(g.qmax)
        zero = xp.zeros_like(scale)
    else:
        lo = xp.minimum(xp.min(w, axis=axes), np.float32(0))
        hi = xp.maximum(xp.max(w, axis=axes), np.float32(0))
        scale = (hi - lo) / np.float32(g.qmax - g.qmin)
        zero = xp.clip(_round(np.float32(g.qmin) - lo / xp.where(scale > 0, scale,
                                                                 np.float32(1))),
                       g.qmin, g.qmax)
    return xp.where(scale > 0, scale, file_scale), zero


def file_range(g: QParams) -> np.ndarray:
    """``[min, max]`` (float32) of the real values per-tensor parameters ``g`` represent
    (symmetric ones: ``[-qmax, qmax]`` steps), which `range_params` maps back to ``g``'s
    scale and zero point (within an ulp of the scale)."""
    lo = -g.qmax if g.symmetric else g.qmin
    return np.float32(g.s) * (np.array([lo, g.qmax], np.float32) - np.float32(g.zp))


def range_params(lo_hi: Array, g: QParams) -> tuple[Array, Array]:
    """(scale, zero point) of an activation whose real values span ``lo_hi`` (``[min,
    max]``, widened to hold 0), in the scheme of its file parameters ``g`` as a weight is
    re-quantized (`weight_params`: symmetric when the file's zero point is 0 on a signed
    type, else asymmetric over the type's whole range)."""
    return weight_params(lo_hi, g)


def moving_average(r: Array, lo: Array, hi: Array, decay: float) -> Array:
    """TF's moving min/max (tfmot's MovingAverageQuantizer): range ``r = [min, max]`` moved
    toward a batch's ``[min(lo), max(hi)]`` (of all elements given) widened to hold 0:
    ``r * decay + batch * (1 - decay)``, float32."""
    batch = jnp.stack([jnp.minimum(jnp.min(lo), 0.0), jnp.maximum(jnp.max(hi), 0.0)])
    d = np.float32(decay)
    return r * d + batch.astype(jnp.float32) * (np.float32(1) - d)


def quantize_weight(w: Array, g: QParams) -> tuple[Array, Array, Array]:
    """(integers as floats, scales, zero points) of float weight ``w`` in ``g``'s scheme
    (symmetric weights use the narrow range ``[-qmax, qmax]``, as LiteRT's int8 weights).
    float32 operations on numpy or JAX arrays alike."""
    xp = _xp(w)
    scale, zero = weight_params(w, g)
    axis = g.axis if g.per_channel else None
    s, z = _channels(scale, w.ndim, axis), _channels(zero, w.ndim, axis)
    lo = -g.qmax if g.symmetric else g.qmin
    q = xp.clip(_round(_constant(w) / s) + z, lo, g.qmax)
    return q, scale, zero


def fake_quant_weight(w: Array, g: QParams) -> tuple[Array, Array]:
    """(``w`` re-quantized and dequantized, with a straight-through gradient; its scales)."""
    q, scale, zero = quantize_weight(w, g)
    axis = g.axis if g.per_channel else None
    real = (q - _channels(zero, w.ndim, axis)) * _channels(scale, w.ndim, axis)
    return w + jax.lax.stop_gradient(real - w), scale


def constant_on_grid(w: Array, g: QParams) -> tuple[Array, Array]:
    """(integers as floats, their real values) of float constant ``w`` on the file's grid
    ``g`` itself (a grid constant of `circle_jax.passes.fake_quant`): ``clip(round(w / s) +
    zp, qmin, qmax)`` with ``g``'s scale and zero point, per tensor or per channel."""
    xp = _xp(w)
    axis = g.axis if g.per_channel else None
    s = _channels(np.asarray(g.scale, np.float32), w.ndim, axis)
    z = _channels(np.asarray(g.zero_point, np.float32), w.ndim, axis)
    q = xp.clip(_round(_constant(w) / s) + z, g.qmin, g.qmax)
    return q, (q - z) * s


def fake_quant_constant(w: Array, g: QParams) -> Array:
    """``w`` rounded on its file grid (:func:`constant_on_grid`), straight-through."""
    real = constant_on_grid(w, g)[1]
    return w + jax.lax.stop_gradient(real - w)


def bias_scale(input_scale: Array, weight_scale: Array) -> Array:
    """The bias scale ``s_input * s_weight`` (per output channel), float32."""
    xp = jnp if isinstance(input_scale, jax.Array) else _xp(weight_scale)
    return _constant(xp.asarray(input_scale, np.float32) * weight_scale)


def quantize_bias(b: Array, scale: Array, g: QParams) -> Array:
    """Bias integers (as floats) at ``scale`` (zero point 0), clamped to int32 for an int32
    bias."""
    q = _round(_constant(b) / scale.reshape((-1,) if scale.ndim else ()))
    return _xp(q).clip(q, g.qmin, g.qmax) if g.dtype == "int32" else q


def fake_quant_bias(b: Array, scale: Array, g: QParams) -> Array:
    """``b`` re-quantized at ``scale`` and dequantized, with a straight-through gradient."""
    real = quantize_bias(b, scale, g) * scale.reshape((-1,) if scale.ndim else ())
    return b + jax.lax.stop_gradient(real - b)


def to_integers(x: Array, scale: float, zero_point: int, qmin: int, qmax: int,
                dtype: str) -> Array:
    """The integers of real values ``x`` (no gradient): ``clip(round(x / scale) + zp)`` in
    ``dtype``; exact for values on the grid, as the simulation's activations are."""
    return quantize(jax.lax.stop_gradient(x), scale, zero_point, qmin, qmax, jnp).astype(dtype)


def from_integers(q: Array, scale: float, zero_point: int) -> Array:
    """The real values ``scale * (q - zp)`` of integers ``q``, float32."""
    return (q.astype(jnp.float32) - np.float32(zero_point)) * np.float32(scale)


def straight_through(value: Array, differentiated: Array) -> Array:
    """``value`` in the forward (exactly: ``differentiated - differentiated`` is 0), the
    gradient of ``differentiated`` in the backward, in ``differentiated``'s dtype (a half
    compute dtype rounds ``value`` to it)."""
    d = differentiated
    return jax.lax.stop_gradient(value.astype(d.dtype)) + (d - jax.lax.stop_gradient(d))
