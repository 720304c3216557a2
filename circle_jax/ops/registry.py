"""The operator registry: Circle operator name -> pure JAX reference implementation.

An implementation is ``fn(ctx: OpContext, *inputs) -> array | tuple[array, ...]``. Options and
shapes are static Python values read from ``ctx``; inputs are JAX arrays, or numpy arrays for
static (integer/shape) constants, or ``None`` for an omitted optional input. An optional
``check(ctx)`` validates the operator's static options and input specs when the model is
loaded (raising ValueError, or NotImplementedError for what circle-jax does not support).

An operator may also have an *integer kernel* (``register(..., integer=True)``, the modules of
``circle_jax/ops/integer``): LiteRT's integer arithmetic on affine-quantized int8 / uint8 /
int16 tensors. :func:`runs_integer` says which of the two an operator of a model gets.
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
    fold: bool = True
    check: CheckFn | None = None
    integer: bool = False


_REGISTRY: dict[str, OpDef] = {}
_INTEGER: dict[str, OpDef] = {}
_HYBRID: dict[str, OpDef] = {}

#: The tensor types of quantized activations that integer kernels compute on.
QUANTIZED_TYPES = ("int8", "uint8", "int16")


def register(*keys: str, fold: bool = True, check: CheckFn | None = None,
             integer: bool = False, hybrid: bool = False) -> Callable[[OpFn], OpFn]:
    """Register an implementation under operator names (``"CONV_2D"``, ``"CUSTOM:Name"``).

    Inputs an operator needs as values known when the model is lowered (RANGE's bounds) are
    listed in `circle_jax.graph.params_policy.STATIC_INPUTS`, which the params policy reads
    too. ``fold=False``: never evaluate the operator
    at lowering time, even when all its inputs are constants (control flow, state).
    ``check(ctx)``: the load-time validation of its options and input specs. ``integer``: the
    implementation is the operator's integer kernel (see :func:`runs_integer`); ``hybrid``:
    its hybrid kernel (`circle_jax.ops.hybrid`). Both are exact kernels, which no fast
    lowering replaces (``OpDef.integer``).
    """

    def decorate(fn: OpFn) -> OpFn:
        table = _INTEGER if integer else _HYBRID if hybrid else _REGISTRY
        for key in keys:
            if key in table:
                raise ValueError(f"operator {key} registered twice")
            table[key] = OpDef(fn, fold, check, integer or hybrid)
        return fn

    return decorate


def definition(key: str, integer: bool = False, hybrid: bool = False) -> OpDef | None:
    """The registered definition of ``key`` (its integer kernel when ``integer``, its hybrid
    kernel when ``hybrid``), or None when circle-jax does not support it."""
    _load_families()
    return (_INTEGER if integer else _HYBRID if hybrid else _REGISTRY).get(key)


def runs_integer(key: str, inputs: Sequence[ir.Tensor | None],
                 outputs: Sequence[ir.Tensor | None]) -> bool:
    """Whether an operator runs its integer kernel: it has one, its first output is int8,
    uint8 or int16, and one of its tensors carries quantization parameters. (Integer tensors
    without any are plain integers: the generic kernel computes on them.)"""
    _load_families()
    if key not in _INTEGER or not outputs or outputs[0] is None:
        return False
    if outputs[0].dtype not in QUANTIZED_TYPES:
        return False
    return any(t is not None and t.quantization is not None for t in (*inputs, *outputs))


def lookup(key: str) -> OpFn | None:
    """The implementation of ``key``, or None when circle-jax does not support it."""
    d = definition(key)
    return d.fn if d is not None else None


def supported_operators() -> list[str]:
    """Every operator name circle-jax can lower, sorted."""
    _load_families()
    return sorted(_REGISTRY.keys() | _INTEGER.keys())


@dataclass(frozen=True)
class OpContext:
    """Static facts about one operator, handed to its implementation.

    ``lowering`` is the ``circle_jax.lowering.LoweringOptions`` the model is lowered with
    (read by fast implementations only; None outside a lowering). ``variables``: while a
    signature runs (`circle_jax.signatures`), the resource variables' values by shared_name,
    which the variable operators (`circle_jax.ops.variables`) read and assign in place;
    None otherwise. ``subgraph``: the operator's subgraph, where a kernel reads a tensor
    its inputs only name (a blockwise weight's scales tensor); None outside a lowering.
    """

    op: ir.Operator
    inputs: tuple[ir.Tensor | None, ...]
    outputs: tuple[ir.Tensor, ...]
    run_subgraph: Callable[[int, Sequence[Any]], tuple[Any, ...]]
    lowering: Any = None
    variables: dict[str, Any] | None = None
    subgraph: ir.Subgraph | None = None

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
