"""Image resizing (NHWC): RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR.

The size input is a static int32 [new_height, new_width]. Source coordinates follow TFLite
exactly, computed in float32 like its kernels:

- ``scale = (in - 1) / (out - 1)`` when ``align_corners`` and ``out > 1``, else ``in / out``;
- bilinear: ``src = (dst + 0.5) * scale - 0.5`` with ``half_pixel_centers``, else
  ``dst * scale``; it blends ``lo = max(floor(src), 0)`` and ``hi = min(ceil(src), in - 1)``
  with weights ``1 - (src - lo)`` and ``src - lo``;
- nearest: ``src = (dst + offset) * scale`` (offset 0.5 with ``half_pixel_centers``), then
  ``round`` (half away from zero) with ``align_corners``, else ``floor``; clamped to
  ``in - 1`` (and to 0 with ``half_pixel_centers``).

Both resizes are separable and are computed one spatial axis at a time (an axis that maps
every position onto itself is left alone): per axis, bilinear is two gathers blended,
nearest one gather. Faster lowerings: ``circle_jax/lowering/resize.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..graph import ir
from .common import static
from .registry import OpContext, register


def _scale(n_in: int, n_out: int, align_corners: bool) -> np.float32:
    if align_corners and n_out > 1:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    return np.float32(n_in) / np.float32(n_out)


def bilinear_taps(
    n_in: int, n_out: int, align_corners: bool, half_pixel: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """TFLite's bilinear taps along one axis: [(lo index, weight), (hi index, weight)]."""
    scale = _scale(n_in, n_out, align_corners)
    dst = np.arange(n_out, dtype=np.float32)
    src = (dst + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else dst * scale
    lo = np.maximum(np.floor(src), 0).astype(np.int32)
    hi = np.minimum(np.ceil(src), n_in - 1).astype(np.int32)
    frac = (src - lo.astype(np.float32)).astype(np.float32)
    return [(lo, np.float32(1) - frac), (hi, frac)]


def nearest_indices(n_in: int, n_out: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """TFLite's nearest source index of every output position along one axis."""
    scale = _scale(n_in, n_out, align_corners)
    offset = np.float32(0.5 if half_pixel else 0.0)
    src = (np.arange(n_out, dtype=np.float32) + offset) * scale
    # TFLite rounds half away from zero (np.round would round half to even); src >= 0.
    idx = np.floor(src + np.float32(0.5)) if align_corners else np.floor(src)
    idx = np.minimum(idx.astype(np.int32), n_in - 1)
    return np.maximum(idx, 0) if half_pixel else idx


@dataclass(frozen=True)
class AxisResampling:
    """A static resampling of one axis (hashable, so it can parameterise a custom VJP)."""

    bilinear: bool
    n_in: int
    n_out: int
    align_corners: bool
    half_pixel: bool

    def taps(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        args = (self.n_in, self.n_out, self.align_corners, self.half_pixel)
        if self.bilinear:
            return bilinear_taps(*args)
        return [(nearest_indices(*args), None)]

    def is_identity(self) -> bool:
        return self.n_in == self.n_out and bool((self.matrix() == np.eye(self.n_in)).all())

    def matrix(self) -> np.ndarray:
        """The [n_out, n_in] matrix of the same linear map."""
        m = np.zeros((self.n_out, self.n_in), np.float32)
        for idx, w in self.taps():
            np.add.at(m, (np.arange(self.n_out), idx), 1 if w is None else w)
        return m


def take(x: jax.Array, axis: int, idx: np.ndarray) -> jax.Array:
    """x[..., idx, ...] along ``axis``."""
    return jnp.take(x, jnp.asarray(idx), axis=axis)


def resample(x: jax.Array, axis: int, spec: AxisResampling,
             gather: Callable[[jax.Array, int, np.ndarray], jax.Array] = take) -> jax.Array:
    """Resample one axis: gathers (``gather(x, axis, indices)``), weighted and summed."""
    shape = [1] * x.ndim
    shape[axis] = spec.n_out
    out = None
    for idx, w in spec.taps():
        term = gather(x, axis, idx)
        if w is not None:
            term = term * jnp.asarray(w.reshape(shape), x.dtype)
        out = term if out is None else out + term
    return out


def axis_resamplings(ctx: OpContext, x: jax.Array, size: object,
                     bilinear: bool) -> list[tuple[int, AxisResampling]]:
    """The (axis, resampling) pairs of a resize of NHWC ``x`` to ``size``, identities left
    out."""
    if np.ndim(x) != 4:
        raise ValueError(f"resize needs a 4-D NHWC input, got rank {np.ndim(x)}")
    hw = static(size, "resize size").astype(np.int64).ravel()
    if hw.shape != (2,) or (hw < 1).any():
        raise ValueError(f"resize size must be two positive ints, got {hw.tolist()}")
    flags = (bool(ctx.options.align_corners), bool(ctx.options.half_pixel_centers))
    specs = [(axis, AxisResampling(bilinear, x.shape[axis], n_out, *flags))
             for axis, n_out in zip((1, 2), hw.tolist())]
    return [(axis, spec) for axis, spec in specs if not spec.is_identity()]


def check_resize(ctx: OpContext) -> None:
    """Load-time checks: RESIZE_BILINEAR needs a float input and at most one of
    align_corners and half_pixel_centers."""
    if ctx.op.key != "RESIZE_BILINEAR":
        return
    x = ctx.inputs[0]
    if x is not None and not np.issubdtype(ir.as_numpy_dtype(x.dtype), np.floating):
        raise NotImplementedError(f"RESIZE_BILINEAR of {x.dtype} (quantized) is not supported")
    if ctx.options.align_corners and ctx.options.half_pixel_centers:
        raise ValueError("RESIZE_BILINEAR: align_corners and half_pixel_centers are exclusive")


@register("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", check=check_resize)
def resize(ctx: OpContext, x: jax.Array, size: object) -> jax.Array:
    """Bilinear (float inputs) or nearest-neighbour (any dtype) resize with TFLite's
    coordinate and rounding rules."""
    x = jnp.asarray(x)
    for axis, spec in axis_resamplings(ctx, x, size, ctx.op.key == "RESIZE_BILINEAR"):
        x = resample(x, axis, spec)
    return x
