"""Variables' initial values written into an on-device training file (its init subgraph).

:func:`with_initial_values` gives named variables new initial values, every signature of the
file kept as it is: where the init subgraph (CALL_ONCE's) assigns a variable a constant of
its own (one no other variable is assigned from), that constant takes the value; any other
variable gets a VAR_HANDLE and an ASSIGN_VARIABLE of a new constant appended to the init
subgraph (a later assign wins, as the subgraph runs in order). A file without an init
subgraph (TF's converter dropped every initialiser) gets one, and every signature's
subgraph gets a CALL_ONCE of it as its first operator, as TF's converter writes them.
Values are stored in the variable's own dtype; refused in one line: a value of another
shape than the variable's, an integer its dtype cannot hold exactly, a float NaN or
infinity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import DataError
from ..formats.schema import OPERATOR_CODES
from ..formats.writer import with_weights
from ..graph import ir
from ..graph.variables import handles, init_subgraphs, variables

INIT_NAME = "circle_jax_initialise_variables"
"""The name of the init subgraph added to a file that has none."""


def _operator(index: int, op_type: str, inputs: tuple[int, ...], outputs: tuple[int, ...],
              options: Mapping[str, Any]) -> ir.Operator:
    return ir.Operator(index, op_type, OPERATOR_CODES[op_type], inputs, outputs,
                       ir.Options(dict(options)))


def _stored(name: str, value: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` in ``dtype``: refused (one line) for another shape or a lossy cast."""
    a = np.asarray(value)
    if tuple(a.shape) != tuple(shape):
        raise DataError(f"variable {name!r} is {dtype}{list(shape)}; its value has shape "
                        f"{list(a.shape)}")
    out = a.astype(ir.as_numpy_dtype(dtype))
    if out.dtype.kind in "iub" and a.dtype.kind in "fiub" and not np.array_equal(out, a):
        raise DataError(f"variable {name!r} ({dtype}) cannot hold its value exactly")
    if out.dtype.kind == "f" and not np.isfinite(out).all():
        raise DataError(f"variable {name!r} holds NaN or infinity; initial values must be "
                        "finite")
    out.setflags(write=False)
    return out


def with_initial_values(model: ir.Model, values: Mapping[str, Any]) -> ir.Model:
    """``model`` whose init subgraph gives each variable of ``values`` (shared_name -> array)
    that value (see the module docstring); names the file does not have are refused."""
    known = variables(model)
    unknown = [n for n in values if n not in known]
    if unknown:
        raise DataError(f"the model has no variable {unknown[0]!r}")
    if not values:
        return model
    inits = init_subgraphs(model)
    k = inits[0] if inits else len(model.subgraphs)
    subgraphs = list(model.subgraphs)
    if not inits:
        subgraphs.append(ir.Subgraph(k, INIT_NAME, (), (), (), ()))
    sg = subgraphs[k]
    names = handles(sg)
    stored = {n: _stored(n, v, known[n].dtype or np.asarray(v).dtype.name,
                         known[n].shape if known[n].dtype else np.shape(v))
              for n, v in values.items()}
    readers: dict[int, set[str]] = {}  # a constant -> the variables assigned from it
    for op in sg.operators:
        if op.type == "ASSIGN_VARIABLE" and len(op.inputs) == 2 and op.inputs[0] in names:
            readers.setdefault(op.inputs[1], set()).add(names[op.inputs[0]])
    # a constant takes the value only when it initialises that variable alone
    claimed = {i: next(iter(n)) for i, n in readers.items() if len(n) == 1
               and next(iter(n)) in stored and sg.tensors[i].data is not None}
    tensors, ops = list(sg.tensors), list(sg.operators)
    for name, value in stored.items():
        if name in claimed.values():
            continue
        h = len(tensors)
        tensors.append(ir.Tensor(h, f"{name}/handle", (), "resource", 0))
        tensors.append(ir.Tensor(h + 1, f"{name}/initial_value", value.shape,
                                 known[name].dtype or value.dtype.name, ir.NEW_BUFFER, value))
        ops.append(_operator(len(ops), "VAR_HANDLE", (), (h,),
                             {"container": "", "shared_name": name}))
        ops.append(_operator(len(ops), "ASSIGN_VARIABLE", (h, h + 1), (), {}))
    subgraphs[k] = replace(sg, tensors=tuple(tensors), operators=tuple(ops))
    if not inits:
        for sig in model.signature_defs:
            s = subgraphs[sig.subgraph_index]
            first = _operator(0, "CALL_ONCE", (), (), {"init_subgraph_index": k})
            subgraphs[s.index] = replace(s, operators=(first, *(
                replace(op, index=n + 1) for n, op in enumerate(s.operators))))
    out = replace(model, subgraphs=tuple(subgraphs))
    return with_weights(out, {(k, i): stored[name] for i, name in claimed.items()})
