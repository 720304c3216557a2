"""Integer kernels of the weighted operators: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED,
TRANSPOSE_CONV, BATCH_MATMUL.

LiteRT's rule, per output channel c (per-tensor parameters: one channel):

    acc[c]  = sum (x - x_zp) * (w - w_zp) + bias[c]          (exact integers)
    out     = clamp(MBQM(acc, M[c]) + y_zp, act_lo, act_hi)

(MBQM's final shift rounds ties as LiteRT's kernel for the operator and type does:
:func:`_ties`.)

with ``M[c] = quantize_multiplier(x_scale * w_scale[c] / y_scale)`` (computed in double from
the float32 scales), MBQM :func:`~.fixed_point.multiply_by_quantized_multiplier` and the
clamp the fused activation's integer range (:func:`~.params.activation_range`). int8 and
uint8 activations take int8 (symmetric, per-channel or per-tensor) or uint8 (per-tensor,
with a zero point) weights and int32 biases. 16x8 kernels (int16 activations with zero point
0, int8 weights) accumulate in 64 bits in LiteRT; its convolutions take an int64 bias and
rescale with the 64-bit variant (:func:`~.fixed_point.multiply_by_quantized_multiplier_wide`),
its FULLY_CONNECTED an int32 bias (ruy: int32 accumulator, one 64-bit rounding,
:func:`~.fixed_point.multiply_by_quantized_multiplier_single`) or an int64 one (its
reference kernel: int64 accumulator, ``round(acc * s_x * s_w / s_y)`` in double,
:mod:`.double_requant`). circle-jax accumulates in int32 where every channel's bound
``32768 * sum|w| + |bias|`` is below 2**31, else in a 64-bit pair of words built from
int32 products of the input's bytes (:func:`_bytes`): the int64-bias FULLY_CONNECTED
always, CONV_2D and DEPTHWISE_CONV_2D past int32 (:func:`_spatial_conv_i64`). Refused at
load: an int32-bias 16x8 FULLY_CONNECTED past int32 (LiteRT's accumulator overflows),
a 16x8 TRANSPOSE_CONV past int32, more than 65535 products per output.

Products are computed in int32 by XLA's integer convolutions and dot products: exact.

BATCH_MATMUL (no bias, no activation, per-tensor): int8 operands with any zero points
accumulate in int32; int16 x int16 and int16 x int8 (zero points 0) accumulate in int64 in
LiteRT, and here in a 64-bit pair of words built exactly from int32 matmuls of the operands'
bytes (:func:`_matmul_i64`), rescaled by LiteRT's int64 variant
(:func:`~.fixed_point.multiply_by_quantized_multiplier_i64`). LiteRT has no uint8 or
int8 x int16 kernel: refused.

A weight may come as a :class:`~.params.Requantized` (quantization-aware training's integer
forward, which re-quantizes the weights inside the traced step): its traced scales give
traced multipliers, computed exactly as the double-precision ones
(:func:`~.fixed_point.quantize_scale_ratio`), and its traced zero point is subtracted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..conv import (
    conv,
    dense_rows,
    spatial_geometry,
    transpose_conv_2d,
    transpose_geometry,
)
from ..registry import OpContext, register
from .double_requant import requantize_double, split_scale
from .fixed_point import (
    _mul_u64,
    _static,
    _u32,
    i64_add,
    i64_from_i32,
    i64_shl,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_i64,
    multiply_by_quantized_multiplier_single,
    multiply_by_quantized_multiplier_wide,
    quantize_multiplier,
    quantize_multipliers,
    quantize_scale_ratio,
    saturate,
)
from .params import QParams, Requantized, activation_range, as_int32, qparams

Array = Any

#: Input positions of (activation, weights, bias) per operator.
_ROLES = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2), "FULLY_CONNECTED": (0, 1, 2),
          "TRANSPOSE_CONV": (2, 1, 3)}
#: The axis of the weights that indexes output channels.
_CHANNEL_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0, "TRANSPOSE_CONV": 0}
_WIDE_LIMIT = (1 << 31) - 1


def _ties(key: str, dtype: str) -> str:
    """How the final shift of the output rescaling rounds ties in LiteRT's default kernel:
    toward +infinity in its 8-bit GEMMs (ruy's x86 kernels: CONV_2D, FULLY_CONNECTED, uint8
    TRANSPOSE_CONV) and its int8 depthwise kernel, away from zero elsewhere (int8
    TRANSPOSE_CONV, which rescales after its col2im, uint8 DEPTHWISE_CONV_2D, BATCH_MATMUL,
    16x8). Measured against LiteRT on ~75,000 outputs: the other rule differs in 1 to 3
    outputs per thousand; TRANSPOSE_CONV on 100 random cases per type
    (tests/ops/test_ops_integer_conv.py's case, seeds 0-99): int8 per tensor and per channel
    "up" fails 10 and 8, "away" none; uint8 "away" fails 18, "up" none."""
    if dtype == "int16" or key == "BATCH_MATMUL":
        return "away"
    if key == "DEPTHWISE_CONV_2D":
        return "up" if dtype == "int8" else "away"
    if key == "TRANSPOSE_CONV":
        return "away" if dtype == "int8" else "up"
    return "up"


def _weight_params(ctx: OpContext) -> tuple[QParams, QParams, QParams]:
    """(input, weights, output) parameters, checked as LiteRT's Prepare does."""
    xi, wi, _ = _ROLES[ctx.op.key]
    x = qparams(ctx, "input", xi)
    w = qparams(ctx, "input", wi, dtypes=("int8", "uint8", "int4"), per_channel=True)
    y = qparams(ctx, "output", 0, dtypes=(x.dtype,))
    if x.dtype == "int16" and (x.zp != 0 or y.zp != 0):
        raise ValueError("16x8 kernels need input and output zero points 0")
    if w.dtype in ("int8", "int4") and np.any(w.zero_point != 0):
        raise ValueError(f"{w.dtype} weights {w.name[:60]!r} need zero points 0 (symmetric)")
    takes = {"uint8": ("uint8",), "int8": ("int8", "int4"), "int16": ("int8",)}[x.dtype]
    if w.dtype not in takes:
        raise NotImplementedError(f"{x.dtype} activations with {w.dtype} weights are not "
                                  "supported (int8 with int8 or int4 weights, int16 with "
                                  "int8, uint8 with uint8)")
    if w.per_channel and w.axis != _CHANNEL_AXIS[ctx.op.key]:
        raise ValueError(f"weights {w.name[:60]!r} are quantized along dimension {w.axis}; "
                         f"{ctx.op.key} needs dimension {_CHANNEL_AXIS[ctx.op.key]}")
    return x, w, y


def check_weighted(ctx: OpContext) -> None:
    """Load-time checks: parameters present and of supported types, a bias of the right
    type, and for 16x8 kernels an accumulator bound below 2**31."""
    x, w, y = _weight_params(ctx)
    bias = _bias_tensor(ctx)
    wide = x.dtype == "int16"
    allowed = ("int32",)
    if wide:
        allowed = ("int32", "int64") if ctx.op.key == "FULLY_CONNECTED" else ("int64",)
    if bias is not None and bias.dtype not in allowed:
        raise NotImplementedError(f"bias {bias.name[:60]!r} is {bias.dtype}; {x.dtype} "
                                  f"{ctx.op.key} takes {'/'.join(allowed)} (LiteRT's 16x8 "
                                  "convolutions read their bias as int64)")
    wt = ctx.inputs[_ROLES[ctx.op.key][1]]
    if _double_path(ctx, x):
        bound = _accumulator_bound(ctx, wt, bias)
        if bound >= 1 << 53:
            raise NotImplementedError(f"a channel's 16x8 accumulator may reach {bound}, "
                                      "beyond the 2**53 LiteRT's double rescaling is exact in")
        if wt is not None and wt.shape and wt.shape[-1] > 65535:
            raise NotImplementedError(f"16x8 FULLY_CONNECTED over {wt.shape[-1]} products "
                                      "with an int64 accumulator (at most 65535)")
        return
    if wide and _accumulator_bound(ctx, wt, bias) > _WIDE_LIMIT:
        taps = int(np.prod(wt.shape)) // wt.shape[_CHANNEL_AXIS[ctx.op.key]] \
            if wt is not None and wt.data is not None else 1 << 62
        bound = _accumulator_bound(ctx, wt, bias)
        if ctx.op.key == "FULLY_CONNECTED":
            raise NotImplementedError(
                f"a channel's 16x8 accumulator may reach {bound}, beyond the int32 LiteRT's "
                "FULLY_CONNECTED with an int32 bias accumulates in (an int64 bias: exact)")
        if ctx.op.key == "TRANSPOSE_CONV" or taps > 65535:
            raise NotImplementedError(
                f"a channel's 16x8 accumulator may reach {bound} over {taps} products, beyond "
                "the int32 circle-jax accumulates this kernel in (LiteRT uses int64)")


def _double_path(ctx: OpContext, x: QParams) -> bool:
    """Whether LiteRT runs its reference 16x8 FULLY_CONNECTED: an int64 bias, or
    ``quantized_bias_type`` INT64 (TensorType 4): a 64-bit accumulator rescaled in double
    (:mod:`.double_requant`)."""
    if x.dtype != "int16" or ctx.op.key != "FULLY_CONNECTED":
        return False
    bias = _bias_tensor(ctx)
    return (bias is not None and bias.dtype == "int64") or \
        int(ctx.options.quantized_bias_type or 0) == 4


def _accumulator_bound(ctx: OpContext, wt: Any, bias: Any) -> int:
    """``32768 * sum|w| + |bias|``, the largest channel's (unbounded weights: 2**62)."""
    if wt is None or wt.data is None:
        return 1 << 62
    axis = _CHANNEL_AXIS[ctx.op.key]
    mag = np.abs(np.moveaxis(wt.data.astype(np.int64), axis, 0)).reshape(
        wt.shape[axis], -1).sum(axis=1) * 32768
    if bias is not None and bias.data is not None:
        mag = mag + np.abs(bias.data.astype(np.int64)).reshape(-1)
    return int(mag.max(initial=0))


def _wide(ctx: OpContext, x: QParams) -> bool:
    """Whether LiteRT rescales with its 64-bit variant: the 16x8 convolutions (its 16x8
    FULLY_CONNECTED uses the 32-bit one)."""
    return x.dtype == "int16" and ctx.op.key != "FULLY_CONNECTED"


def _bias_tensor(ctx: OpContext) -> Any:
    bi = _ROLES[ctx.op.key][2]
    return ctx.inputs[bi] if bi < len(ctx.inputs) else None


def _multipliers(x: QParams, w: QParams, y: QParams) -> tuple[Any, Any]:
    """Per output channel (m, shift) of x_scale * w_scale[c] / y_scale, in double (traced
    scales of re-quantized weights: :func:`~.fixed_point.quantize_scale_ratio`, exact)."""
    if not isinstance(w.scale, np.ndarray):
        m, shift = quantize_scale_ratio(np.float32(x.s), w.scale, np.float32(y.s))
        return m.reshape(-1), shift.reshape(-1)
    real = np.float64(x.s) * w.scale.astype(np.float64) / np.float64(y.s)
    return quantize_multipliers(real.reshape(-1))


def _rescale(ctx: OpContext, acc: Array, b: Any, x: QParams, w: QParams, y: QParams) -> Array:
    """Bias, output multiplier (per channel along the last axis), zero point and clamp."""
    if b is not None:
        acc = acc + as_int32(b)
    m, shift = _multipliers(x, w, y)
    if _wide(ctx, x):
        out = multiply_by_quantized_multiplier_wide(acc, m, shift)
    elif x.dtype == "int16":  # 16x8 FULLY_CONNECTED: one rounding
        out = multiply_by_quantized_multiplier_single(acc, m, shift)
    else:
        out = multiply_by_quantized_multiplier(acc, m, shift, _ties(ctx.op.key, x.dtype))
    lo, hi = activation_range(ctx.options.fused_activation_function, y)
    return saturate(out + y.zp, lo, hi, y.np_dtype)


def _offset(v: Any, q: QParams) -> Array:
    """``v - zero_point`` as int32 (per-tensor zero points; int8 weights have 0)."""
    v = as_int32(v)
    if not isinstance(q.zero_point, np.ndarray):  # traced: a re-quantized weight's
        return v - jnp.asarray(q.zero_point).reshape(-1)[0].astype(jnp.int32)
    return v - q.zp if q.zp else v


def _weights(w: Any, q: QParams) -> tuple[Any, QParams]:
    """A weight's integers and parameters: the file's, or those of a :class:`Requantized`
    weight (QAT's integer forward)."""
    if isinstance(w, Requantized):
        return w.values, replace(q, scale=w.scale, zero_point=w.zero_point)
    return w, q


@register("CONV_2D", "DEPTHWISE_CONV_2D", check=check_weighted, integer=True)
def spatial_conv(ctx: OpContext, x: Array, w: Array, b: Array = None) -> Array:
    """Integer CONV_2D / DEPTHWISE_CONV_2D (layouts and geometry as the float kernels)."""
    xq, wq, yq = _weight_params(ctx)
    w, wq = _weights(w, wq)
    xs = _offset(x, xq)
    ws, g = spatial_geometry(ctx, xs, _offset(w, wq))
    if xq.dtype == "int16" and _accumulator_bound(ctx, ctx.inputs[1], _bias_tensor(ctx)) \
            > _WIDE_LIMIT:
        return _spatial_conv_i64(ctx, xs, ws, g, b, xq, wq, yq)
    return _rescale(ctx, conv(xs, ws, g), b, xq, wq, yq)


def _spatial_conv_i64(ctx: OpContext, x: Array, w: Array, g: Any, b: Any, xq: QParams,
                      wq: QParams, yq: QParams) -> Array:
    """A 16x8 convolution whose accumulator may pass int32: the int64 accumulator from
    int32 convolutions of the input's bytes (:func:`_bytes`), plus the int64 bias, rescaled
    per channel by LiteRT's int64 MultiplyByQuantizedMultiplier (15-bit multiplier, one
    rounding half up: :func:`~.fixed_point.multiply_by_quantized_multiplier_i64`)."""
    acc = None
    for piece, shift in _bytes(x, "int16"):
        part = i64_shl(i64_from_i32(conv(piece, w, g)), shift)
        acc = part if acc is None else i64_add(acc, part)
    if b is not None:
        acc = i64_add(acc, _i64_words(b))
    m, shift = _multipliers(xq, wq, yq)
    if _static(m, shift) and (np.any(15 - np.asarray(shift) < 1)
                              or np.any(15 - np.asarray(shift) > 62)):
        raise ValueError(f"shift {shift} is out of LiteRT's range for 64-bit accumulators")
    m = jnp.asarray(m).astype(jnp.int32)  # static or traced (QAT), in [0, 2**31)
    m15 = _u32(jnp.where(m < 0x7FFF0000, (m >> 16) + ((m >> 15) & 1), 0x7FFF))
    t = jnp.clip(15 - jnp.asarray(shift).astype(jnp.int32), 1, 62)
    hi, lo = acc
    ph, pl = _mul_u64(lo, m15)
    hi, lo = hi * m15 + ph, pl
    e = t - 1  # + 2**e, then an arithmetic shift right by t
    one = jnp.uint32(1)
    hi, lo = i64_add((hi, lo), (jnp.where(e >= 32, one << _u32(jnp.maximum(e - 32, 0)), 0),
                                jnp.where(e < 32, one << _u32(jnp.minimum(e, 31)), 0)))
    low = t < 32
    tl, th = _u32(jnp.where(low, t, 1)), jnp.where(low, 1, t - 32)
    small = lax.bitcast_convert_type((lo >> tl) | (hi << (32 - tl)), jnp.int32)
    big = lax.bitcast_convert_type(hi, jnp.int32) >> th
    out = jnp.where(low, small, big)
    lo_, hi_ = activation_range(ctx.options.fused_activation_function, yq)
    return saturate(out + yq.zp, lo_, hi_, yq.np_dtype)


@register("FULLY_CONNECTED", check=check_weighted, integer=True)
def fully_connected(ctx: OpContext, x: Array, w: Array, b: Array = None) -> Array:
    """Integer FULLY_CONNECTED: rows of ``in`` values times weights [out, in]."""
    xq, wq, yq = _weight_params(ctx)
    w, wq = _weights(w, wq)
    rows = dense_rows(ctx, _offset(x, xq), w)
    if _double_path(ctx, xq):
        return _fully_connected_double(ctx, rows, _offset(w, wq), b, xq, wq, yq)
    acc = lax.dot_general(rows, _offset(w, wq), (((rows.ndim - 1,), (1,)), ((), ())),
                          preferred_element_type=jnp.int32)
    return _rescale(ctx, acc, b, xq, wq, yq)


def _fully_connected_double(ctx: OpContext, rows: Array, w: Array, b: Any, x: QParams,
                            w_q: QParams, y: QParams) -> Array:
    """LiteRT's reference 16x8 FULLY_CONNECTED (:func:`_double_path`): the int64
    accumulator from int32 products of the input's bytes (:func:`_bytes`; each piece's
    products below 2**15, exact while ``in`` < 2**16), plus the bias, rescaled by
    ``round(acc * (s_x * s_w[c] / s_y))`` in double (:mod:`.double_requant`)."""
    dims = (((rows.ndim - 1,), (1,)), ((), ()))
    acc = None
    for piece, shift in _bytes(as_int32(rows), "int16"):
        part = i64_shl(i64_from_i32(lax.dot_general(
            piece, w, dims, preferred_element_type=jnp.int32)), shift)
        acc = part if acc is None else i64_add(acc, part)
    if b is not None:
        acc = i64_add(acc, _i64_words(b))
    lo, hi = activation_range(ctx.options.fused_activation_function, y)
    if not isinstance(w_q.scale, np.ndarray):  # QAT's traced weight scales: float32
        return _requantize_traced(acc, x, w_q, y, lo, hi)
    effective = np.float64(x.s) * w_q.scale.astype(np.float64).reshape(-1) / np.float64(y.s)
    m, s = split_scale(effective)
    out = requantize_double(*acc, m, s)
    return saturate(out + y.zp, lo, hi, y.np_dtype)


def _requantize_traced(acc: tuple[Array, Array], x: QParams, w_q: QParams, y: QParams,
                       lo: int, hi: int) -> Array:
    """The double rescaling of :func:`_fully_connected_double` for traced weight scales
    (quantization-aware training's integer forward) in float32: ``acc`` to float32 from its
    words, times ``s_x * s_w / s_y``, rounded half away from zero; within one step of
    LiteRT's output (a float32 rounding near a half), the export itself is exact."""
    from ...graph.quantization import round_half_away

    a_hi = lax.bitcast_convert_type(acc[0], jnp.int32).astype(jnp.float32)
    value = a_hi * jnp.float32(2.0 ** 32) + acc[1].astype(jnp.float32)
    scale = jnp.float32(x.s) * jnp.asarray(w_q.scale, jnp.float32).reshape(-1) / \
        jnp.float32(y.s)
    out = jnp.clip(round_half_away(value * scale, jnp), lo - y.zp, hi - y.zp)
    return saturate(out.astype(jnp.int32) + y.zp, lo, hi, y.np_dtype)




def _i64_words(b: Any) -> tuple[Array, Array]:
    """An int64 bias (numpy) as (hi, lo) uint32 words; a traced one from int32."""
    if isinstance(b, np.ndarray):
        u = b.astype(np.int64).view(np.uint64)
        return (jnp.asarray((u >> np.uint64(32)).astype(np.uint32)),
                jnp.asarray((u & np.uint64(0xFFFFFFFF)).astype(np.uint32)))
    return i64_from_i32(as_int32(b))


@register("TRANSPOSE_CONV", check=check_weighted, integer=True)
def transpose_conv(ctx: OpContext, output_shape: Any, w: Array, x: Array, b: Array = None
                   ) -> Array:
    """Integer TRANSPOSE_CONV: inputs (output_shape, filter [O, H, W, I], input, bias?)."""
    xq, wq, yq = _weight_params(ctx)
    w, wq = _weights(w, wq)
    xs = _offset(x, xq)
    g = transpose_geometry(ctx, xs, w, output_shape)
    return _rescale(ctx, transpose_conv_2d(xs, _offset(w, wq), g), b, xq, wq, yq)


def check_batch_matmul(ctx: OpContext) -> None:
    """Per-tensor operands and output: int8 x int8 -> int8, int16 x int16 -> int16 or
    int16 x int8 -> int16 (zero points 0), LiteRT's kernels; a contraction of at most 2**15
    (the int32 partial sums of :func:`_matmul_i64` stay exact)."""
    x = qparams(ctx, "input", 0, dtypes=("int8", "int16"))
    y = qparams(ctx, "input", 1, dtypes=("int8", "int16") if x.dtype == "int16" else ("int8",))
    o = qparams(ctx, "output", 0, dtypes=(x.dtype,))
    if x.dtype == "int16" and (x.zp or y.zp or o.zp):
        raise ValueError("int16 BATCH_MATMUL needs zero points 0")
    shape = ctx.inputs[0].shape
    depth = shape[-2 if ctx.options.adjoint_lhs else -1] if shape else -1
    if x.dtype == "int16" and depth > 1 << 15:
        raise NotImplementedError(f"int16 BATCH_MATMUL over {depth} products (at most 2**15)")


def _matmul(ctx: OpContext, a: Array, b: Array) -> Array:
    """a @ b over the last two dims with the operator's adjoints, exact in int32."""
    if ctx.options.adjoint_lhs:
        a = jnp.swapaxes(a, -1, -2)
    if ctx.options.adjoint_rhs:
        b = jnp.swapaxes(b, -1, -2)
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


def _bytes(v: Array, dtype: str) -> list[tuple[Array, int]]:
    """An int16 operand as its signed high byte and unsigned low byte (``v = 2**8 hi + lo``)
    with their shifts; an int8 operand whole."""
    return [(v >> 8, 8), (v & 0xFF, 0)] if dtype == "int16" else [(v, 0)]


def _matmul_i64(ctx: OpContext, a: Array, b: Array, a_type: str, b_type: str
                ) -> tuple[Array, Array]:
    """The 64-bit accumulator of an int16 BATCH_MATMUL: the sum over byte pieces of
    ``(a_i @ b_j) * 2**(s_i + s_j)``, each piece's products below 2**16 in magnitude."""
    acc = None
    for pa, sa in _bytes(a, a_type):
        for pb, sb in _bytes(b, b_type):
            part = i64_shl(i64_from_i32(_matmul(ctx, pa, pb)), sa + sb)
            acc = part if acc is None else i64_add(acc, part)
    return acc


@register("BATCH_MATMUL", check=check_batch_matmul, integer=True)
def batch_matmul(ctx: OpContext, x: Array, y: Array) -> Array:
    """Integer x @ y over the last two dims (adjoints, broadcast batch dims): one multiplier
    ``x_scale * y_scale / out_scale``; int8 accumulates in int32, int16 in 64 bits (rescaled
    by LiteRT's int64 MultiplyByQuantizedMultiplier)."""
    xq, yq, oq = (qparams(ctx, "input", 0), qparams(ctx, "input", 1),
                  qparams(ctx, "output", 0))
    m, shift = quantize_multiplier(np.float64(xq.s) * np.float64(yq.s) / np.float64(oq.s))
    if xq.dtype == "int16":
        acc = _matmul_i64(ctx, as_int32(x), as_int32(y), xq.dtype, yq.dtype)
        out = multiply_by_quantized_multiplier_i64(acc, m, shift)
    else:
        acc = _matmul(ctx, _offset(x, xq), _offset(y, yq))
        out = multiply_by_quantized_multiplier(acc, m, shift, _ties("BATCH_MATMUL", "int8"))
    return saturate(out + oq.zp, oq.qmin, oq.qmax, oq.np_dtype)
