"""TF's shape operators of gradient graphs: BroadcastGradientArgs, EnsureShape.

- ``BroadcastGradientArgs(s0, s1) -> (r0, r1)`` (static shapes): the axes each operand's
  gradient is summed over after a broadcasting op. Identical shapes: none. Else both are
  left-padded with 1s to one rank and, per axis, ``r0`` takes it where s0's size is 1 and
  s1's is not, ``r1`` where s1's is 1 and s0's is not, both where both are 1; sizes that
  differ and are both not 1 do not broadcast (an error). Measured with TF 2.21, e.g. [1, 3, 1]
  and [1, 1, 5] -> [0, 2], [0, 1]; [1] and [1] -> [], [].
- ``EnsureShape(input)`` (attr ``shape``; -1 any size, None any rank): the input, after
  checking its shape is compatible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from circle_jax.errors import DataError, UnsupportedOperatorError

from ..common import static as static_value
from .registry import flex_kernel


def _shape(x: Any, what: str) -> list[int]:
    try:
        v = np.asarray(static_value(x, f"Flex BroadcastGradientArgs's {what}"))
    except ValueError as e:
        raise UnsupportedOperatorError(str(e)) from None
    if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer):
        raise DataError(f"Flex BroadcastGradientArgs: {what} is {v.tolist()}, expected a "
                        "vector of ints")
    return [int(i) for i in v]


@flex_kernel("BroadcastGradientArgs", static_inputs=(0, 1))
def broadcast_gradient_args(attrs: dict, s0: Any, s1: Any) -> tuple[np.ndarray, np.ndarray]:
    a, b = _shape(s0, "s0"), _shape(s1, "s1")
    dtype = np.dtype(attrs.get("T", "int32"))
    r0: list[int] = []
    r1: list[int] = []
    if a != b:
        n = max(len(a), len(b))
        a_, b_ = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
        for i, (x, y) in enumerate(zip(a_, b_)):
            if x != y and x != 1 and y != 1:
                raise DataError(f"Flex BroadcastGradientArgs: shapes {a} and {b} do not "
                                "broadcast")
            if x == 1:
                r0.append(i)
            if y == 1:
                r1.append(i)
    return np.asarray(r0, dtype), np.asarray(r1, dtype)


@flex_kernel("EnsureShape")
def ensure_shape(attrs: dict, x: Any) -> Any:
    want = attrs.get("shape")
    have = tuple(np.shape(x))
    if want is not None and (len(want) != len(have) or any(
            w not in (-1, h) for w, h in zip(want, have))):
        raise DataError(f"Flex EnsureShape: the input's shape {list(have)} is not compatible "
                        f"with {list(want)}")
    return x
