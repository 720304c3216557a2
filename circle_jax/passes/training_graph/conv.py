"""Backward rules of CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV (NHWC input, filters
``[O, KH, KW, C]``, ``[1, KH, KW, C*M]``), from the cotangent ``gz`` before the fused
activation (TRANSPOSE_CONV: see `transpose_conv`). No rule emits TRANSPOSE_CONV (onert's CPU
backend has none for such a step): a transposed convolution is written as a CONV_2D
(`transposed`).

- Bias: ``gz`` summed over batch and space.
- Input: the convolution transposed (`transposed`) from ``gz`` to the input's shape:
  CONV_2D's filter transposed to ``[C, KH, KW, O]``; DEPTHWISE_CONV_2D's with one output
  channel per input channel (``M = 1``) a DEPTHWISE_CONV_2D of its own filter, with
  ``M > 1`` made the block-diagonal ``[C, KH, KW, C*M]`` (channel ``j`` of the output
  reads input channel ``j // M``).
- Filter: the correlation of the input with ``gz`` over batch and space, one CONV_2D with
  the batch as the channels: the input transposed to ``[C, H, W, N]`` and padded as the
  convolution pads it, filtered by ``gz`` transposed to ``[O, OH, OW, N]`` with stride = the
  convolution's dilation and dilation = its stride (VALID), gives ``[C, KH, KW, O]``,
  transposed back. DEPTHWISE_CONV_2D keeps the diagonal ``c = j // M`` of that product.
"""

from __future__ import annotations

import numpy as np

from ...graph import ir
from .emit import Emitter, Shape
from .rule import Backward, Cotangents, Rule, activation_backward

_NHWC_TO_CHWN = (3, 1, 2, 0)


def _padding(size: int, k: int, stride: int, dilation: int, padding: int, out: int
             ) -> tuple[int, int]:
    """(padding before, padding after) that makes a VALID correlation of ``out`` positions
    cover exactly the taps of the convolution (the after part may be negative: a crop)."""
    extent = (k - 1) * dilation + (out - 1) * stride + 1
    before = max(extent - size, 0) // 2 if padding == ir.PAD_SAME else 0
    return before, extent - before - size


def _pad_crop(e: Emitter, t: int, pads: list[tuple[int, int]]) -> int:
    """``t`` (NHWC) padded with zeros ``pads`` = [(top, bottom), (left, right)], a negative
    after part cropping instead."""
    (top, bottom), (left, right) = pads
    t = e.pad(t, [(0, 0), (top, max(bottom, 0)), (left, max(right, 0)), (0, 0)])
    n, hp, wp, c = e.shape(t)
    return e.slice(t, [0, 0, 0, 0], [n, hp + min(bottom, 0), wp + min(right, 0), c])


