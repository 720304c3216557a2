"""Integer kernels of the activations: RELU, RELU6, RELU_N1_TO_1, LEAKY_RELU, LOGISTIC, TANH,
HARD_SWISH.

LiteRT's rules (scales are the tensors' float32 values; ``x'`` is ``x - x_zp``):

- RELU family: ``MBQM(x', s_in / s_out) + y_zp`` clamped to the activation's quantized range
  (bounds ``y_zp + round(bound / s_out)``).
- LEAKY_RELU: identity multiplier ``s_in / s_out`` for ``x' >= 0``, ``alpha s_in / s_out``
  below.
- LOGISTIC, TANH (int8, uint8): a 256-entry table over every input value, built as LiteRT
  builds it in float32: ``clamp(round(f(s_in (q - zp_in)) * (1 / s_out)) + zp_out)``.
- LOGISTIC, TANH (int16, zero points 0, output scale 2**-15): LiteRT's 16-bit reference
  kernel. The input is brought to the scale ``1 / (3 * 4096)`` by an integer multiplier
  ``M = trunc(s_in * 12288 * 2**k)`` (k the doublings that bring it above 16383.5):
  ``v = (x * M + 2**(k-1)) >> k``; then a 256-entry table of ``sigmoid(i / 24)`` in 0.16
  fixed point (:func:`sigmoid_table`), indexed by ``|v| >> 9`` (LOGISTIC) or ``|v| >> 8``
  (TANH, as ``2 sigmoid(2x) - 1``), linearly interpolated with the remaining bits,
  mirrored for ``v < 0`` and shifted back to 16 bits (:func:`_sigmoid_int16`). An input
  scale of ``2**-12`` (TANH also ``2**-11``), to within 1e-3 in log2 (:func:`checked_log2`),
  takes LiteRT's gemmlowp kernel instead: refused.
- HARD_SWISH (int8, uint8): LiteRT's 16-bit fixed-point kernel (:func:`_hard_swish`), applied
  to every input value to build a table: ``x' * 2**7`` on the "hires" scale ``s_in / 128``;
  a "reluish" factor in [0, 1] from it (multiplier ``hires / (3 / 32768)``, saturating, then
  ``(r + 2**15) >> 1``), times the input on the output scale (multiplier ``hires / s_out``,
  truncating doubling high multiply), the output shift, ``+ y_zp``, clamp. Multipliers are
  reduced to 16 bits (``(m + 2**15) >> 16``). Needs ``s_out > s_in / 128``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..registry import OpContext, register
from .fixed_point import (
    INT32_MAX,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    rdbpot,
    saturate,
    saturating_shl,
    sdhm,
    srdhm,
    wrap,
)
from .params import QParams, as_int32, quantize_value, same_type_params
from .tables import lut, round_away

Array = Any


# ----------------------------------------------------------------------------- RELU family


def check_relu(ctx: OpContext) -> None:
    x, y = same_type_params(ctx, ("int8", "uint8") if ctx.op.key == "RELU_N1_TO_1"
                            else ("int8", "uint8", "int16"))
    if x.dtype == "int16" and (x.zp or y.zp):
        raise ValueError("int16 RELU needs zero points 0")


def _relu_range(lo: float, hi: float | None) -> Callable[[OpContext, Array], Array]:
    def relu(ctx: OpContext, x: Array) -> Array:
        xq, yq = same_type_params(ctx)
        m = quantize_multiplier(float(np.float32(xq.s) / np.float32(yq.s)))
        out = multiply_by_quantized_multiplier(as_int32(x) - xq.zp, *m) + yq.zp
        qlo = max(yq.qmin, quantize_value(lo, yq))
        qhi = yq.qmax if hi is None else min(yq.qmax, quantize_value(hi, yq))
        return saturate(out, qlo, qhi, yq.np_dtype)

    return relu


register("RELU", check=check_relu, integer=True)(_relu_range(0.0, None))
register("RELU6", check=check_relu, integer=True)(_relu_range(0.0, 6.0))
register("RELU_N1_TO_1", check=check_relu, integer=True)(_relu_range(-1.0, 1.0))


def check_leaky_relu(ctx: OpContext) -> None:
    check_relu(ctx)
    if (ctx.options.alpha or 0.0) < 0:
        raise NotImplementedError("integer LEAKY_RELU with a negative alpha is not supported")


@register("LEAKY_RELU", check=check_leaky_relu, integer=True)
def leaky_relu(ctx: OpContext, x: Array) -> Array:
    """Integer LEAKY_RELU: one multiplier for x' >= 0, another (times alpha) below."""
    xq, yq = same_type_params(ctx)
    alpha = np.float32(ctx.options.alpha or 0.0)
    identity = quantize_multiplier(float(np.float32(xq.s) / np.float32(yq.s)))
    scaled = quantize_multiplier(float(np.float32(xq.s) * alpha / np.float32(yq.s)))
    v = as_int32(x) - xq.zp
    out = jnp.where(v >= 0, multiply_by_quantized_multiplier(v, *identity),
                    multiply_by_quantized_multiplier(v, *scaled)) + yq.zp
    return saturate(out, yq.qmin, yq.qmax, yq.np_dtype)


