"""Resource variables of a model (LiteRT's on-device training files), read from its graph.

A variable is its ``shared_name``: VAR_HANDLE (options ``container``, ``shared_name``)
makes a RESOURCE tensor naming it, READ_VARIABLE reads its value, ASSIGN_VARIABLE (no
output) sets it. The same shared_name in two subgraphs is the same variable: variables live
in the interpreter and every signature sees them. CALL_ONCE (no output, option
``init_subgraph_index``) runs its init subgraph once per interpreter, before the first
signature that holds it: the variables that subgraph assigns are *initialised*; the others
hold nothing until a signature (e.g. ``restore``) assigns them.

Every rule here is about the graph alone (no values); the variables' values live in
`circle_jax.signatures`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir

#: Builtin operators that have no output by definition: their effect is on variables.
NO_OUTPUT = frozenset({"ASSIGN_VARIABLE", "CALL_ONCE"})

#: The operators that make, read and set variables, or run an init subgraph.
VARIABLE_OPERATORS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})


def flex_op(op: ir.Operator) -> str | None:
    """The TensorFlow op name of a Flex operator (custom_code "Flex" + the op name), else
    None."""
    code = op.custom_code or ""
    return code[4:] if op.type == "CUSTOM" and code.startswith("Flex") and code[4:] else None


def may_have_no_output(op: ir.Operator) -> bool:
    """Whether ``op`` may legitimately have no output: :data:`NO_OUTPUT`, and Flex operators
    (TensorFlow ops such as Save have none)."""
    return op.type in NO_OUTPUT or flex_op(op) is not None


@dataclass(frozen=True)
class Variable:
    """One variable: its shared_name, the dtype and shape it is read or assigned with (the
    first seen; "" and () when no subgraph reads or assigns it), whether an init subgraph
    assigns it, and the (subgraph, operator) pairs that read and assign it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    initialised: bool
    reads: tuple[tuple[int, int], ...]
    assigns: tuple[tuple[int, int], ...]


def handles(sg: ir.Subgraph) -> dict[int, str]:
    """Tensor index -> shared_name of the RESOURCE tensors the VAR_HANDLEs of ``sg`` make."""
    return {op.outputs[0]: str(op.options.shared_name or "") for op in sg.operators
            if op.type == "VAR_HANDLE" and op.outputs and op.outputs[0] >= 0}


def init_subgraphs(model: ir.Model, within: set[int] | None = None) -> list[int]:
    """The init subgraphs CALL_ONCE operators name (of subgraphs ``within``; default all),
    each once, in the order first named."""
    found: list[int] = []
    for sg in model.subgraphs:
        if within is not None and sg.index not in within:
            continue
        for op in sg.operators:
            k = op.options.init_subgraph_index
            if op.type == "CALL_ONCE" and isinstance(k, int) and k not in found:
                found.append(k)
    return found


def variables(model: ir.Model) -> dict[str, Variable]:
    """Every variable some VAR_HANDLE names, by shared_name, in the order first met."""
    inits = set(init_subgraphs(model))
    seen: dict[str, dict] = {}
    for sg in model.subgraphs:
        names = handles(sg)
        for name in names.values():
            seen.setdefault(name, {"spec": None, "init": False, "reads": [], "assigns": []})
        for op in sg.operators:
            if op.type not in ("READ_VARIABLE", "ASSIGN_VARIABLE") or not op.inputs:
                continue
            name = names.get(op.inputs[0])
            if name is None:
                continue
            v = seen[name]
            read = op.type == "READ_VARIABLE"
            value = (op.outputs[0] if op.outputs else -1) if read else (
                op.inputs[1] if len(op.inputs) > 1 else -1)
            if value >= 0 and v["spec"] is None:
                v["spec"] = (sg.tensors[value].dtype, sg.tensors[value].shape)
            v["reads" if read else "assigns"].append((sg.index, op.index))
            v["init"] |= not read and sg.index in inits
    return {name: Variable(name, *(v["spec"] or ("", ())), v["init"], tuple(v["reads"]),
                           tuple(v["assigns"])) for name, v in seen.items()}


def check_variables(model: ir.Model) -> list[str]:
    """One line per malformed use of variables: a VAR_HANDLE without a shared_name,
    READ_VARIABLE / ASSIGN_VARIABLE whose first input is not a RESOURCE tensor, a variable
    read or assigned with another dtype than elsewhere (in any subgraph: they share it)."""
    refusals: list[str] = []
    first: dict[str, tuple[str, str]] = {}
    for sg in model.subgraphs:
        names = handles(sg)
        for op in sg.operators:
            where = f"subgraph {sg.index} operator {op.index} ({op.type})"
            if op.type == "VAR_HANDLE" and not op.options.shared_name:
                refusals.append(f"{where} has no shared_name (expected the variable's name)")
            if op.type not in ("READ_VARIABLE", "ASSIGN_VARIABLE"):
                continue
            if not op.inputs or op.inputs[0] < 0 or sg.tensors[op.inputs[0]].dtype != "resource":
                refusals.append(f"{where}: input 0 is not a RESOURCE tensor (expected a "
                                "VAR_HANDLE's output)")
                continue
            name = names.get(op.inputs[0])
            value = op.outputs[0] if op.type == "READ_VARIABLE" else op.inputs[-1]
            if name is None or value < 0:
                continue
            dtype = sg.tensors[value].dtype
            if name in first and first[name][0] != dtype:
                refusals.append(f"{where}: variable {name[:60]!r} is {dtype} here and "
                                f"{first[name][0]} at {first[name][1]} (a variable has one "
                                "dtype in every subgraph)")
            first.setdefault(name, (dtype, where))
    return refusals