def _correlate(b: Backward, a: int, g: int, kernel: tuple[int, int], step: tuple[int, int],
               dilation: tuple[int, int]) -> int:
    """``[A, KH, KW, G]``: ``sum over n, i, j of a[n, f*step + i*dilation, :] g[n, i, j, :]``
    for each tap f of the kernel (``a`` NHWC, padded; ``g`` [N, OH, OW, G]): one CONV_2D
    with the batch as the channels, ``a`` transposed to ``[A, H, W, N]`` filtered by ``g``
    transposed to ``[G, OH, OW, N]``, stride ``step`` and dilation ``dilation``, VALID."""
    e = b.e
    x = e.transpose(a, _NHWC_TO_CHWN)
    c, n_out = e.shape(x)[0], e.shape(g)[3]
    zero_bias = e.const(np.zeros(n_out, np.float32))  # LiteRT's CONV_2D needs one
    return e.op("CONV_2D", [x, e.transpose(g, _NHWC_TO_CHWN), zero_bias],
                (c, *kernel, n_out),
                {"padding": ir.PAD_VALID, "stride_h": step[0], "stride_w": step[1],
                 "dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1]})


def _filter_correlation(b: Backward, gz: int, n_out: int) -> int:
    """``[C, KH, KW, n_out]``: for each input channel c and output channel o, the
    correlation of input channel c with ``gz``'s channel o over batch and space."""
    e, o = b.e, b.op.options
    _, h, w, _ = b.shape(0)
    _, oh, ow, _ = e.shape(gz)
    kh, kw = b.shape(1)[1:3]
    sh, sw = o.stride_h or 1, o.stride_w or 1
    dh, dw = o.dilation_h_factor or 1, o.dilation_w_factor or 1
    x = _pad_crop(e, b.x(0), [_padding(h, kh, sh, dh, o.padding, oh),
                              _padding(w, kw, sw, dw, o.padding, ow)])
    return _correlate(b, x, gz, (kh, kw), (dh, dw), (sh, sw))


def zero_interleaved(e: Emitter, t: int, factors: tuple[int, int]) -> int:
    """``t`` (NHWC) with ``factor - 1`` zeros between its positions along H and W,
    ``[N, (H-1)*fh+1, (W-1)*fw+1, C]``: per spatial axis, RESHAPE to ``[before, axis, 1,
    after]`` (the dimensions before and after it merged: PAD and RESHAPE stay rank 4, as
    onert's PAD requires), PAD the unit axis to the factor, RESHAPE back with the axis that
    many times longer, SLICE the trailing zeros off (no operator for a factor of 1)."""
    for axis, f in ((1, factors[0]), (2, factors[1])):
        if f == 1:
            continue
        shape = list(e.shape(t))
        k = shape[axis]
        split = e.reshape(t, [int(np.prod(shape[:axis])), k, 1, int(np.prod(shape[axis + 1:]))])
        pads = [(0, 0), (0, 0), (0, f - 1), (0, 0)]
        shape[axis] = k * f
        spread = e.reshape(e.pad(split, pads), shape)
        shape[axis] = (k - 1) * f + 1
        t = e.slice(spread, [0, 0, 0, 0], shape)
    return t


def flipped(e: Emitter, w: int) -> int:
    """The filter ``w`` ``[A, KH, KW, B]`` with its taps reversed along KH and KW: a GATHER
    of the reversed positions per axis of more than one tap."""
    for axis in (1, 2):
        k = e.shape(w)[axis]
        if k > 1:
            w = e.op("GATHER", [w, e.const(np.arange(k - 1, -1, -1), "int32")], e.shape(w),
                     {"axis": axis, "batch_dims": 0})
    return w


def transposed(e: Emitter, g: int, w: int, out: Shape, strides: tuple[int, int],
               dilation: tuple[int, int], padding: int, depthwise: bool = False,
               flip: bool = True) -> int:
    """The transpose of a convolution of ``out`` ``[N, H, W, B]`` (filter ``[A, KH, KW, B]``
    read as TRANSPOSE_CONV's: ``A`` channels out of the convolution, ``B`` into it; with
    ``depthwise``, ``[1, KH, KW, B]``) applied to ``g`` ``[N, OH, OW, A]``: each position of
    ``g`` put back over the taps that made it, ``out[j] = sum over i, f with i*s - p + f*d
    = j of g[i] w[f]``. Written as one VALID, stride-1 convolution with dilation ``d`` of
    ``g`` with ``s - 1`` zeros between its positions (`zero_interleaved`), padded by ``(K-1)*d
    - p`` before and ``H - 1 + p - (OH-1)*s`` after (cropped where negative), with the
    filter `flipped` (CONV_2D's ``[B, KH, KW, A]``: the transposed filter's layout as it is;
    or DEPTHWISE_CONV_2D's). ``p``: the convolution's padding before, SAME's from ``out``'s
    size as the convolution computed it. ``flip=False``: ``w`` comes flipped already (a
    constant filter, flipped when written)."""
    _, oh, ow, _ = e.shape(g)
    kh, kw = e.shape(w)[1:3]
    pads = []
    for size, k, s, d, n in ((out[1], kh, strides[0], dilation[0], oh),
                             (out[2], kw, strides[1], dilation[1], ow)):
        before = _padding(size, k, s, d, padding, n)[0]
        pads.append(((k - 1) * d - before, size - 1 + before - (n - 1) * s))
    x = _pad_crop(e, zero_interleaved(e, g, strides), pads)
    options = {"padding": ir.PAD_VALID, "stride_h": 1, "stride_w": 1,
               "dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1]}
    zero_bias = e.const(np.zeros(out[3], np.float32))  # LiteRT's convolutions need one
    w = flipped(e, w) if flip else w
    if depthwise:
        return e.op("DEPTHWISE_CONV_2D", [x, w, zero_bias], tuple(out),
                    {**options, "depth_multiplier": 1})
    return e.op("CONV_2D", [x, w, zero_bias], tuple(out), options)


def _input_grad(b: Backward, gz: int, weights: int, depthwise: bool = False) -> int:
    """The convolution transposed (`transposed`) from ``gz`` to the input's shape, with
    ``weights`` ``[C, KH, KW, O]`` (``depthwise``: the filter ``[1, KH, KW, C]``)."""
    o = b.op.options
    return transposed(b.e, gz, weights, b.shape(0), (o.stride_h or 1, o.stride_w or 1),
                      (o.dilation_h_factor or 1, o.dilation_w_factor or 1), o.padding,
                      depthwise)


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
    one_per_channel = b.shape(1)[3] == b.shape(0)[3]  # M = 1: a depthwise transpose
    # the block-diagonal mask, for the filter's gradient and an input's with M > 1 only
    if 1 in b.wanted or (0 in b.wanted and not one_per_channel):
        mask = _block_mask(b)
    if 0 in b.wanted:
        out[0] = _input_grad(b, gz, b.x(1), depthwise=True) if one_per_channel \
            else _input_grad(b, gz, e.mul(b.x(1), mask))
    if 1 in b.wanted:
        full = _filter_correlation(b, gz, b.shape(1)[3])
        out[1] = e.reduce("SUM", e.mul(full, mask), [0], keep_dims=True)
    if 2 in b.wanted and b.has(2):
        out[2] = e.reduce("SUM", gz, [0, 1, 2], keep_dims=False)
    return out


def _transpose_pads(b: Backward) -> list[tuple[int, int]]:
    """(before, after) per spatial dimension that pads TRANSPOSE_CONV's output to exactly
    the positions ``i * stride - pad + f`` its input positions i and taps f reach (the
    ``pad`` before: CONV_2D's SAME padding of a convolution from the output's size, as
    LiteRT computes it; the after part negative: a crop)."""
    o = b.op.options
    _, oh, ow, _ = b.e.shape(b.y)
    _, h, w, _ = b.shape(2)
    kh, kw = b.shape(1)[1:3]
    pads = []
    for size, n, k, s in ((oh, h, kh, o.stride_h or 1), (ow, w, kw, o.stride_w or 1)):
        conv_out = -(-size // s)
        pad = max((conv_out - 1) * s + k - size, 0) // 2 if o.padding == ir.PAD_SAME else 0
        pads.append((pad, (n - 1) * s + k - pad - size))
    return pads


def transpose_conv(b: Backward) -> Cotangents:
    """TRANSPOSE_CONV (inputs: output shape, filter ``[O, KH, KW, C]``, x, bias?):
    ``y[i*s - pad + f, o] += x[i, c] w[o, f, c]``. With ``gp`` the cotangent before the
    activation padded to the positions reached (`_transpose_pads`): x's cotangent is the
    CONV_2D of ``gp`` with the filter transposed to ``[C, KH, KW, O]`` at the strides
    (VALID); the filter's is the correlation of ``gp`` with x at stride 1 and dilation = the
    strides, ``[O, KH, KW, C]``; the bias's the sum of the cotangent."""
    e, o = b.e, b.op.options
    gz = activation_backward(b)
    strides = (o.stride_h or 1, o.stride_w or 1)
    gp = _pad_crop(e, gz, _transpose_pads(b))
    out: Cotangents = {}
    if 2 in b.wanted:
        w = e.transpose(b.x(1), _NHWC_TO_CHWN)
        zero_bias = e.const(np.zeros(b.shape(2)[3], np.float32))
        out[2] = e.op("CONV_2D", [gp, w, zero_bias], b.shape(2),
                      {"padding": ir.PAD_VALID, "stride_h": strides[0],
                       "stride_w": strides[1]})
    if 1 in b.wanted:
        out[1] = _correlate(b, gp, b.x(2), b.shape(1)[1:3], (1, 1), strides)
    if 3 in b.wanted and b.has(3):
        out[3] = e.reduce("SUM", gz, [0, 1, 2], keep_dims=False)
    return out


RULES = {"TRANSPOSE_CONV": Rule(transpose_conv),
         "CONV_2D": Rule(conv_2d),
         "DEPTHWISE_CONV_2D": Rule(depthwise_conv_2d)}
