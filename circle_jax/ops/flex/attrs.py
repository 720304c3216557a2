"""Reading TF's convolution and pooling attributes (``strides``, ``ksize``, ``dilations``,
``padding``, ``explicit_paddings``, ``data_format``) into spatial geometry.

TF's rules: 4-vectors are in ``data_format`` order and, in NHWC, their batch and channel
entries must be 1 (padding 0); SAME pads ``max((out - 1) * stride + (k - 1) * dilation + 1 -
size, 0)`` with the odd pixel at the end, ``out = ceil(size / stride)``; VALID pads nothing;
EXPLICIT takes ``explicit_paddings`` (8 ints: before, after per dimension). Only NHWC is
implemented: NCHW is refused (TF's CPU kernels, which the converter's Flex ops run on, take
NHWC too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from circle_jax.errors import CircleFormatError, UnsupportedOperatorError

from ...graph import ir
from ..common import padding_pairs
from ..common import static as static_value


def nhwc(op: str, attrs: dict) -> None:
    """Refuse a data_format other than NHWC (the default when the attr is absent)."""
    fmt = attrs.get("data_format", "NHWC")
    if fmt != "NHWC":
        raise UnsupportedOperatorError(f"Flex {op}: data_format {fmt} is not supported "
                                       "(circle-jax implements NHWC)")


def spatial(op: str, attrs: dict, key: str, default: int | None = None) -> tuple[int, int]:
    """The (H, W) entries of a 4-vector attr such as ``strides``; batch and channel must be 1."""
    v = attrs.get(key)
    if v is None and default is not None:
        return default, default
    if not isinstance(v, list) or len(v) != 4 or not all(isinstance(i, int) for i in v):
        raise CircleFormatError(f"Flex {op}: attribute {key} is {v!r}, expected 4 ints")
    if v[0] != 1 or v[3] != 1 or v[1] < 1 or v[2] < 1:
        raise UnsupportedOperatorError(f"Flex {op}: {key} {v} (TF takes 1 in the batch and "
                                       "channel entries and positive spatial ones)")
    return v[1], v[2]


def pads(op: str, attrs: dict, sizes: tuple[int, int], kernel: tuple[int, int],
         strides: tuple[int, int], dilations: tuple[int, int] = (1, 1)) -> tuple:
    """The ((top, bottom), (left, right)) padding of ``attrs['padding']``."""
    padding = attrs.get("padding")
    if padding in ("SAME", "VALID"):
        code = ir.PAD_SAME if padding == "SAME" else ir.PAD_VALID
        return tuple(padding_pairs(code, sizes, kernel, strides, dilations))
    if padding == "EXPLICIT":
        p = attrs.get("explicit_paddings")
        if not isinstance(p, list) or len(p) != 8 or min(p, default=0) < 0:
            raise CircleFormatError(f"Flex {op}: explicit_paddings {p!r}, expected 8 "
                                    "non-negative ints")
        if p[0] or p[1] or p[6] or p[7]:
            raise UnsupportedOperatorError(f"Flex {op}: explicit_paddings {p} pad the batch "
                                           "or channel dimension")
        return (p[2], p[3]), (p[4], p[5])
    raise CircleFormatError(f"Flex {op}: padding {padding!r}, expected SAME, VALID or EXPLICIT")


def shape_input(op: str, x: Any, what: str, rank: int = 4) -> tuple[int, ...]:
    """A static shape-vector input (``filter_sizes``, ``input_sizes``) as a tuple."""
    try:
        v = static_value(x, f"Flex {op}'s {what}")
    except ValueError as e:
        raise UnsupportedOperatorError(str(e)) from None
    v = np.asarray(v)
    if v.shape != (rank,) or not np.issubdtype(v.dtype, np.integer) or (v < 0).any():
        raise CircleFormatError(f"Flex {op}: {what} is {v.tolist()}, expected {rank} "
                                "non-negative ints")
    return tuple(int(i) for i in v)
