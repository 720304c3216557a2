"""A TF V1 checkpoint read as the file's own ``restore`` signature reads it.

LiteRT's on-device training files restore their variables in a signature (TF's tutorial:
``restore(checkpoint_path)``): per variable, a Flex ``Restore(file_pattern, tensor_name)``
of a constant tensor name (or ``RestoreV2``, output ``j`` reading ``tensor_names[j]``),
reshaped to the variable's shape (Restore's output shape is unknown), then ASSIGN_VARIABLE.
:func:`restore_map` reads that from the graph: variable (shared_name) -> the checkpoint
tensor it takes, with the variable's shape and dtype. :func:`restored_variables` checks a
checkpoint against it (one `DataError` line: a tensor missing, or of another shape or type
than the variable it restores), then runs the signature itself on the checkpoint
(`circle_jax.signatures.Program`: the file's semantics, whatever it computes between Restore
and the assign) and returns every variable it assigned.

The restore signature is the one whose subgraph assigns variables from Restore operators
and takes one string input (the checkpoint path); of several, the one keyed ``restore``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from ..formats.tf_checkpoint import restore as read_expected
from ..graph import ir
from ..graph.variables import flex_op, handles
from .program import Program

#: Operators between a Restore and the ASSIGN_VARIABLE that keep the values as they are.
_PASS_THROUGH = frozenset({"RESHAPE", "IDENTITY", "SQUEEZE", "EXPAND_DIMS"})


@dataclass(frozen=True)
class Restored:
    """One variable a restore signature assigns: the checkpoint tensor it reads, the
    variable's shape and dtype (the assigned tensor's)."""

    variable: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str


def _string_constant(sg: ir.Subgraph, i: int) -> list[str] | None:
    t = sg.tensors[i] if i >= 0 else None
    if t is None or t.dtype != "string" or t.data is None:
        return None
    return [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in t.data.flat]


def _source(sg: ir.Subgraph, value: int) -> str | None:
    """The checkpoint tensor name whose Restore gives ``value`` (through :data:`_PASS_THROUGH`
    operators), or None when it is computed otherwise."""
    producer = {o: op for op in sg.operators for o in op.outputs}
    while (op := producer.get(value)) is not None and op.type in _PASS_THROUGH:
        value = op.inputs[0]
    if op is None:
        return None
    name = flex_op(op)
    if name == "Restore" and len(op.inputs) >= 2:
        names = _string_constant(sg, op.inputs[1])
        return names[0] if names and len(names) == 1 else None
    if name == "RestoreV2" and len(op.inputs) >= 2:
        names = _string_constant(sg, op.inputs[1])
        j = op.outputs.index(value)
        return names[j] if names and j < len(names) else None
    return None


def restore_map(model: ir.Model, key: str) -> dict[str, Restored]:
    """The variables signature ``key`` assigns from Restore operators, by shared_name."""
    sig = next(s for s in model.signature_defs if s.key == key)
    sg = model.subgraphs[sig.subgraph_index]
    names = handles(sg)
    found: dict[str, Restored] = {}
    for op in sg.operators:
        if op.type != "ASSIGN_VARIABLE" or len(op.inputs) != 2 or op.inputs[0] not in names:
            continue
        tensor = _source(sg, op.inputs[1])
        if tensor is not None:
            t = sg.tensors[op.inputs[1]]
            found[names[op.inputs[0]]] = Restored(names[op.inputs[0]], tensor, t.shape, t.dtype)
    return found


def restore_signature(model: ir.Model) -> str:
    """The key of the file's restore signature (module docstring); one line when none."""
    found = []
    for sig in model.signature_defs:
        sg = model.subgraphs[sig.subgraph_index]
        strings = [n for n, i in sig.inputs.items() if sg.tensors[i].dtype == "string"]
        if len(sig.inputs) == 1 and strings and restore_map(model, sig.key):
            found.append(sig.key)
    if not found:
        raise ConfigError("the model has no restore signature (one taking a checkpoint path "
                          "and assigning variables from Flex Restore operators; signatures: "
                          + (", ".join(repr(s.key) for s in model.signature_defs) or "none")
                          + "): a checkpoint cannot be restored into it")
    return "restore" if "restore" in found else found[0]


def check_checkpoint(path: str | os.PathLike, expected: dict[str, Restored]) -> None:
    """One DataError line when the checkpoint at ``path`` lacks a tensor ``expected`` reads,
    or holds it with another shape or type than the variable it restores."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise DataError(f"checkpoint {p!r} does not exist")
    tensors = {r.tensor: r for r in expected.values()}
    try:
        read_expected(p, {t: (r.shape, ir.as_numpy_dtype(r.dtype)) for t, r in tensors.items()})
    except DataError as e:
        first = str(e).splitlines()[0]
        named = next((r for t, r in tensors.items() if f"tensor {t!r} is" in first), None)
        raise DataError(first + (f" (restore reads it into variable {named.variable!r}, "
                                 f"{named.dtype}{list(named.shape)})" if named else "")
                        ) from None


def restored_variables(program: Program, path: str | os.PathLike,
                       variables: dict[str, Any] | None = None,
                       key: str | None = None) -> dict[str, np.ndarray]:
    """Every variable after the file's restore signature (``key``, default found by
    :func:`restore_signature`) ran on the checkpoint at ``path``, from ``variables`` (default:
    the file's initial values); the checkpoint is checked first (:func:`check_checkpoint`)."""
    key = key or restore_signature(program.model)
    check_checkpoint(path, restore_map(program.model, key))
    sig = program.signature(key)
    start = program.initial_variables() if variables is None else dict(variables)
    (name,) = sig.inputs
    _, after = sig(start, {name: np.array(os.fspath(path).encode(), object)})
    return {n: np.asarray(v) for n, v in after.items()}
