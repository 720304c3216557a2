"""Conformance rows of integer kernels: one quantized operator built by the Builder, run by
LiteRT (default kernels, no delegate: :func:`tests.conformance.run_litert`) and by
circle-jax (.tflite and .circle jitted; eagerly too where ``eager=True``: eager runs compile
every primitive apart, seconds per row, so the rows that exercise float32 steps, where XLA
could round differently inside a fusion, take it); the outputs must be equal
(``np.array_equal``: bit-exact) and of the same type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from tests.conformance import refused_at_load, run_circle_jax, run_litert

RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


@dataclass
class Q:
    """An operator input: a value with its quantization (None: a plain tensor), a graph input
    unless ``const``."""

    value: Any
    q: Any = None
    const: bool = False


def full_range(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    """Random values over the whole range of an integer type."""
    lo, hi = RANGES[dtype]
    return rng.integers(lo, hi + 1, size=tuple(shape)).astype(dtype)


def every_value(dtype: str, lo: int | None = None) -> np.ndarray:
    """Every value of an integer type (from ``lo``), in order: exhaustive inputs for
    kernels of one input value."""
    first, last = RANGES[dtype]
    return np.arange(first if lo is None else lo, last + 1).astype(dtype)


def quantized_model(op_type: str, inputs: Sequence[Q | None], options: Mapping[str, Any] | None,
                    out_q: Any, out_dtype: str | None = None, **kw: Any
                    ) -> tuple[Builder, list[np.ndarray]]:
    b = Builder()
    idx, feeds = [], []
    for j, v in enumerate(inputs):
        if v is None:
            idx.append(-1)
            continue
        arr = np.asarray(v.value)
        if v.const:
            idx.append(b.constant(f"c{j}", arr, quantization=v.q))
        else:
            idx.append(b.input(f"x{j}", arr.shape, arr.dtype.name, quantization=v.q))
            feeds.append(arr)
    first = next(np.asarray(v.value).dtype.name for v in inputs if v is not None)
    out = b.op(op_type, idx, options, quantization=[out_q],
               dtypes=[out_dtype or first], **kw)
    b.output(out)
    return b, feeds


def check_quantized(op_type: str, inputs: Sequence[Q | None],
                    options: Mapping[str, Any] | None = None, *, out_q: Any,
                    out_dtype: str | None = None, eager: bool = False, **kw: Any
                    ) -> np.ndarray:
    """LiteRT vs circle-jax, bit-exact; returns LiteRT's output."""
    b, feeds = quantized_model(op_type, inputs, options, out_q, out_dtype, **kw)
    tflite, circle = b.to_bytes("tflite"), b.to_bytes("circle")
    want = run_litert(tflite, feeds)[0]
    runs = [(tflite, "tflite/jit", True), (circle, "circle/jit", True)]
    for data, label, jit in runs + ([(tflite, "tflite/eager", False)] if eager else []):
        got = run_circle_jax(data, feeds, jit=jit)[0]
        assert got.dtype == want.dtype, f"{label}: dtype {got.dtype} != LiteRT {want.dtype}"
        assert got.shape == want.shape, f"{label}: shape {got.shape} != LiteRT {want.shape}"
        if not np.array_equal(got, want):
            diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
            raise AssertionError(f"{op_type} {label}: {int((diff > 0).sum())} of {diff.size} "
                                 f"values differ from LiteRT, by up to {int(diff.max())}")
    return want


def check_refused(op_type: str, inputs: Sequence[Q | None],
                  options: Mapping[str, Any] | None = None, *, out_q: Any,
                  out_shape: Sequence[int] | None = None,
                  error: type[Exception] = cj.UnsupportedOperatorError,
                  litert_refuses: bool = True) -> str:
    """circle-jax refuses the one-op model (output shape ``out_shape``, by default the first
    input's) at load, in one line (``error``); LiteRT, where ``litert_refuses``, fails on it
    too (False where LiteRT would abort the process). Returns circle-jax's message."""
    first = next(np.asarray(v.value) for v in inputs if v is not None)
    b, feeds = quantized_model(op_type, inputs, options, out_q,
                               shapes=[first.shape if out_shape is None else out_shape])
    tflite = b.to_bytes("tflite")
    if litert_refuses:
        with pytest.raises((RuntimeError, ValueError)):
            run_litert(tflite, feeds)
    return refused_at_load(tflite, error)
