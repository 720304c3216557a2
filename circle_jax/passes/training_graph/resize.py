"""Backward rules of RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (NHWC, a constant size).

Both resizes are linear maps of each spatial axis with constant weights: ``y = Mh x Mw^T``
per sample and channel, ``Mh`` ``[OH, H]`` and ``Mw`` ``[OW, W]`` the matrices of the axes'
source taps (TFLite's coordinates, computed in float32 as its kernels compute them:
``scale = (in - 1) / (out - 1)`` with ``align_corners`` and ``out > 1``, else ``in / out``;
bilinear ``src = (dst + 0.5) * scale - 0.5`` with ``half_pixel_centers``, else
``dst * scale``, blending ``lo = max(floor(src), 0)`` and ``hi = min(ceil(src), in - 1)``
by ``1 - (src - lo)`` and ``src - lo``; nearest ``(dst + offset) * scale``, offset 0.5 with
``half_pixel_centers``, rounded half up with ``align_corners`` else floored, clamped to
``[0, in - 1]``). The input's cotangent is ``Mh^T g Mw``: the cotangent's width axis, then
its height axis, put last and multiplied by the constant matrix (`Emitter.dense`: a
FULLY_CONNECTED), transposed back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .rule import Backward, Cotangents, Rule


def _scale(n_in: int, n_out: int, align_corners: bool) -> np.float32:
    if align_corners and n_out > 1:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    return np.float32(n_in) / np.float32(n_out)


def axis_matrix(n_in: int, n_out: int, bilinear: bool, align_corners: bool,
                half_pixel: bool) -> np.ndarray:
    """``[n_out, n_in]``: the weight of each source position in each output position."""
    scale = _scale(n_in, n_out, align_corners)
    dst = np.arange(n_out, dtype=np.float32)
    m = np.zeros((n_out, n_in), np.float32)
    if bilinear:
        src = (dst + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else dst * scale
        lo = np.maximum(np.floor(src), 0).astype(np.int64)
        hi = np.minimum(np.ceil(src), n_in - 1).astype(np.int64)
        frac = (src - lo.astype(np.float32)).astype(np.float32)
        np.add.at(m, (np.arange(n_out), lo), np.float32(1) - frac)
        np.add.at(m, (np.arange(n_out), hi), frac)
        return m
    src = (dst + np.float32(0.5 if half_pixel else 0.0)) * scale
    idx = np.floor(src + np.float32(0.5)) if align_corners else np.floor(src)
    idx = np.clip(idx.astype(np.int64), 0, n_in - 1)
    m[np.arange(n_out), idx] = 1.0
    return m


def _resize(bilinear: bool) -> Callable[[Backward], Cotangents]:
    def backward(b: Backward) -> Cotangents:
        e, o = b.e, b.op.options
        n, h, w, c = b.shape(0)
        _, oh, ow, _ = e.shape(b.y)
        flags = (bool(o.align_corners), bool(o.half_pixel_centers))
        mh = axis_matrix(h, oh, bilinear, *flags)
        mw = axis_matrix(w, ow, bilinear, *flags)
        g = e.dense(e.transpose(b.grad, (0, 1, 3, 2)), mw.T.copy())  # [N, OH, C, W]
        g = e.dense(e.transpose(g, (0, 2, 3, 1)), mh.T.copy())  # [N, C, W, H]
        return {0: e.transpose(g, (0, 3, 2, 1))}
    return backward


RULES = {"RESIZE_BILINEAR": Rule(_resize(True)),
         "RESIZE_NEAREST_NEIGHBOR": Rule(_resize(False))}
