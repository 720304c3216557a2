"""Fast lowerings: operator implementations that compute what ``circle_jax/ops`` defines,
faster on XLA CPU (im2col, kn2row, shifted-slice depthwise, col2im, one-pass pooling, ...).

Which implementation an operator gets is decided by a :class:`LoweringOptions` value handed
to :class:`circle_jax.lowering.interpreter.Lowered` when the model is loaded; nothing here
reads module state. A fast implementation has the signature of the reference operator it replaces
(``fn(ctx, *inputs)``) and reads the options from ``ctx.lowering``. Every one is tested
against its reference (``tests/ops/test_lowering.py``); measurements are in
``benchmarks/README.md``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

OpFn = Callable[..., Any]

KINDS = ("fast", "reference")

#: Convolution methods a :class:`LoweringOptions` can force (tests and benchmarks).
CONV_METHODS = ("xla", "im2col", "kn2row", "shift")
TRANSPOSE_CONV_METHODS = ("xla", "col2im")


@dataclass(frozen=True)
class LoweringOptions:
    """How a model's operators are lowered to JAX.

    ``kind``: "fast" (the kernels of this package where one exists) or "reference" (the
    plain ``ops/`` definitions); None chooses by backend (fast on CPU, for which the kernels
    are tuned, reference elsewhere), or fast when ``force`` is set. ``in_loop``: the operators
    are traced inside a compiled loop body (a ``lax.scan`` epoch), where XLA CPU's
    convolution is slow, so convolutions take im2col up to a larger size. ``backend``: the
    JAX backend the choice is made for (None: ``jax.default_backend()``). ``force``: one
    method of ``CONV_METHODS`` / ``TRANSPOSE_CONV_METHODS`` for every convolution (tests and
    benchmarks; a convolution it cannot compute raises ValueError). ``float32_ops``: the
    operator keys that compute in float32 when an input is a half float (a precision
    policy's rule, `circle_jax.optim.precision.FLOAT32_OPERATORS`): their half inputs are
    cast to float32, and their outputs back to that half dtype, except the main subgraph's
    outputs, which stay float32 for the loss (`circle_jax.lowering.interpreter.Lowered.run`).
    ``half_weights``: the half dtype ("float16", "bfloat16") the training forward computes
    in while its trainable weights arrive in float32 (a policy whose gradient dtype is
    wider than its compute dtype): an operator that reads a float32 weight computes with it
    rounded to half, and its backward runs in float32, so the weight's gradient (a sum over
    the batch and positions) is accumulated and returned in float32, never rounded to half;
    the gradients of its half inputs are rounded back to half.
    """

    kind: str | None = None
    in_loop: bool = False
    backend: str | None = None
    force: str | None = None
    float32_ops: frozenset[str] = frozenset()
    half_weights: str | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"lowering kind must be one of {KINDS} or None, got {self.kind!r}")
        if self.force is not None and self.force not in CONV_METHODS + TRANSPOSE_CONV_METHODS:
            raise ValueError(f"unknown lowering {self.force!r} (use one of "
                             f"{sorted(set(CONV_METHODS + TRANSPOSE_CONV_METHODS))})")
        object.__setattr__(self, "float32_ops", frozenset(self.float32_ops))

    @property
    def fast(self) -> bool:
        """True when the fast kernels are used (``kind``, or else the backend, decides)."""
        if self.kind is not None:
            return self.kind == "fast"
        if self.force is not None:
            return True
        return (self.backend or jax.default_backend()) == "cpu"


def as_options(lowering: str | LoweringOptions | None) -> LoweringOptions:
    """A :class:`LoweringOptions` from a kind name ("fast", "reference"), options, or None
    (the default: fast on CPU)."""
    if isinstance(lowering, LoweringOptions):
        return lowering
    if lowering is None or lowering in KINDS:
        return LoweringOptions(kind=lowering)
    raise ValueError(f"lowering must be one of {KINDS}, a LoweringOptions or None, "
                     f"got {lowering!r}")


_FAST: dict[str, OpFn] = {}


def fast(*keys: str) -> Callable[[OpFn], OpFn]:
    """Register a fast implementation of the operators ``keys`` (same signature as theirs)."""

    def decorate(fn: OpFn) -> OpFn:
        for key in keys:
            if key in _FAST:
                raise ValueError(f"fast lowering of {key} registered twice")
            _FAST[key] = fn
        return fn

    return decorate


def implementation(key: str, options: LoweringOptions) -> OpFn | None:
    """The fast implementation of operator ``key`` under ``options``, or None (reference)."""
    if not options.fast:
        return None
    _load_kinds()
    return _FAST.get(key)


_loaded = False


def _load_kinds() -> None:
    """Import every lowering module once (they register themselves)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


__all__ = ["CONV_METHODS", "TRANSPOSE_CONV_METHODS", "LoweringOptions", "as_options", "fast",
           "implementation"]
