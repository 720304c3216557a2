"""The operator registry: Circle operator name -> pure JAX reference implementation.

An implementation is ``fn(ctx: OpContext, *inputs) -> array | tuple[array, ...]``. Options and
shapes are static Python values read from ``ctx``; inputs are JAX arrays, or numpy arrays for
static (integer/shape) constants, or ``None`` for an omitted optional input. An optional
``check(ctx)`` validates the operator's static options and input specs when the model is
loaded (raising ValueError, or NotImplementedError for what circle-jax does not support).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..graph import ir

OpFn = Callable[..., Any]
CheckFn = Callable[["OpContext"], None]


@dataclass(frozen=True)
class OpDef:
    """A registered operator: its implementation and what the lowering must know of it."""

    fn: OpFn
    static_inputs: frozenset[int] = frozenset()
    fold: bool = True
    check: CheckFn | None = None


_REGISTRY: dict[str, OpDef] = {}


def register(*keys: str, static_inputs: Sequence[int] = (), fold: bool = True,
             check: CheckFn | None = None) -> Callable[[OpFn], OpFn]:
    """Register an implementation under operator names (``"CONV_2D"``, ``"CUSTOM:Name"``).

    ``static_inputs``: positions of inputs the implementation needs as values known when the
    model is lowered (e.g. RANGE's start, limit and delta, which set its output's shape). A
    float constant read only at such positions is kept as data instead of becoming a
    trainable param, so the model still compiles. ``fold=False``: never evaluate the operator
    at lowering time, even when all its inputs are constants (control flow, state).
    ``check(ctx)``: the load-time validation of its options and input specs.
    """

    def decorate(fn: OpFn) -> OpFn:
        for key in keys:
            if key in _REGISTRY:
                raise ValueError(f"operator {key} registered twice")
            _REGISTRY[key] = OpDef(fn, frozenset(static_inputs), fold, check)
        return fn

    return decorate


def definition(key: str) -> OpDef | None:
    """The registered definition of ``key``, or None when circle-jax does not support it."""
    _load_families()
    return _REGISTRY.get(key)


def static_inputs(key: str) -> frozenset[int]:
    """The input positions of ``key`` that must be static (see :func:`register`)."""
    d = definition(key)
    return d.static_inputs if d is not None else frozenset()


def lookup(key: str) -> OpFn | None:
    """The implementation of ``key``, or None when circle-jax does not support it."""
    d = definition(key)
    return d.fn if d is not None else None


def supported_operators() -> list[str]:
    """Every operator name circle-jax can lower, sorted."""
    _load_families()
    return sorted(_REGISTRY)


@dataclass(frozen=True)
class OpContext:
    """Static facts about one operator, handed to its implementation.

    ``lowering`` is the ``circle_jax.lowering.LoweringOptions`` the model is lowered with
    (read by fast implementations only; None outside a lowering).
    """

    op: ir.Operator
    inputs: tuple[ir.Tensor | None, ...]
    outputs: tuple[ir.Tensor, ...]
    run_subgraph: Callable[[int, Sequence[Any]], tuple[Any, ...]]
    lowering: Any = None

    @property
    def options(self) -> ir.Options:
        return self.op.options

    def error(self, message: str) -> ValueError:
        """A one-line error naming this operator."""
        return ValueError(f"operator {self.op.index} ({self.op.key}): {message}")


_loaded = False


def _load_families() -> None:
    """Import every operator family module once (they register themselves)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    from .. import ops

    for info in pkgutil.iter_modules(ops.__path__):
        if info.name not in ("registry", "common"):
            importlib.import_module(f"{ops.__name__}.{info.name}")
