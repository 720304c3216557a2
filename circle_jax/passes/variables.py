"""Resource variables read by subgraph 0 become constants holding their initial values.

An on-device training file's signature (``infer``) reads its weights from resource variables
(`circle_jax.graph.variables`), which its init subgraph assigns from constants once
(CALL_ONCE). :func:`read_variables_as_constants` turns each READ_VARIABLE of subgraph 0 into
a constant holding the variable's initial value, named by the variable's shared_name (a
variable read twice is one constant), and removes the VAR_HANDLE and CALL_ONCE operators left
without purpose: the signature is then an ordinary model whose params are the variables it
reads, which `circle_jax.load` trains like any other. ``values`` (shared_name -> array, e.g.
what the file's ``restore`` read from a checkpoint: `circle_jax.signatures.restore`) give
variables their values over the init subgraph's. Refused in one line each: a variable with
no value (the file does not initialise it and ``values`` lacks it; naming it: TF's converter
drops the initialisers of Keras layers built in a module's constructor), an initial value
the init subgraph computes rather than holds, a subgraph 0 that assigns variables (a
training step: `circle_jax.Interpreter` runs it) or reads them elsewhere than in subgraph 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from ..errors import CircleFormatError, UnsupportedOperatorError, VariableError
from ..graph import ir
from ..graph.variables import VARIABLE_OPERATORS, handles, init_subgraphs
from .edit import record, replace_subgraph
from .signature import reachable


def uses_variables(model: ir.Model) -> bool:
    """Whether subgraph 0 holds a variable operator (:data:`VARIABLE_OPERATORS`)."""
    return any(op.type in VARIABLE_OPERATORS for op in model.main.operators)


def initial_values(model: ir.Model) -> dict[str, tuple[int, np.ndarray | None]]:
    """shared_name -> (init subgraph, the constant it assigns; None when it computes it), for
    the init subgraphs CALL_ONCE operators reachable from subgraph 0 name."""
    found: dict[str, tuple[int, np.ndarray | None]] = {}
    for k in init_subgraphs(model, reachable(model, 0)):
        sg = model.subgraphs[k]
        names = handles(sg)
        for op in sg.operators:
            if op.type == "ASSIGN_VARIABLE" and len(op.inputs) == 2 and op.inputs[0] in names:
                found[names[op.inputs[0]]] = (k, sg.tensors[op.inputs[1]].data)
    return found


def read_variables_as_constants(model: ir.Model,
                                values: Mapping[str, np.ndarray] | None = None) -> ir.Model:
    """``model`` with subgraph 0's variable reads as constants (see the module docstring),
    ``values`` over the initial ones; unchanged (recorded, no change) when subgraph 0 uses
    no variables."""
    if not uses_variables(model):
        return record(model, "read_variables_as_constants", {})
    sg = model.main
    names = handles(sg)
    _refuse_other_uses(model)
    initial, given = initial_values(model), dict(values or {})
    tensors = list(sg.tensors)
    first: dict[str, int] = {}   # shared_name -> the constant tensor standing for it
    moved: dict[int, int] = {}   # a later read's output -> that tensor
    changes: dict[str, str] = {}
    for op in sg.operators:
        if op.type != "READ_VARIABLE":
            continue
        name, out = names.get(op.inputs[0]), op.outputs[0]
        if name is None:
            raise UnsupportedOperatorError(f"operator {op.index} (READ_VARIABLE) reads a "
                                           "variable no VAR_HANDLE of subgraph 0 names")
        if name in first:
            moved[out] = first[name]
            continue
        k, value = initial.get(name, (None, None))
        where = f"variable {name[:60]!r} (read by operator {op.index} of {_what(model)})"
        if name in given:
            k, value = "checkpoint", np.asarray(given[name])
        elif k is None:
            raise VariableError(f"{where} has no initial value in the file (no init subgraph "
                                "assigns it): give it the values of a checkpoint the file's "
                                "restore reads (load(..., restore=CHECKPOINT), --restore "
                                "CKPT)")
        if value is None:
            raise UnsupportedOperatorError(f"{where}: init subgraph {k} computes its initial "
                                           "value (expected a constant it assigns)")
        t = tensors[out]
        if tuple(value.shape) != t.shape:
            raise CircleFormatError(f"{where}: its initial value has shape "
                                    f"{list(value.shape)}, the read declares {list(t.shape)}")
        data = np.array(value, ir.as_numpy_dtype(t.dtype))
        data.flags.writeable = False
        tensors[out] = replace(t, name=name, data=data, buffer=ir.NEW_BUFFER, origin=None)
        first[name] = out
        changes[name] = ("constant: value restored from the checkpoint" if k == "checkpoint"
                         else f"constant: initial value from init subgraph {k}")
    dropped = {op.index for op in sg.operators if op.type in VARIABLE_OPERATORS}
    kept = [replace(op, index=n, inputs=tuple(moved.get(i, i) for i in op.inputs))
            for n, op in enumerate(o for o in sg.operators if o.index not in dropped)]
    outputs = tuple(moved.get(i, i) for i in sg.outputs)
    out = replace_subgraph(model, 0, tensors=tuple(tensors), operators=tuple(kept),
                           outputs=outputs)
    return record(out, "read_variables_as_constants", changes,
                  "variable: what its reads became")


def _refuse_other_uses(model: ir.Model) -> None:
    """One line: subgraph 0 assigns a variable, or a subgraph it calls (other than an init
    subgraph) uses one."""
    assigns = [op for op in model.main.operators if op.type == "ASSIGN_VARIABLE"]
    if assigns:
        names = handles(model.main)
        shown = ", ".join(sorted({repr(names.get(op.inputs[0], "?")) for op in assigns}))
        raise UnsupportedOperatorError(
            f"{_what(model)} assigns variables ({shown}): it is a step over state, which "
            "circle_jax.Interpreter (or circle_jax.signatures.Program) runs; load takes "
            "signatures that only read variables, such as infer")
    inits = set(init_subgraphs(model))
    for k in sorted(reachable(model, 0) - {0} - inits):
        if any(op.type in VARIABLE_OPERATORS for op in model.subgraphs[k].operators):
            raise UnsupportedOperatorError(f"subgraph {k}, which subgraph 0 runs, uses "
                                           "variables (only subgraph 0's reads become "
                                           "constants)")


def _what(model: ir.Model) -> str:
    """"signature 'KEY'" of subgraph 0, or "subgraph 0"."""
    key = next((s.key for s in model.signature_defs if s.subgraph_index == 0), None)
    return f"signature {key!r}" if key is not None else "subgraph 0"
