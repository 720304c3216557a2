"""Building blocks of graph passes: add a tensor, a constant, an operator; record a change.

Every helper is pure: it returns a new ``ir.Model`` and leaves its argument alone. What a
helper adds has no ``origin`` (the writer builds it from the IR alone): a new constant gets
a buffer of its own (``ir.NEW_BUFFER``); a new operator's code is found in, or added to,
the file's operator code table when the model is written. Indices stay those of the IR:
tensors are appended to their subgraph, and an operator inserted at ``at`` moves the later
operators one place on (tensor indices do not change).

    model, w = add_constant(model, 0, "head/w", np.zeros((10, 64), np.float32))
    model, y = add_tensor(model, 0, "head/y", (1, 10))
    model = add_operator(model, 0, "FULLY_CONNECTED", (x, w, -1), (y,))
    model = set_outputs(model, 0, (y,))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..formats.schema import OPERATOR_CODES
from ..graph import ir


def replace_subgraph(model: ir.Model, k: int, **changes: Any) -> ir.Model:
    """``model`` with subgraph ``k``'s fields replaced by ``changes``."""
    subgraphs = list(model.subgraphs)
    subgraphs[k] = replace(subgraphs[k], **changes)
    return replace(model, subgraphs=tuple(subgraphs))


def add_tensor(model: ir.Model, k: int, name: str, shape: Sequence[int],
               dtype: str = "float32", *, data: np.ndarray | None = None,
               quantization: ir.Quantization | None = None) -> tuple[ir.Model, int]:
    """(``model`` with a tensor appended to subgraph ``k``, its index); with ``data`` it is
    a constant with a buffer of its own."""
    sg = model.subgraphs[k]
    if data is not None:
        data = np.array(data, ir.as_numpy_dtype(dtype)).reshape(tuple(shape))
        data.flags.writeable = False
    t = ir.Tensor(len(sg.tensors), name, tuple(int(d) for d in shape), dtype,
                  ir.NEW_BUFFER if data is not None else 0, data, quantization)
    return replace_subgraph(model, k, tensors=(*sg.tensors, t)), t.index


def add_constant(model: ir.Model, k: int, name: str, value: Any,
                 dtype: str | None = None) -> tuple[ir.Model, int]:
    """(``model`` with a constant tensor holding ``value`` in subgraph ``k``, its index)."""
    arr = np.asarray(value, dtype=None if dtype is None else ir.as_numpy_dtype(dtype))
    return add_tensor(model, k, name, arr.shape, arr.dtype.name if dtype is None else dtype,
                      data=arr)


def add_operator(model: ir.Model, k: int, op_type: str, inputs: Sequence[int],
                 outputs: Sequence[int], options: Mapping[str, Any] | None = None, *,
                 at: int | None = None, custom_code: str | None = None,
                 custom_options: bytes | None = None, version: int = 1) -> ir.Model:
    """``model`` with an operator inserted in subgraph ``k`` before operator ``at`` (default:
    last). ``op_type`` is a builtin name (``"ADD"``) or ``"CUSTOM"`` with ``custom_code``;
    ``options`` use the snake_case names of its options table with the schema's values
    (enum codes, e.g. ``fused_activation_function=ir.ACT_RELU``)."""
    if op_type not in OPERATOR_CODES:
        raise ValueError(f"unknown operator {op_type!r}")
    sg = model.subgraphs[k]
    at = len(sg.operators) if at is None else at
    op = ir.Operator(at, op_type, OPERATOR_CODES[op_type], tuple(inputs), tuple(outputs),
                     ir.Options(options), custom_code, custom_options, version)
    ops = [*sg.operators[:at], op,
           *(replace(o, index=o.index + 1) for o in sg.operators[at:])]
    return replace_subgraph(model, k, operators=tuple(ops))


def set_inputs(model: ir.Model, k: int, inputs: Sequence[int]) -> ir.Model:
    """``model`` with subgraph ``k``'s input tensors replaced; its signature defs follow
    (see :func:`set_outputs`)."""
    return _set_io(model, k, "inputs", tuple(inputs))


def set_outputs(model: ir.Model, k: int, outputs: Sequence[int]) -> ir.Model:
    """``model`` with subgraph ``k``'s output tensors replaced. The signature defs of
    subgraph ``k`` follow position by position: a signature name that named the j-th old
    output names the j-th new one (names of tensors that were no output are kept)."""
    return _set_io(model, k, "outputs", tuple(outputs))


def _set_io(model: ir.Model, k: int, field: str, new: tuple[int, ...]) -> ir.Model:
    old = getattr(model.subgraphs[k], field)
    moved = dict(zip(old, new))
    signatures = tuple(
        replace(s, **{field: {name: moved.get(i, i) for name, i in getattr(s, field).items()}})
        if s.subgraph_index == k else s for s in model.signature_defs)
    out = replace_subgraph(model, k, **{field: new})
    return replace(out, signature_defs=signatures)


def replace_inputs(op: ir.Operator, old: int, new: int) -> ir.Operator:
    """``op`` reading tensor ``new`` wherever it read ``old``."""
    return replace(op, inputs=tuple(new if i == old else i for i in op.inputs))


def record(model: ir.Model, name: str, changes: Mapping[str, str],
           legend: str = "") -> ir.Model:
    """``model`` with pass ``name``'s record appended to ``model.passes``."""
    entry = ir.PassRecord(name, dict(changes), legend)
    return replace(model, passes=(*model.passes, entry))
