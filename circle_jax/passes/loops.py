"""Loops of a static trip count as their iterations: each WHILE of subgraph 0 whose
condition follows from constants alone replaced by copies of its body, one per iteration.

A loop variable is static while its value follows from constants: its initial value is a
constant of subgraph 0 and the body computes its next value from static values with integer
or boolean arithmetic (`_ARITHMETIC`: a converted Keras RNN's step counters). When the
condition then reads static values only, the trip count is known (at most `MAX_TRIPS`, and
at most `MAX_UNROLLED` operators in all) and the loop is unrolled: iteration ``t``'s copy of
the body reads the previous copy's outputs; static values become constants (a counter that
indexes the sequence is that step's index); the operators that only compute static values
are dropped; the body's constants are added to subgraph 0 once, under their own names, and
every copy reads them (a weight of the body stays one param, its gradient summed over the
iterations). The readers of the loop's outputs read the last copy's. Other loops stay as
they are. Used by the exported training step, whose backward rules cover the body's
operators; the cond and body subgraphs stay (`keep_reachable` drops them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..graph import ir
from .edit import record, replace_subgraph

MAX_TRIPS = 4096
MAX_UNROLLED = 100_000
_ARITHMETIC: dict[str, Callable[..., np.ndarray]] = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MINIMUM": np.minimum,
    "MAXIMUM": np.maximum, "LESS": np.less, "LESS_EQUAL": np.less_equal,
    "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal, "EQUAL": np.equal,
    "NOT_EQUAL": np.not_equal, "LOGICAL_AND": np.logical_and, "LOGICAL_OR": np.logical_or,
    "LOGICAL_NOT": np.logical_not,
}
_Values = dict[int, np.ndarray]


def unroll_static_whiles(model: ir.Model) -> ir.Model:
    """``model`` with subgraph 0's loops of a static trip count unrolled (module docstring)."""
    main = model.main
    tensors, operators = list(main.tensors), []
    rename: dict[int, int] = {}
    unrolled: dict[str, str] = {}
    for op in main.operators:
        op = replace(op, index=len(operators),
                     inputs=tuple(rename.get(i, i) for i in op.inputs))
        plan = _static_iterations(model, op) if op.type == "WHILE" else None
        if plan is None:
            operators.append(op)
            continue
        body = model.subgraphs[op.options.body_subgraph_index]
        final = _unroll(tensors, operators, body, op, plan)
        rename.update(zip(op.outputs, final))
        unrolled[f"operator {op.index}"] = f"{len(plan)} iterations"
    if not unrolled:
        return record(model, "unroll_static_whiles", {})
    model = replace_subgraph(model, 0, tensors=tuple(tensors), operators=tuple(operators),
                             outputs=tuple(rename.get(i, i) for i in main.outputs))
    return record(model, "unroll_static_whiles", unrolled)


def _evaluate(sg: ir.Subgraph, inputs: Sequence[np.ndarray | None]) -> _Values:
    """Every tensor of ``sg`` whose value follows from ``inputs`` (None: not static) and
    its constants through `_ARITHMETIC` on integers and booleans."""
    env: _Values = {i: v for i, v in zip(sg.inputs, inputs) if _integral(v) is not None}
    for t in sg.tensors:
        if t.data is not None and t.index not in env:
            env[t.index] = t.data
    for op in sg.operators:
        fn = _ARITHMETIC.get(op.type)
        args = [env.get(i) for i in op.inputs]
        if fn is None or any(a is None or a.dtype.kind not in "biu" for a in args):
            continue
        out = np.asarray(fn(*args))
        if out.size <= 64:  # counters and flags, not tensors
            env[op.outputs[0]] = out.astype(ir.as_numpy_dtype(sg.tensors[op.outputs[0]].dtype))
    return env


def _integral(value: np.ndarray | None) -> np.ndarray | None:
    """``value`` when it is integers or booleans (what can be static), else None."""
    return value if value is not None and value.dtype.kind in "biu" else None


def _static_iterations(model: ir.Model, op: ir.Operator) -> list[list] | None:
    """The static loop variables' values at the start of each iteration, or None when the
    trip count does not follow from constants (or is over the bounds)."""
    o = op.options
    k_cond, k_body = o.cond_subgraph_index, o.body_subgraph_index
    if not all(isinstance(k, int) and 0 < k < len(model.subgraphs) for k in (k_cond, k_body)):
        return None
    cond, body = model.subgraphs[k_cond], model.subgraphs[k_body]
    if len(cond.inputs) != len(op.inputs) or len(body.outputs) != len(op.inputs):
        return None
    state = [_integral(model.main.tensors[i].data) if i >= 0 else None for i in op.inputs]
    plan = []
    for _ in range(min(MAX_TRIPS, MAX_UNROLLED // max(len(body.operators), 1)) + 1):
        flag = _evaluate(cond, state).get(cond.outputs[0]) if len(cond.outputs) == 1 else None
        if flag is None or flag.size != 1:
            return None
        if not bool(flag.reshape(())):
            return plan
        plan.append(state)
        env = _evaluate(body, state)
        state = [_integral(env.get(i)) for i in body.outputs]
    return None


def _unroll(tensors: list[ir.Tensor], operators: list[ir.Operator], body: ir.Subgraph,
            op: ir.Operator, plan: list[list]) -> list[int]:
    """Append ``plan``'s iterations of ``body`` to ``tensors`` / ``operators``; the tensor
    holding each loop variable's final value."""

    def add(t: ir.Tensor, name: str, data: np.ndarray | None = None) -> int:
        if data is not None:
            data = np.array(data)
            data.flags.writeable = False
        tensors.append(replace(t, index=len(tensors), name=name, origin=None,
                               **({} if data is None else {"data": data,
                                                           "buffer": ir.NEW_BUFFER})))
        return len(tensors) - 1

    shared: dict[int, int] = {}  # body constant -> its one copy in subgraph 0
    values = list(op.inputs)  # each loop variable's tensor in subgraph 0
    for step, state in enumerate(plan):
        env = _evaluate(body, state)
        where: dict[int, int] = {}

        def tensor(i: int, env: _Values = env, where: dict[int, int] = where,
                   step: int = step) -> int:
            if i < 0 or i in where:
                return where.get(i, i)
            t = body.tensors[i]
            if t.data is not None:
                if i not in shared:
                    shared[i] = add(t, t.name)
                where[i] = shared[i]
            elif _integral(env.get(i)) is not None:
                where[i] = add(t, f"{t.name}@{step}", env[i])
            else:
                where[i] = add(t, f"{t.name}@{step}")
            return where[i]

        for j, i in enumerate(body.inputs):
            if state[j] is None:
                where[i] = values[j]
        for inner in body.operators:
            if all(_integral(env.get(o)) is not None for o in inner.outputs):
                continue  # static: its values become constants where they are read
            operators.append(replace(inner, index=len(operators), origin=None,
                                     inputs=tuple(tensor(i) for i in inner.inputs),
                                     outputs=tuple(tensor(o) for o in inner.outputs)))
        values = [tensor(i) for i in body.outputs]
    return values
