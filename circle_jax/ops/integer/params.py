"""The quantization parameters an integer kernel reads, and LiteRT's activation ranges.

A quantized tensor holds q with real value ``scale * (q - zero_point)``. :func:`qparams`
gives a tensor's parameters, or a one-line refusal naming the tensor when it has none;
:func:`activation_range` is the integer clamp of a fused activation.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...graph import ir
from ...graph.quantization import QParams, quantize
from ..registry import OpContext

#: Value range of each quantized type.
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


class Requantized(NamedTuple):
    """A weight given to an integer kernel with parameters computed in the traced step (the
    integer forward of quantization-aware training re-quantizes the weights from their
    float masters at every step, `circle_jax.lowering.interpreter`): its integers and its
    traced scales and zero points, which replace the file's."""

    values: Any
    scale: Any
    zero_point: Any


def qparams(ctx: OpContext, where: str, index: int = 0, *,
            dtypes: tuple[str, ...] = tuple(RANGES), per_channel: bool = False) -> QParams:
    """The parameters of input ``index`` (``where="input"``) or output ``index``
    (``"output"``); ValueError naming the tensor when they are missing, of another type than
    ``dtypes`` or per channel where ``per_channel`` is False."""
    t = (ctx.inputs if where == "input" else ctx.outputs)[index]
    if t is None:
        raise ValueError(f"{where} {index} is missing")
    q = t.quantization
    if t.dtype not in dtypes:
        raise NotImplementedError(f"{where} {index} {t.name[:60]!r} is {t.dtype}; the integer "
                                  f"kernel takes {'/'.join(dtypes)}")
    if q is None:
        raise ValueError(f"{where} {index} {t.name[:60]!r} ({t.dtype}) has no quantization "
                         "parameters (scale, zero point), which its integer kernel needs")
    scale = np.asarray(q.scale, np.float32)
    if scale.size > 1 and not per_channel:
        raise NotImplementedError(f"{where} {index} {t.name[:60]!r} is quantized per channel; "
                                  "this kernel takes per-tensor parameters")
    return QParams.of(t)


def same_type_params(ctx: OpContext, dtypes: tuple[str, ...] = tuple(RANGES)
                     ) -> tuple[QParams, QParams]:
    """The parameters of input 0 (of one of ``dtypes``) and of output 0, which must be of the
    input's type."""
    x = qparams(ctx, "input", 0, dtypes=dtypes)
    return x, qparams(ctx, "output", 0, dtypes=(x.dtype,))

def quantize_value(value: float, q: QParams) -> int:
    """``zero_point + round(value / scale)`` (`circle_jax.graph.quantization`'s rule,
    unclamped), as LiteRT quantizes a real bound."""
    return int(quantize(value, q.s, q.zp, -np.inf, np.inf))


def activation_range(code: int | None, q: QParams) -> tuple[int, int]:
    """The integer range of a fused activation on output ``q``: RELU [zp, qmax], RELU6
    [zp, zp + round(6/scale)], RELU_N1_TO_1 [zp + round(-1/scale), zp + round(1/scale)],
    each within the type's range; NONE (and TANH, SIGN_BIT) the type's range."""
    lo, hi = q.qmin, q.qmax
    if code == ir.ACT_RELU:
        return max(lo, quantize_value(0.0, q)), hi
    if code == ir.ACT_RELU6:
        return max(lo, quantize_value(0.0, q)), min(hi, quantize_value(6.0, q))
    if code == ir.ACT_RELU_N1_TO_1:
        return max(lo, quantize_value(-1.0, q)), min(hi, quantize_value(1.0, q))
    return lo, hi


def channel_shape(values: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """Per-channel values laid along ``axis`` of a rank-``ndim`` tensor (a scalar stays)."""
    if values.size == 1:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)


def as_int32(x: Any) -> Any:
    """An integer tensor widened to int32 (numpy stays numpy)."""
    import jax.numpy as jnp

    return x.astype(np.int32) if isinstance(x, np.ndarray) else jnp.asarray(x).astype(jnp.int32)
