"""A quantized tensor's parameters, and the one rule that rounds real values onto them.

An affine-quantized tensor holds integers q of ``dtype`` standing for ``scale * (q -
zero_point)``, with one (scale, zero point) for the whole tensor or one per index of its
quantized dimension ``axis`` (per channel). :class:`QParams` is that description, read from
a tensor by :meth:`QParams.of`; the integer kernels (`circle_jax.ops.integer`), the fake
quantization plan (`circle_jax.passes.fake_quant`), the dequantize pass's requantization
(`circle_jax.passes.dequantize`) and QAT's export (`circle_jax.passes.qat`) all use it.

The rounding rule (:func:`round_half_away`) is LiteRT's, since LiteRT runs what circle-jax
exports: the quotient ``value / scale`` is computed in float32 and rounded to nearest, ties
away from zero, as ``sign(v) * floor(|v| + 0.5)`` in float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ir


def round_half_away(v: Any, xp: Any = np) -> Any:
    """``v`` (float32) rounded to nearest, ties away from zero, with array module ``xp``
    (numpy, or jax.numpy for traced values): the rule everything that quantizes uses."""
    return xp.sign(v) * xp.floor(xp.abs(v) + np.float32(0.5))


def quantize(value: Any, scale: Any, zero_point: Any, qmin: int, qmax: int,
             xp: Any = np) -> Any:
    """``clip(round_half_away(value / scale) + zero_point, qmin, qmax)`` in float32 (the
    integers as floats)."""
    v = xp.asarray(value, np.float32) / xp.asarray(scale, np.float32)
    return xp.clip(round_half_away(v, xp) + xp.asarray(zero_point, np.float32), qmin, qmax)


def dequantize(q: Any, scale: Any, zero_point: Any, axis: int = 0) -> np.ndarray:
    """The real values ``scale * (q - zero_point)`` of integers ``q`` (numpy, float64), with
    one scale and zero point, or one per index of dimension ``axis`` (per channel)."""
    scale = np.asarray(scale, np.float64).reshape(-1)
    zero = np.broadcast_to(np.asarray(zero_point, np.float64).reshape(-1), scale.shape)
    q = np.asarray(q)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (q.astype(np.float64) - zero) * scale


@dataclass(frozen=True, eq=False)
class QParams:
    """One tensor's quantization: its integer ``dtype``, float32 ``scale`` and int64
    ``zero_point`` arrays (one entry, or one per index of ``axis``) and the tensor's
    ``name``. Tuples given for ``scale`` and ``zero_point`` become those arrays; traced
    values (a weight re-quantized in a traced step, QAT's integer forward) stay as given."""

    dtype: str
    scale: Any
    zero_point: Any
    axis: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.scale, (tuple, list, float)):
            object.__setattr__(self, "scale", np.asarray(self.scale, np.float32).reshape(-1))
        if isinstance(self.zero_point, (tuple, list, int)):
            zero = np.asarray(self.zero_point, np.int64).reshape(-1)
            object.__setattr__(self, "zero_point", zero)

    @classmethod
    def of(cls, t: ir.Tensor) -> QParams:
        """The parameters of quantized tensor ``t`` (missing zero points are 0)."""
        q = t.quantization
        assert q is not None and q.scale
        return cls(t.dtype, tuple(q.scale), tuple(q.zero_point) or (0,) * len(q.scale),
                   q.quantized_dimension, t.name)

    @property
    def per_channel(self) -> bool:
        return np.size(self.scale) > 1

    @property
    def s(self) -> float:
        """The per-tensor scale (float32 value, as a Python float)."""
        return float(np.asarray(self.scale).reshape(-1)[0])

    @property
    def zp(self) -> int:
        """The per-tensor zero point."""
        return int(np.asarray(self.zero_point).reshape(-1)[0])

    @property
    def qmin(self) -> int:
        return int(np.iinfo(self.dtype).min)

    @property
    def qmax(self) -> int:
        return int(np.iinfo(self.dtype).max)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def symmetric(self) -> bool:
        """Zero points all 0 on a signed type."""
        return self.qmin < 0 and not np.any(np.asarray(self.zero_point) != 0)

    def real_of(self, q: Any, xp: Any = np) -> Any:
        """:meth:`real` in float32 arithmetic of ``xp`` (numpy or jax.numpy, traced values
        too): ``(q - zp) * scale``, the product of exact values rounded once, as float64's
        rounded to float32."""
        scale = np.asarray(self.scale, np.float32).reshape(-1)
        zero = np.broadcast_to(np.asarray(self.zero_point, np.float32).reshape(-1), scale.shape)
        shape = [1] * q.ndim
        if scale.size > 1:
            shape[self.axis] = scale.size
        return (xp.asarray(q).astype(np.float32) - zero.reshape(shape)) * scale.reshape(shape)

    def real(self, q: Any) -> np.ndarray:
        """The real values of integers ``q`` stored with these parameters, as float32."""
        return dequantize(q, self.scale, self.zero_point, self.axis).astype(np.float32)

    def quantization(self) -> ir.Quantization:
        """These parameters as the IR stores them."""
        scale = np.asarray(self.scale, np.float32).reshape(-1)
        zero = np.broadcast_to(np.asarray(self.zero_point).reshape(-1), scale.shape)
        return ir.Quantization(tuple(float(s) for s in scale), tuple(int(z) for z in zero),
                               self.axis)


def stored_integers(file: ir.Model, loaded: ir.Model) -> tuple[QParams | None, ...]:
    """Per input of ``loaded``'s main graph: how ``file`` (the model it was loaded from, its
    inputs in the same order) stores it where ``file`` holds affine-quantized integers and
    ``loaded`` takes real values (a dequantized or quantization-aware training model); else
    None."""
    out: list[QParams | None] = []
    for i, j in zip(file.main.inputs, loaded.main.inputs, strict=True):
        t = file.main.tensors[i]
        q = t.quantization
        takes_real = np.issubdtype(ir.as_numpy_dtype(loaded.main.tensors[j].dtype), np.floating)
        out.append(QParams.of(t) if q is not None and q.scale and takes_real
                   and np.issubdtype(ir.as_numpy_dtype(t.dtype), np.integer) else None)
    return tuple(out)


def as_real_inputs(stored: Sequence[QParams | None], inputs: Iterable[Any],
                   xp: Any = np) -> tuple[Any, ...]:
    """``inputs`` with each one in the integer dtype its float input is stored in
    (``stored``, one entry per declared input: `circle_jax.TensorSpec.stored`) replaced by
    its real values (:meth:`QParams.real_of`, float32); the others, and any beyond the
    declared inputs, as given."""
    out = list(inputs)
    for k, q in enumerate(stored[:len(out)]):
        if q is not None and out[k].dtype == q.np_dtype:
            out[k] = q.real_of(out[k], xp)
    return tuple(out)
