"""Backward rules of AVERAGE_POOL_2D and MAX_POOL_2D (NHWC), from the cotangent ``gz``
before the fused activation, in operators every runtime here runs (no CUMSUM, no
TRANSPOSE_CONV).

- AVERAGE_POOL_2D: ``spread(gz / count)``, ``count`` the input positions each window
  averages (padding left out, as LiteRT's kernel averages). :func:`spread` puts values of
  the output back over each window: the channels moved into the batch
  (``[N*C, OH, OW, 1]``), the pool as a convolution with an all-ones ``[1, KH, KW, 1]``
  filter transposed (`conv.transposed`: a CONV_2D), moved back; each input position then
  holds the sum, over the windows that contain it, of their values.
- MAX_POOL_2D, any windows (overlapping ones too): each window's cotangent goes to its
  first maximum in row-major order, as TF's and circle-jax's reference gradient take it
  (`max_pool_2d`: the windows' taps as channels, put back through one-hot filters).
"""

from __future__ import annotations

import numpy as np

from ...graph import ir
from .conv import transposed
from .rule import Backward, Cotangents, Rule, activation_backward


def _window(b: Backward) -> tuple[int, int, int, int]:
    o = b.op.options
    return o.filter_height or 1, o.filter_width or 1, o.stride_h or 1, o.stride_w or 1


def spread(b: Backward, g: int) -> int:
    """Each input position: the sum of ``g`` over the pooling windows containing it."""
    e = b.e
    n, h, w, c = b.shape(0)
    _, oh, ow, _ = e.shape(g)
    kh, kw, sh, sw = _window(b)
    rows = e.reshape(e.transpose(g, (0, 3, 1, 2)), (n * c, oh, ow, 1))
    ones = e.const(np.ones((1, kh, kw, 1), np.float32))
    full = transposed(e, rows, ones, (n * c, h, w, 1), (sh, sw), (1, 1), b.op.options.padding,
                      flip=False)
    return e.transpose(e.reshape(full, (n, c, h, w)), (0, 2, 3, 1))


def _counts(b: Backward, out: tuple[int, ...]) -> np.ndarray:
    """``[1, OH, OW, 1]``: how many input positions each window covers."""
    _, h, w, _ = b.shape(0)
    kh, kw, sh, sw = _window(b)

    def along(size: int, k: int, s: int, n_out: int) -> np.ndarray:
        before = max((n_out - 1) * s + k - size, 0) // 2 \
            if b.op.options.padding == ir.PAD_SAME else 0
        start = np.arange(n_out) * s - before
        return np.minimum(start + k, size) - np.maximum(start, 0)

    counts = np.outer(along(h, kh, sh, out[1]), along(w, kw, sw, out[2]))
    return counts.astype(np.float32).reshape(1, out[1], out[2], 1)


def average_pool_2d(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    counts = e.const(_counts(b, e.shape(gz)))
    return {0: spread(b, e.div(gz, counts))}


def _taps(b: Backward) -> tuple[np.ndarray, np.ndarray]:
    """The one-hot filter ``[1, KH, KW, T]`` (tap t = row-major window position) and
    ``[1, OH, OW, T]``: 0 where tap t of a window lies inside the input, -3e38 in the
    padding."""
    _, h, w, _ = b.shape(0)
    _, oh, ow, _ = b.e.shape(b.y)
    kh, kw, sh, sw = _window(b)
    taps = np.eye(kh * kw, dtype=np.float32).reshape(1, kh, kw, kh * kw)

    def inside(size: int, k: int, s: int, n_out: int) -> np.ndarray:
        before = max((n_out - 1) * s + k - size, 0) // 2 \
            if b.op.options.padding == ir.PAD_SAME else 0
        pos = np.arange(n_out)[:, None] * s - before + np.arange(k)[None, :]
        return (pos >= 0) & (pos < size)  # [n_out, k]

    ok = inside(h, kh, sh, oh)[:, None, :, None] & inside(w, kw, sw, ow)[None, :, None, :]
    penalty = np.where(ok.reshape(oh, ow, kh * kw), 0.0, -3e38).astype(np.float32)
    return taps, penalty.reshape(1, oh, ow, kh * kw)


def max_pool_2d(b: Backward) -> Cotangents:
    """The windows' values as channels, one per tap: DEPTHWISE_CONV_2D of the input (channels
    moved into the batch, ``[N*C, H, W, 1]``) with the one-hot filter of the taps, the
    padding's taps pushed to -3e38; a window's maximum its REDUCE_MAX; its first maximum
    the tap equal to it with no equal tap before it (the count of equal taps before each,
    a FULLY_CONNECTED of the equalities with the strictly lower-triangular ones, is 0:
    sums of a few 0/1 values, exact). The cotangent times that one-hot, put back by the
    same filter's convolution transposed (`conv.transposed`), moved back to NHWC."""
    e, o = b.e, b.op.options
    n, h, w, c = b.shape(0)
    kh, kw, sh, sw = _window(b)
    gz = activation_backward(b)
    _, oh, ow, _ = e.shape(gz)
    t = kh * kw
    taps, penalty = _taps(b)
    filt = e.const(taps)
    geometry = {"padding": o.padding, "stride_h": sh, "stride_w": sw}
    rows = e.reshape(e.transpose(b.x(0), (0, 3, 1, 2)), (n * c, h, w, 1))
    windows = e.op("DEPTHWISE_CONV_2D", [rows, filt, e.const(np.zeros(t, np.float32))],
                   (n * c, oh, ow, t), {**geometry, "depth_multiplier": t})
    windows = e.add(windows, e.const(penalty))
    top = e.reduce("REDUCE_MAX", windows, [3], keep_dims=True)
    equal = e.mask("EQUAL", windows, top)
    earlier = np.tril(np.ones((t, t), np.float32), -1)  # row u: the taps before tap u
    before = e.dense(equal, earlier)
    first = e.mul(equal, e.mask("EQUAL", before, e.scalar(0.0)))
    g_rows = e.reshape(e.transpose(gz, (0, 3, 1, 2)), (n * c, oh, ow, 1))
    full = transposed(e, e.mul(first, g_rows), e.const(np.flip(taps, (1, 2)).copy()),
                      (n * c, h, w, 1), (sh, sw), (1, 1), o.padding, flip=False)
    return {0: e.transpose(e.reshape(full, (n, c, h, w)), (0, 2, 3, 1))}


RULES = {"AVERAGE_POOL_2D": Rule(average_pool_2d), "MAX_POOL_2D": Rule(max_pool_2d)}
