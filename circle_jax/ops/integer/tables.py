"""LiteRT's lookup tables: the 256-entry table of an 8-bit input (:func:`lut`) and the
513-entry interpolated table of an int16 input (:func:`lut16`, :func:`lut16_lookup`).

Both are built from a float function of the dequantized input, in float32 (LiteRT's
``LUTPopulate``; its int16 SOFTMAX tables in float64), with C's ``round`` (half away from
zero).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from .params import QParams

Array = Any


def round_away(v: Any) -> np.ndarray:
    """Round half away from zero (C's ``round``) of float values, exactly, as float64."""
    v = np.asarray(v, np.float64)
    t = np.trunc(v)
    return np.where(np.abs(v - t) >= 0.5, t + np.sign(v), t)


def lut(xq: QParams, yq: QParams, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The output of every input value of an 8-bit type, as LiteRT's LUTPopulate computes
    it in float32 (``fn`` maps float32 to float32)."""
    q = np.arange(xq.qmin, xq.qmax + 1)
    dequantized = np.float32(xq.s) * (q - xq.zp).astype(np.float32)
    with np.errstate(all="ignore"):
        transformed = fn(dequantized).astype(np.float32)
        rescaled = round_away(transformed * (np.float32(1.0) / np.float32(yq.s)))
    finite = np.isfinite(transformed)
    out = np.where(finite, rescaled + yq.zp, yq.qmin)
    return np.clip(out, yq.qmin, yq.qmax).astype(yq.dtype)


def lut16(fn: Callable[[Any], Any], in_scale: float, in_zp: int, out_scale: float,
          out_zp: int, dtype: Any = np.float64) -> np.ndarray:
    """LiteRT's 513-entry int16 table of ``fn`` computed in ``dtype`` (float64 or float32):
    512 samples over the input range, each biased by half the interpolation error at its
    midpoint, then the end."""
    f = np.dtype(dtype).type
    lo16, hi16 = f(-32768), f(32767)
    in_min, in_max = f(in_scale) * f(-32768 - in_zp), f(in_scale) * f(32767 - in_zp)
    out_min, out_max = f(out_scale) * f(-32768 - out_zp), f(out_scale) * f(32767 - out_zp)
    step = (in_max - in_min) / f(512)
    inv = f(65536) / (out_max - out_min)

    def rnd(v: Any) -> Any:
        return f(round_away(f(v)))

    table = []
    for i in range(512):
        x = in_min + f(i) * step
        val, mid = f(fn(x)), f(fn(x + step / f(2)))
        nxt = f(fn(in_min + f(i + 1) * step))
        sample = rnd(val * inv)
        interp = rnd((nxt * inv + rnd(val * inv)) / f(2))
        bias = rnd((interp - rnd(mid * inv)) / f(2))
        table.append(min(max(sample - bias, lo16), hi16))
    table.append(min(max(rnd(f(fn(in_max)) * inv), lo16), hi16))
    return np.asarray(table, np.int32)


def lut16_lookup(v: Array, table: np.ndarray) -> Array:
    """Linear interpolation in a 513-entry table at int16 ``v`` (int32 array): entry
    ``256 + (v >> 7)`` plus ``(slope * (v & 127) + 64) >> 7``."""
    t = jnp.asarray(table)
    index = 256 + (v >> 7)
    base = t[index]
    slope = t[index + 1] - base
    return base + ((slope * (v & 0x7F) + 64) >> 7)
