"""Backward rules of AVERAGE_POOL_2D and MAX_POOL_2D (NHWC), from the cotangent ``gz``
before the fused activation.

Both spread values of the output back over each window with :func:`spread`: the channels
moved into the batch (``[N*C, OH, OW, 1]``), one TRANSPOSE_CONV with an all-ones
``[1, KH, KW, 1]`` filter and the pool's strides and padding, moved back. Each input
position then holds the sum, over the windows that contain it, of their values.

- AVERAGE_POOL_2D: ``spread(gz / count)``, ``count`` the input positions each window
  averages (padding left out, as LiteRT's kernel averages).
- MAX_POOL_2D, windows that do not overlap (strides >= filter size): ``spread(gz)`` where
  the input equals ``spread(y)``, its window's maximum, else 0. (A tie in one window gives
  each tied position the gradient; random inputs have none.)
"""

from __future__ import annotations

import numpy as np

from ...graph import ir
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
    full = e.op("TRANSPOSE_CONV", [e.const((n * c, h, w, 1), "int32"), ones, rows],
                (n * c, h, w, 1), {"padding": b.op.options.padding, "stride_h": sh,
                                   "stride_w": sw})
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


def max_pool_2d(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    at_max = e.mask("EQUAL", b.x(0), spread(b, b.y))
    return {0: e.mul(spread(b, gz), at_max)}


def _overlapping(b: Backward) -> str | None:
    kh, kw, sh, sw = _window(b)
    return None if sh >= kh and sw >= kw else \
        f"overlapping windows {kh}x{kw} at strides {sh}x{sw} (the rule: strides >= filter)"


RULES = {"AVERAGE_POOL_2D": Rule(average_pool_2d),
         "MAX_POOL_2D": Rule(max_pool_2d, _overlapping)}
