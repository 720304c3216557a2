"""Backward rules of CONV_2D and DEPTHWISE_CONV_2D (NHWC input, filters ``[O, KH, KW, C]``
and ``[1, KH, KW, C*M]``), from the cotangent ``gz`` before the fused activation.

- Bias: ``gz`` summed over batch and space.
- Input: TRANSPOSE_CONV of ``gz`` to the input's shape, with the convolution's strides and
  padding (TRANSPOSE_CONV computes SAME padding from that shape as the convolution did):
  CONV_2D's filter transposed to ``[C, KH, KW, O]``; DEPTHWISE_CONV_2D's made the
  block-diagonal ``[C, KH, KW, C*M]`` (channel ``j`` of the output reads input channel
  ``j // M``). Only undilated convolutions (TRANSPOSE_CONV has no dilation).
- Filter: the correlation of the input with ``gz`` over batch and space, one CONV_2D with
  the batch as the channels: the input transposed to ``[C, H, W, N]`` and padded as the
  convolution pads it, filtered by ``gz`` transposed to ``[O, OH, OW, N]`` with stride = the
  convolution's dilation and dilation = its stride (VALID), gives ``[C, KH, KW, O]``,
  transposed back. DEPTHWISE_CONV_2D keeps the diagonal ``c = j // M`` of that product.
"""

from __future__ import annotations

import numpy as np

from ...graph import ir
from .rule import Backward, Cotangents, Rule, activation_backward

_NHWC_TO_CHWN = (3, 1, 2, 0)


def _padding(size: int, k: int, stride: int, dilation: int, padding: int, out: int
             ) -> tuple[int, int]:
    """(padding before, padding after) that makes a VALID correlation of ``out`` positions
    cover exactly the taps of the convolution (the after part may be negative: a crop)."""
    extent = (k - 1) * dilation + (out - 1) * stride + 1
    before = max(extent - size, 0) // 2 if padding == ir.PAD_SAME else 0
    return before, extent - before - size


def _filter_correlation(b: Backward, gz: int, n_out: int) -> int:
    """``[C, KH, KW, n_out]``: for each input channel c and output channel o, the
    correlation of input channel c with ``gz``'s channel o over batch and space."""
    e, o = b.e, b.op.options
    _, h, w, _ = b.shape(0)
    _, oh, ow, _ = e.shape(gz)
    kh, kw = b.shape(1)[1:3]
    sh, sw = o.stride_h or 1, o.stride_w or 1
    dh, dw = o.dilation_h_factor or 1, o.dilation_w_factor or 1
    top, bottom = _padding(h, kh, sh, dh, o.padding, oh)
    left, right = _padding(w, kw, sw, dw, o.padding, ow)
    x = e.transpose(b.x(0), _NHWC_TO_CHWN)
    x = e.pad(x, [(0, 0), (top, max(bottom, 0)), (left, max(right, 0)), (0, 0)])
    c, hp, wp, n = e.shape(x)
    x = e.slice(x, [0, 0, 0, 0], [c, hp + min(bottom, 0), wp + min(right, 0), n])
    g = e.transpose(gz, _NHWC_TO_CHWN)
    zero_bias = e.const(np.zeros(n_out, np.float32))  # LiteRT's CONV_2D needs one
    return e.op("CONV_2D", [x, g, zero_bias], (c, kh, kw, n_out),
                {"padding": ir.PAD_VALID, "stride_h": dh, "stride_w": dw,
                 "dilation_h_factor": sh, "dilation_w_factor": sw})


def _input_grad(b: Backward, gz: int, weights: int) -> int:
    e, o = b.e, b.op.options
    shape = b.shape(0)
    return e.op("TRANSPOSE_CONV", [e.const(shape, "int32"), weights, gz], shape,
                {"padding": o.padding, "stride_h": o.stride_h or 1, "stride_w": o.stride_w or 1})


def conv_2d(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    n_out = b.shape(1)[0]
    out: Cotangents = {}
    if 0 in b.wanted:
        out[0] = _input_grad(b, gz, e.transpose(b.x(1), _NHWC_TO_CHWN))
    if 1 in b.wanted:
        out[1] = e.transpose(_filter_correlation(b, gz, n_out), _NHWC_TO_CHWN)
    if 2 in b.wanted and b.has(2):
        out[2] = e.reduce("SUM", gz, [0, 1, 2], keep_dims=False)
    return out


def _block_mask(b: Backward) -> int:
    """``[C, 1, 1, C*M]``: 1 where output channel j reads input channel c (c = j // M)."""
    c, cm = b.shape(0)[3], b.shape(1)[3]
    mask = (np.arange(cm)[None, :] // (cm // c) == np.arange(c)[:, None]).astype(np.float32)
    return b.e.const(mask.reshape(c, 1, 1, cm))


def depthwise_conv_2d(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    out: Cotangents = {}
    if 0 in b.wanted or 1 in b.wanted:
        mask = _block_mask(b)
    if 0 in b.wanted:
        out[0] = _input_grad(b, gz, e.mul(b.x(1), mask))
    if 1 in b.wanted:
        full = _filter_correlation(b, gz, b.shape(1)[3])
        out[1] = e.reduce("SUM", e.mul(full, mask), [0], keep_dims=True)
    if 2 in b.wanted and b.has(2):
        out[2] = e.reduce("SUM", gz, [0, 1, 2], keep_dims=False)
    return out


def _dilated_input(b: Backward) -> str | None:
    o = b.op.options
    if 0 in b.wanted and max(o.dilation_h_factor or 1, o.dilation_w_factor or 1) > 1:
        return "a dilated convolution's input gradient (TRANSPOSE_CONV has no dilation)"
    return None


RULES = {"CONV_2D": Rule(conv_2d, _dilated_input),
         "DEPTHWISE_CONV_2D": Rule(depthwise_conv_2d, _dilated_input)}
