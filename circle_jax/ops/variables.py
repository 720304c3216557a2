"""Resource variables: VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE.

A variable is its ``shared_name`` (`circle_jax.graph.variables`). Its value lives outside the
graph: while a signature runs, ``ctx.variables`` maps shared_names to values, and these
kernels read and assign it in place (at trace time: the function a signature becomes,
``(variables, inputs) -> (outputs, variables)``, stays pure, `circle_jax.signatures`).

- VAR_HANDLE: the RESOURCE tensor's value, a :class:`Handle` naming the variable.
- READ_VARIABLE: the variable's value; one that holds nothing is refused in one line naming
  it (:class:`~circle_jax.errors.VariableError`; LiteRT reads NaN or fails
  "variable != nullptr").
- ASSIGN_VARIABLE (no output): the variable holds the value from now on (shape and dtype
  included, as LiteRT's resizes it).
- CALL_ONCE (no output): its init subgraph runs once per interpreter, before anything reads
  the variables; in a signature's pure function it has already run (the given variables
  are the state after it), so the kernel does nothing (`circle_jax.signatures.Interpreter`
  runs init subgraphs on first use, as LiteRT does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import VariableError
from .registry import OpContext, register


@dataclass(frozen=True)
class Handle:
    """The value of a RESOURCE tensor: the variable it names."""

    shared_name: str


def _store(ctx: OpContext) -> dict[str, Any]:
    if ctx.variables is None:
        raise VariableError(f"operator {ctx.op.index} ({ctx.op.type}) uses a resource "
                            "variable, which only a signature's run holds (circle_jax."
                            "Interpreter, or circle_jax.signatures.Program)")
    return ctx.variables


def _handle(ctx: OpContext, h: Any) -> str:
    if not isinstance(h, Handle):
        raise ValueError(f"input 0 is {type(h).__name__}, not a variable's handle (expected "
                         "a VAR_HANDLE's output)")
    return h.shared_name


def _check_handle(ctx: OpContext) -> None:
    t = ctx.inputs[0] if ctx.inputs else None
    if t is None or t.dtype != "resource":
        raise ValueError("input 0 is not a RESOURCE tensor (expected a VAR_HANDLE's output)")


def _check_var_handle(ctx: OpContext) -> None:
    if not ctx.options.shared_name:
        raise ValueError("VAR_HANDLE has no shared_name (expected the variable's name)")


@register("VAR_HANDLE", fold=False, check=_check_var_handle)
def var_handle(ctx: OpContext) -> Handle:
    """The handle of the variable named by the ``shared_name`` option."""
    return Handle(str(ctx.options.shared_name))


@register("READ_VARIABLE", fold=False, check=_check_handle)
def read_variable(ctx: OpContext, handle: Any) -> Any:
    """The variable's value (refused in one line when nothing assigned it)."""
    name = _handle(ctx, handle)
    store = _store(ctx)
    if name not in store:
        raise VariableError(f"variable {name[:60]!r} is read (operator {ctx.op.index}, "
                            "READ_VARIABLE) but holds nothing: the file has no initialiser "
                            "for it and no signature assigned it (run one that does, e.g. "
                            "'restore', first)")
    return store[name]


@register("ASSIGN_VARIABLE", fold=False, check=_check_handle)
def assign_variable(ctx: OpContext, handle: Any, value: Any) -> tuple[()]:
    """The variable holds ``value`` from now on."""
    _store(ctx)[_handle(ctx, handle)] = value
    return ()


@register("CALL_ONCE", fold=False)
def call_once(ctx: OpContext) -> tuple[()]:
    """Nothing: the init subgraph has run before the signature (see the module docstring)."""
    return ()