# ----------------------------------------------------------------------------- LOGISTIC, TANH


def _sigmoid32(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)) in float32 (exp correctly rounded from float64)."""
    e = np.exp(-v.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / (np.float32(1.0) + e)).astype(np.float32)


def _tanh32(v: np.ndarray) -> np.ndarray:
    return np.tanh(v.astype(np.float64)).astype(np.float32)


def checked_log2(x: float) -> int | None:
    """``round(log2(x))`` when x is a power of two to within 1e-3 in log2 (LiteRT's
    CheckedLog2, in float32), else None."""
    with np.errstate(divide="ignore"):
        log2 = np.log(np.float32(x)) * (np.float32(1.0) / np.log(np.float32(2.0)))
    rounded = round_away(log2)
    return int(rounded) if abs(float(log2) - float(rounded)) < 1e-3 else None


def int16_input_scaling(scale: float) -> tuple[int, int]:
    """(M, k) bringing an int16 input to the scale 1 / (3 * 4096): ``s * 12288`` (double
    from the float32 scale) doubled while at most 16383.5 (k at most 31), truncated."""
    multiplier, shift = float(np.float32(scale)) * 4096.0 * 3.0, 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    return int(multiplier), shift


def check_sigmoid(ctx: OpContext) -> None:
    x, y = same_type_params(ctx)
    key = ctx.op.key
    if key == "LOGISTIC" and x.dtype != "int16" and y.s != 1.0 / 256:
        raise ValueError(f"integer LOGISTIC needs output scale 1/256, got {y.s}")
    if x.dtype != "int16":
        return
    if x.zp or y.zp:
        raise ValueError(f"int16 {key} needs zero points 0")
    if checked_log2(y.s) != -15 or (key == "LOGISTIC" and y.s != 1.0 / 32768):
        raise ValueError(f"int16 {key} needs output scale 2**-15, got {y.s}")
    log2 = checked_log2(x.s)
    if log2 is not None and 12 + log2 in ((0, 1) if key == "TANH" else (0,)):
        raise NotImplementedError(f"int16 {key} with input scale 2**{log2} (LiteRT's "
                                  "power-of-two gemmlowp path) is not supported")
    if int16_input_scaling(x.s)[0] >= 1 << 16:
        raise NotImplementedError(f"int16 {key} input scale {x.s} is too large: LiteRT's "
                                  "int32 input rescaling overflows")


def sigmoid_table() -> np.ndarray:
    """LiteRT's 256-entry table of ``sigmoid(i / 24)`` in 0.16 fixed point: each entry
    ``round(S(i) - (S(i)/2 + S(i+1)/2 - S(i + 1/2)) / 2)`` with ``S(t) = 65536 sigmoid(t/24)``
    (lowered by half the error of linear interpolation at its interval's midpoint); the last
    entry is 65535."""
    i = np.arange(256, dtype=np.float64)

    def s(t: np.ndarray) -> np.ndarray:
        return 65536.0 / (1.0 + np.exp(-t / 24.0))

    table = round_away(s(i) - ((s(i) + s(i + 1)) / 2 - s(i + 0.5)) / 2)
    table[-1] = 65535
    return table.astype(np.int32)


def _sigmoid_int16(ctx: OpContext, x: Array, tanh: bool) -> Array:
    xq, _ = same_type_params(ctx)
    m, k = int16_input_scaling(xq.s)
    v = (as_int32(x) * m + ((1 << (k - 1)) if k else 0)) >> k
    frac = 8 if tanh else 9                      # TANH reads sigmoid at 2x
    a = jnp.abs(v)
    index = jnp.minimum(a >> frac, 254)
    table = jnp.asarray(sigmoid_table())
    lo, hi = table[index], table[index + 1]
    r = (lo << frac) + (a & ((1 << frac) - 1)) * (hi - lo)
    saturated = (a >> frac) >= 255
    if tanh:  # 2 sigmoid - 1, in 0.15
        r = jnp.where(saturated, 0xFFFF << 8, r)
        r = jnp.where(v >= 0, r - (1 << 23) + (1 << 7), -r + (1 << 23) + (1 << 7) - 1) >> 8
    else:
        r = jnp.where(saturated, 0x7FFF << 10, r)
        r = jnp.where(v >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1) >> 10
    return r.astype(jnp.int16)


def _table_op(fn: Callable[[np.ndarray], np.ndarray], tanh: bool
              ) -> Callable[[OpContext, Array], Array]:
    def op(ctx: OpContext, x: Array) -> Array:
        xq, yq = same_type_params(ctx)
        if xq.dtype == "int16":
            return _sigmoid_int16(ctx, x, tanh)
        return jnp.asarray(lut(xq, yq, fn))[as_int32(x) - xq.qmin]

    return op


register("LOGISTIC", check=check_sigmoid, integer=True)(_table_op(_sigmoid32, tanh=False))
register("TANH", check=check_sigmoid, integer=True)(_table_op(_tanh32, tanh=True))


# ----------------------------------------------------------------------------- HARD_SWISH


def _int16_multiplier(real: np.float32) -> tuple[int, int]:
    """quantize_multiplier of a float32 ratio, the fraction reduced to 16 bits as LiteRT's
    DownScaleInt32ToInt16Multiplier does: ``(m + 2**15) >> 16``, 32767 near 2**31."""
    m, exponent = quantize_multiplier(float(real))
    m16 = 32767 if m >= INT32_MAX - (1 << 15) else (m + (1 << 15)) >> 16
    return m16, exponent


def _hard_swish_multipliers(xq: QParams, yq: QParams) -> tuple[tuple[int, int], ...]:
    hires = np.float32(1.0 / 128.0) * np.float32(xq.s)
    return (_int16_multiplier(hires / np.float32(yq.s)),
            _int16_multiplier(hires / (np.float32(3.0) / np.float32(32768.0))))


def check_hard_swish(ctx: OpContext) -> None:
    x, y = same_type_params(ctx, ("int8", "uint8"))
    if _hard_swish_multipliers(x, y)[0][1] > 0:
        raise ValueError(f"integer HARD_SWISH needs output scale above input scale / 128, "
                         f"got {y.s} and {x.s}")


def _hard_swish(v: int, out: tuple[int, int], reluish: tuple[int, int], zp: int) -> int:
    """One output of LiteRT's 16-bit HARD_SWISH from ``v = x - x_zp`` (before the clamp)."""
    (m_out, e_out), (m_rel, e_rel) = out, reluish
    hires = wrap(v * (1 << 7), 16)
    on_output_scale = srdhm(hires, m_out, 16)
    r = saturating_shl(hires, e_rel - 1, 16) if e_rel > 0 else hires
    r = srdhm(r, m_rel, 16)
    if e_rel > 0:
        r = saturating_shl(r, 1, 16)
    elif e_rel < 0:
        r = rdbpot(r, -e_rel)
    r = (r + (1 << 15)) >> 1                     # [-1, 1] -> [0, 1]
    y = rdbpot(sdhm(r, on_output_scale, 16), -e_out)
    return wrap(y + zp, 16)


@register("HARD_SWISH", check=check_hard_swish, integer=True)
def hard_swish(ctx: OpContext, x: Array) -> Array:
    """Integer HARD_SWISH: LiteRT's fixed-point kernel tabulated over every input value."""
    xq, yq = same_type_params(ctx)
    out, reluish = _hard_swish_multipliers(xq, yq)
    table = np.array([_hard_swish(q - xq.zp, out, reluish, yq.zp)
                      for q in range(xq.qmin, xq.qmax + 1)])
    table = np.clip(table, yq.qmin, yq.qmax).astype(yq.dtype)
    return jnp.asarray(table)[as_int32(x) - xq.qmin]
