"""Hybrid (dynamic-range) kernels: FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D and
BATCH_MATMUL with float activations and weights on an integer grid, computed as LiteRT's
hybrid kernels compute them.

A hybrid operator's weight is a float32 tensor that keeps the quantization parameters it
was read with (`circle_jax.passes.dequantize_model` with ``keep_hybrid=True``, the default
load of a weight-only quantized file): its integers are ``q = round(w / scale)`` per output
channel (or per tensor), so a weight the file holds gives back the file's integers exactly
and a trained float32 master is read on the file's grid (clipped to int8's range). The
input is quantized on the fly to int8, the products accumulate in int32, and the
accumulator is scaled back in float32 (LiteRT's rules, checked bit for bit against LiteRT in
tests/ops/test_ops_hybrid.py):

- FULLY_CONNECTED: each row of the input on its own; symmetric (``s = max|x| / 127``,
  ``q = round(x * (127 / max|x|))`` clipped to [-127, 127]) or, with
  ``asymmetric_quantize_inputs``, asymmetric (``s = (max(x, 0) - min(x, 0)) / 255``, the
  zero point LiteRT computes in float64, :func:`asymmetric_zero_point`, and
  ``q = z + round(x * (1 / s))`` in [-128, 127]: the zero point added after rounding);
  output ``bias + (acc - z * sum(w_q)) * (s * scale)``.
- Blockwise FULLY_CONNECTED (int4 weights ``[N, K]``, one float16 scale per block of ``b``
  input channels, ai-edge-quantizer's ``dynamic_wi4b32``): each row asymmetric whatever the
  option says; per block an int32 accumulator, then in float32, block after block,
  ``y += acc_block * scale_block`` and ``k += scale_block * sum(w_q of the block)``; output
  ``bias + (y - z * k) * s`` (products rounded before each sum). LiteRT's kernel drops the
  fused activation and returns the bias alone for layers of fewer than 4 outputs (its
  faults, tests/ops/test_ops_hybrid_blockwise.py): circle-jax applies the activation and
  computes every output.
- CONV_2D: each sample (the whole image) on its own; with per-channel weights asymmetric,
  whatever the option says (LiteRT's per-channel hybrid convolution), with per-tensor
  weights symmetric; padding contributes nothing; ``bias + acc * (s * scale)``.
- DEPTHWISE_CONV_2D: per-channel weights only (LiteRT refuses a per-tensor one), each sample
  asymmetric, scaled as ``bias + (acc * scale) * s`` on the output channels LiteRT's kernel
  takes four at a time (the first ``C - C % 4``) and ``bias + (acc * s) * scale`` on the
  rest (measured per channel against LiteRT, channel counts 2 to 17, multipliers 1 to 3).
- Both convolutions need a bias (LiteRT's hybrid kernels do): refused without one.
- BATCH_MATMUL (float left operand [..., M, K], constant int8 right one, per tensor or one
  scale per output column; adjoints and broadcast batch dimensions, ranks 2 to 4): each
  row of the (adjoint-applied) left operand quantized as FULLY_CONNECTED's, then
  ``total = trunc(acc - float(column_sum) * z)`` in float32 and ``(s * scale) * total``
  (per tensor: ``s * scale`` first; per column: ``s * scale[n]``), no bias. Refused with
  two batch dimensions above 1: LiteRT's kernel steps its row scales by ``M`` per batch
  dimension there (measured: half of ``[2, 2, 3, 8] @ [8, 5]``'s outputs differ).

Rounding is to nearest, ties away from zero; a row (or sample) of zeros quantizes to zeros
with scale 1. The fused activation clamps the float output. Gradients are the float
operator's at the same float values (straight through the on-the-fly quantization), so
training moves the float32 masters as the float model would.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir
from ..graph.quantization import round_half_away
from . import conv as float_ops
from .common import fused_activation
from .elementwise import exact_divide
from .registry import OpContext, register

Array = Any

#: Operators that have a hybrid kernel, and the input position of their weight.
WEIGHT_INPUT = {"FULLY_CONNECTED": 1, "CONV_2D": 1, "DEPTHWISE_CONV_2D": 1,
                "BATCH_MATMUL": 1}
#: The axis of the weights that indexes output channels (BATCH_MATMUL: :func:`_channel_axis`).
_CHANNEL_AXIS = {"FULLY_CONNECTED": 0, "CONV_2D": 0, "DEPTHWISE_CONV_2D": 3}


def _channel_axis(key: str, w: ir.Tensor, options: Any) -> int:
    """The output-channel axis of a hybrid operator's weight: a BATCH_MATMUL's columns (its
    last axis, the second last with ``adjoint_rhs``)."""
    if key != "BATCH_MATMUL":
        return _CHANNEL_AXIS[key]
    rank = len(w.shape or ())
    return rank - (2 if options is not None and options.adjoint_rhs else 1)


def hybrid_weight(key: str, inputs: tuple[ir.Tensor | None, ...], options: Any = None
                  ) -> ir.Tensor | None:
    """The weight of a hybrid operator (see the module docstring), or None: a float32
    constant at the operator's weight position that keeps per-tensor or per-output-channel
    quantization parameters, read by an operator whose input is float."""
    pos = WEIGHT_INPUT.get(key)
    if pos is None or len(inputs) <= pos or inputs[0] is None or not inputs[0].is_float:
        return None
    w = inputs[pos]
    if w is None or w.dtype != "float32" or not w.is_constant or w.quantization is None:
        return None
    q = w.quantization
    if q.blockwise is not None:
        return w if key == "FULLY_CONNECTED" and len(w.shape or ()) == 2 else None
    if not q.scale or (
            len(q.scale) > 1 and q.quantized_dimension != _channel_axis(key, w, options)):
        return None
    return w


def _grid(ctx: OpContext, axis: int, ndim: int) -> Array:
    """The weight's scales, broadcast along the output-channel ``axis`` of an ``ndim``-d
    weight."""
    q = ctx.inputs[WEIGHT_INPUT[ctx.op.key]].quantization
    scale = np.asarray(q.scale, np.float32)
    shape = [1] * ndim
    if scale.size > 1:
        shape[axis] = scale.size
    return scale.reshape(shape)


def weight_integers(w: Array, scale: Array) -> Array:
    """A float weight's integers on its grid: ``clip(round(w / scale), -128, 127)`` (int32;
    a weight read from int4 or int2 stays in its narrower range until training moves it)."""
    return jnp.clip(round_half_away(w / scale, jnp), -128, 127).astype(jnp.int32)


def rounded(t: Array) -> Array:
    """The float32 product ``t`` rounded before the sum it feeds, as LiteRT computes
    ``c + a * b``: XLA's CPU code contracts a product and the sum of it into one fused
    multiply-add (one rounding, not two), except where the sum's operand is not the
    product itself. ``t`` comes back bit for bit (its bits xor ``isnan(t)``: 0 for every
    number; a NaN stays a NaN), through an operation the compiler cannot see through."""
    bits = lax.bitcast_convert_type(t, jnp.int32) ^ jnp.isnan(t).astype(jnp.int32)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _split(a: Array) -> tuple[Array, Array]:
    """``a = hi + lo`` exactly, ``hi`` of 12 significant bits (Veltkamp's split)."""
    c = rounded(jnp.float32(4097) * a)
    hi = rounded(c - rounded(c - a))
    return hi, a - hi


def _two_product(a: Array, b: Array) -> tuple[Array, Array]:
    """``a * b = p + e`` exactly (Dekker's product; no fused multiply-add)."""
    p = rounded(a * b)
    (ah, al), (bh, bl) = _split(a), _split(b)
    e = rounded(rounded(rounded(ah * bh) - p) + rounded(ah * bl) + rounded(al * bh)) \
        + rounded(al * bl)
    return p, e


def _two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """``a + b = s + e`` exactly (Knuth's sum; each step opaque to XLA's simplifier, which
    would read ``(a + b) - a`` as ``b``)."""
    s = rounded(a + b)
    v = rounded(s - a)
    return s, rounded(a - rounded(s - v)) + rounded(b - v)


def _ratio(v: Array, r: Array) -> tuple[Array, Array]:
    """``255 * v / r`` as a float32 pair (hi, lo), to about 44 bits."""
    p, e = _two_product(jnp.full_like(v, 255), v)
    q1 = exact_divide(p, r)
    t, te = _two_product(q1, r)
    return q1, exact_divide(rounded(rounded(p - t) - te) + e, r)


def _round_pair(hi: Array, lo: Array) -> Array:
    """``hi + lo`` rounded to an integer, ties away from zero (float32)."""
    n = round_half_away(hi, jnp)
    t = rounded(hi - n) + lo
    up = (t > 0.5) | ((t == 0.5) & (n >= 0))
    down = (t < -0.5) | ((t == -0.5) & (n <= 0))
    return n + up.astype(n.dtype) - down.astype(n.dtype)


def asymmetric_zero_point(lo: Array, hi: Array, width: Array) -> Array:
    """LiteRT's asymmetric input zero point of a row with ``lo = min(x, 0)``, ``hi = max(x,
    0)`` and ``width = hi - lo`` (float32): in float64 there, ``-128 - lo / s`` or
    ``127 - hi / s`` (``s = width / 255``), whichever has the smaller error ``128 + |lo / s|``
    against ``127 + |hi / s|``, rounded and clamped to [-128, 127]. Computed here in float32
    pairs (``lo / s = 255 lo / width`` to about 44 bits), which decide every rounding as
    float64 does but where the value lies within about 1e-12 of a half-integer."""
    a1, a2 = _ratio(lo, width)
    b1, b2 = _ratio(hi, width)
    s, e = _two_sum(a1, b1)  # from the minimum when 128 - a < 127 + b: a + b > 1
    from_min = (rounded(s - 1) + rounded(rounded(e + a2) + b2)) > 0
    m1, me = _two_sum(jnp.full_like(a1, -128), -a1)
    x1, xe = _two_sum(jnp.full_like(b1, 127), -b1)
    zero = _round_pair(jnp.where(from_min, m1, x1),
                       rounded(jnp.where(from_min, me - a2, xe - b2)))
    return jnp.clip(zero, -128, 127)


def quantize_rows(x: Array, asymmetric: bool) -> tuple[Array, Array, Array]:
    """(int32 values, float32 scale, int32 zero point) of each row of 2-d ``x``, quantized
    to int8 as LiteRT's hybrid kernels quantize their input (module docstring)."""
    f32 = jnp.float32
    if not asymmetric:
        peak = jnp.max(jnp.abs(x), axis=1)
        safe = jnp.where(peak > 0, peak, f32(1))
        q = jnp.clip(round_half_away(x * exact_divide(f32(127), safe)[:, None], jnp), -127, 127)
        q = jnp.where((peak > 0)[:, None], q, 0)
        return q.astype(jnp.int32), jnp.where(peak > 0, exact_divide(peak, f32(127)), f32(1)), \
            jnp.zeros(x.shape[0], jnp.int32)
    lo = jnp.minimum(jnp.min(x, axis=1), 0)
    hi = jnp.maximum(jnp.max(x, axis=1), 0)
    empty = lo == hi
    width = jnp.where(empty, f32(1), hi - lo)
    scale = jnp.where(empty, f32(1), exact_divide(width, f32(255)))
    zero = asymmetric_zero_point(lo, hi, width)
    inverse = exact_divide(f32(1), scale)[:, None]
    q = jnp.clip(zero[:, None] + round_half_away(rounded(x * inverse), jnp), -128, 127)
    zero = jnp.where(empty, 0, zero).astype(jnp.int32)
    return jnp.where(empty[:, None], 0, q).astype(jnp.int32), scale, zero


def _straight_through(hybrid_fn: Any, float_fn: Any, x: Array, w: Array, b: Array) -> Array:
    """``hybrid_fn(x, w, b)``, differentiated as ``float_fn`` (the float operator)."""
    @jax.custom_vjp
    def f(x: Array, w: Array, b: Array) -> Array:
        return hybrid_fn(x, w, b)

    def forward(x: Array, w: Array, b: Array) -> tuple[Array, tuple]:
        return hybrid_fn(x, w, b), (x, w, b)

    def backward(res: tuple, g: Array) -> tuple:
        return jax.vjp(float_fn, *res)[1](g)

    f.defvjp(forward, backward)
    return f(x, w, b)


def _zero_bias(ctx: OpContext, b: Array, channels: int) -> Array:
    return jnp.zeros((channels,), jnp.float32) if b is None else b


def _block_scales(ctx: OpContext) -> np.ndarray | None:
    """A blockwise FULLY_CONNECTED weight's block scales (float32 ``[N, K / block]``, from
    its float16 scales tensor), or None for an affine one."""
    q = ctx.inputs[1].quantization
    if q.blockwise is None:
        return None
    assert ctx.subgraph is not None, "a blockwise weight's scales are in its subgraph"
    return np.asarray(ctx.subgraph.tensors[q.blockwise.scales].data, np.float32)


def _sequential_sum(terms: Array) -> Array:
    """``terms[0] + terms[1] + ...`` in float32, one addition after the other (the order of
    a C loop over the leading axis), each addend rounded first (:func:`rounded`)."""
    def step(total: Array, term: Array) -> tuple[Array, None]:
        return total + rounded(term), None

    return lax.scan(step, jnp.zeros_like(terms[0]), terms)[0]


def blockwise_rows(rows: Array, wq: Array, scales: np.ndarray) -> Array:
    """Blockwise hybrid FULLY_CONNECTED of 2-d float ``rows`` ``[M, K]`` and integer weights
    ``wq`` ``[N, K]`` with float32 block scales ``[N, K / block]``, without bias (module
    docstring)."""
    f32 = jnp.float32
    blocks = scales.shape[1]
    size = rows.shape[1] // blocks
    q, s, z = quantize_rows(rows, asymmetric=True)
    q3 = q.reshape(q.shape[0], blocks, size)
    w3 = wq.reshape(wq.shape[0], blocks, size)
    acc = lax.dot_general(q3, w3, (((2,), (2,)), ((1,), (1,))),
                          preferred_element_type=jnp.int32)  # [blocks, M, N]
    y = _sequential_sum(acc.astype(f32) * scales.T[:, None, :])
    kfsum = _sequential_sum(jnp.sum(w3, axis=2).T.astype(f32) * scales.T)  # [N]
    y = y - rounded(z.astype(f32)[:, None] * kfsum[None, :])
    return rounded(y * s[:, None])


@register("FULLY_CONNECTED", hybrid=True, check=float_ops.check_fully_connected)
def fully_connected(ctx: OpContext, x: Array, w: Array, b: Array = None) -> Array:
    """Hybrid FULLY_CONNECTED (module docstring), affine or blockwise weights."""
    blocks = _block_scales(ctx)
    if blocks is not None:
        return _blockwise_fully_connected(ctx, x, w, b, blocks)
    scale = _grid(ctx, 0, 2)
    asymmetric = bool(ctx.options.asymmetric_quantize_inputs)

    def hybrid(x: Array, w: Array, b: Array) -> Array:
        rows = float_ops.dense_rows(ctx, x, w)
        flat = rows.reshape(-1, rows.shape[-1])
        q, s, z = quantize_rows(flat, asymmetric)
        wq = weight_integers(w, scale)
        acc = lax.dot_general(q, wq, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.int32)
        acc = acc - z[:, None] * jnp.sum(wq, axis=1)[None, :]
        y = b + rounded(acc.astype(jnp.float32) * (s[:, None] * scale.reshape(1, -1)))
        return y.reshape((*rows.shape[:-1], y.shape[-1]))

    def reference(x: Array, w: Array, b: Array) -> Array:
        return float_ops.dense_rows(ctx, x, w) @ w.T + b

    y = _straight_through(hybrid, reference, x, w, _zero_bias(ctx, b, w.shape[0]))
    return fused_activation(y, ctx.options.fused_activation_function)


def _blockwise_fully_connected(ctx: OpContext, x: Array, w: Array, b: Array,
                               scales: np.ndarray) -> Array:
    """Hybrid FULLY_CONNECTED with blockwise weights (module docstring)."""
    per_value = np.repeat(scales, w.shape[1] // scales.shape[1], axis=1)

    def hybrid(x: Array, w: Array, b: Array) -> Array:
        rows = float_ops.dense_rows(ctx, x, w)
        flat = rows.reshape(-1, rows.shape[-1])
        y = b + blockwise_rows(flat, weight_integers(w, per_value), scales)
        return y.reshape((*rows.shape[:-1], y.shape[-1]))

    def reference(x: Array, w: Array, b: Array) -> Array:
        return float_ops.dense_rows(ctx, x, w) @ w.T + b

    y = _straight_through(hybrid, reference, x, w, _zero_bias(ctx, b, w.shape[0]))
    return fused_activation(y, ctx.options.fused_activation_function)


def check_spatial(ctx: OpContext) -> None:
    """The float convolution's checks; a hybrid convolution needs a bias, and a hybrid
    DEPTHWISE_CONV_2D one weight scale per output channel, as LiteRT's do (LiteRT refuses a
    CONV_2D without a bias, and its DEPTHWISE_CONV_2D without one reads memory it never
    wrote)."""
    float_ops.check_spatial(ctx)
    w = ctx.inputs[1]
    if len(ctx.inputs) < 3 or ctx.inputs[2] is None:
        raise NotImplementedError(
            f"hybrid {ctx.op.key} without a bias: LiteRT's hybrid kernel needs one (it "
            "refuses or misreads this file); add a zero bias (add_missing_bias) or load "
            "with dequantize=True")
    if ctx.op.key == "DEPTHWISE_CONV_2D" and len(w.quantization.scale) != w.shape[-1]:
        raise NotImplementedError(
            f"hybrid DEPTHWISE_CONV_2D weights {w.name[:60]!r} have {len(w.quantization.scale)}"
            f" scale(s) for {w.shape[-1]} channels; LiteRT's hybrid kernel needs one per "
            "channel (it refuses this file too)")


@register("CONV_2D", "DEPTHWISE_CONV_2D", hybrid=True, check=check_spatial)
def spatial_conv(ctx: OpContext, x: Array, w: Array, b: Array = None) -> Array:
    """Hybrid CONV_2D / DEPTHWISE_CONV_2D (module docstring)."""
    depthwise = ctx.op.key == "DEPTHWISE_CONV_2D"
    scale = _grid(ctx, _CHANNEL_AXIS[ctx.op.key], 4)
    channel_scale = scale.reshape(-1)
    per_channel = channel_scale.size > 1

    def hybrid(x: Array, w: Array, b: Array) -> Array:
        q, s, z = quantize_rows(x.reshape(x.shape[0], -1), asymmetric=per_channel)
        q = (q - z[:, None]).reshape(x.shape)
        filt, g = float_ops.spatial_geometry(ctx, q, weight_integers(w, scale))
        acc = lax.conv_general_dilated(
            q, filt, g.strides, g.pads, rhs_dilation=g.dilations,
            dimension_numbers=float_ops.dimension_numbers(2),
            feature_group_count=x.shape[-1] // filt.shape[-2],
            preferred_element_type=jnp.int32).astype(jnp.float32)
        s = s.reshape(-1, 1, 1, 1)
        if not depthwise:
            return b + rounded(acc * (s * channel_scale))
        n = channel_scale.size
        four_at_a_time = np.arange(n) < n - n % 4
        return b + rounded(jnp.where(four_at_a_time, (acc * channel_scale) * s,
                                     (acc * s) * channel_scale))

    def reference(x: Array, w: Array, b: Array) -> Array:
        filt, g = float_ops.spatial_geometry(ctx, x, w)
        return float_ops.conv(x, filt, g) + b

    channels = w.shape[3] if depthwise else w.shape[0]
    y = _straight_through(hybrid, reference, x, w, _zero_bias(ctx, b, channels))
    return fused_activation(y, ctx.options.fused_activation_function)


def check_batch_matmul(ctx: OpContext) -> None:
    """A hybrid BATCH_MATMUL's left operand is of rank 2 to 4 with at most one batch
    dimension above 1 (LiteRT's hybrid kernel reads the wrong row scales where two exceed
    1)."""
    x, w = ctx.inputs[0], ctx.inputs[1]
    if x is None or w is None or not 2 <= len(x.shape or ()) <= 4 or len(w.shape or ()) < 2:
        raise NotImplementedError("hybrid BATCH_MATMUL needs operands of rank 2 to 4")
    if len(x.shape) == 4 and x.shape[0] > 1 and x.shape[1] > 1:
        raise NotImplementedError(
            "hybrid BATCH_MATMUL with two batch dimensions above 1: LiteRT's hybrid kernel "
            "reads the wrong row scales there; load with dequantize=True")


@register("BATCH_MATMUL", hybrid=True, check=check_batch_matmul)
def batch_matmul(ctx: OpContext, x: Array, w: Array) -> Array:
    """Hybrid BATCH_MATMUL (module docstring)."""
    adj_x, adj_y = bool(ctx.options.adjoint_lhs), bool(ctx.options.adjoint_rhs)
    axis = _channel_axis("BATCH_MATMUL", ctx.inputs[1], ctx.options)
    scale = _grid(ctx, axis, w.ndim)
    asymmetric = bool(ctx.options.asymmetric_quantize_inputs)
    f32 = jnp.float32

    def hybrid(x: Array, w: Array, _: Array) -> Array:
        xt = jnp.swapaxes(x, -1, -2) if adj_x else x  # [..., M, K]
        q, s, z = quantize_rows(xt.reshape(-1, xt.shape[-1]), asymmetric)
        q = q.reshape(xt.shape)
        s, z = s.reshape(xt.shape[:-1]), z.reshape(xt.shape[:-1])
        wq = weight_integers(w, scale)
        wt = jnp.swapaxes(wq, -1, -2) if adj_y else wq  # [..., K, N]
        acc = jnp.matmul(q, wt, preferred_element_type=jnp.int32)
        row_sums = jnp.sum(wt, axis=-2)[..., None, :]  # [..., 1, N]
        # LiteRT: total -= row_sum * offset, in float32, truncated back to int32
        total = acc.astype(f32) - rounded(row_sums.astype(f32) * z.astype(f32)[..., None])
        total = jnp.trunc(total)
        per_column = scale.size > 1
        factor = s[..., None] * scale.reshape(-1) if per_column else \
            (s * scale.reshape(()))[..., None]
        return rounded(factor * total)

    def reference(x: Array, w: Array, _: Array) -> Array:
        return float_ops._batch_matmul(x, w, adj_x, adj_y)

    return _straight_through(hybrid, reference, x, w, jnp.zeros((), jnp.float32))


__all__ = ["WEIGHT_INPUT", "hybrid_weight", "quantize_rows", "weight_integers"]
