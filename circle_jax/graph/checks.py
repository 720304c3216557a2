"""Whole-graph validation at load, before anything is traced: every operator's input count
against its kernel's signature, every tensor read after it is computed (operators run in
file order), every subgraph an operator calls exists and calls do not recurse.

Each check returns refusals as one-line strings; :class:`~circle_jax.lower.Lowered` gathers
them with the operators' own option checks into the single load-time error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

from . import ir


@cache
def arity(fn: Callable[..., Any]) -> tuple[int, float]:
    """(required, maximum) count of operator inputs ``fn(ctx, *inputs)`` accepts."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # after ctx
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    most = float("inf") if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    return required, most


def check_arity(op: ir.Operator, fn: Callable[..., Any]) -> None:
    """ValueError when ``op`` gives its kernel fewer or more inputs than it takes."""
    required, most = arity(fn)
    n = len(op.inputs)
    if n < required or n > most:
        takes = f"{required}" if required == most else (
            f"{required} or more" if most == float("inf") else f"{required} to {int(most)}")
        raise ValueError(f"has {n} inputs; {op.key} takes {takes}")


def _subgraph_refs(op: ir.Operator) -> list[tuple[str, int]]:
    return [(k, int(v)) for k, v in op.options.items()
            if k.endswith("subgraph_index") and isinstance(v, (int, float))]


def check_graph(model: ir.Model) -> list[str]:
    """One line per refusal: reads before writes, unknown or recursive subgraph calls,
    inputs and outputs of unknown type."""
    refusals: list[str] = []
    n = len(model.subgraphs)
    calls: dict[int, set[int]] = {}
    for sg in model.subgraphs:
        known = set(sg.inputs)
        known.update(t.index for t in sg.tensors if t.data is not None or t.is_variable)
        calls[sg.index] = set()
        for op in sg.operators:
            where = f"subgraph {sg.index} operator {op.index} ({op.key})"
            if not any(i >= 0 for i in op.outputs):
                refusals.append(f"{where} has no output (expected at least one)")
            late = [i for i in op.inputs if i >= 0 and i not in known]
            if late:
                name = sg.tensors[late[0]].name[:60]
                refusals.append(f"{where} reads tensor {late[0]} {name!r} before any operator "
                                "computes it (operators must be in execution order)")
            known.update(i for i in op.outputs if i >= 0)
            for field, k in _subgraph_refs(op):
                if not 0 <= k < n:
                    refusals.append(f"{where}: {field} {k} is out of range "
                                    f"(the model has {n} subgraphs)")
                else:
                    calls[sg.index].add(k)
        for i in (*sg.inputs, *sg.outputs):
            if sg.tensors[i].dtype.startswith("unknown"):
                refusals.append(f"subgraph {sg.index} input/output tensor {i} has an unknown "
                                f"type ({sg.tensors[i].dtype}); expected a TensorType")
        missing = [i for i in sg.outputs if i not in known]
        if missing:
            refusals.append(f"subgraph {sg.index} output tensor {missing[0]} is never computed")
    cycle = _recursion(calls)
    if cycle:
        refusals.append("subgraphs call each other in a cycle "
                        + " -> ".join(map(str, cycle)) + " (recursion has no end)")
    return refusals


def _recursion(calls: dict[int, set[int]]) -> list[int] | None:
    state: dict[int, int] = {}
    path: list[int] = []

    def visit(k: int) -> list[int] | None:
        state[k] = 1
        path.append(k)
        for j in sorted(calls.get(k, ())):
            if state.get(j) == 1:
                return path[path.index(j):] + [j]
            if j not in state and (found := visit(j)):
                return found
        path.pop()
        state[k] = 2
        return None

    for k in sorted(calls):
        if k not in state and (found := visit(k)):
            return found
    return None
