"""Choosing a signature of a multi-signature model: its subgraph becomes the main one.

A SignatureDef names a subgraph (e.g. a transformer's prefill and decode graphs).
:func:`select_signature` swaps that subgraph with subgraph 0 and renumbers every reference
to either: each option naming a subgraph (an integer option whose name holds
``subgraph``, such as WHILE's ``cond_subgraph_index``) and each signature def.
Running, training and exporting then act on the chosen signature, and an exported file
still holds every signature, each naming its own subgraph.

:func:`keep_reachable` drops the subgraphs subgraph 0 never runs (through an option naming a
subgraph: a loop body, an init subgraph): a signature of an on-device training file then
lowers without the other signatures' operators (a Flex op of ``save`` does not stop
``train``).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import CircleFormatError
from ..graph import ir
from .edit import record


def signature_keys(model: ir.Model) -> list[str]:
    """The model's signature keys, in file order."""
    return [s.key for s in model.signature_defs]


def select_signature(model: ir.Model, key: str) -> ir.Model:
    """``model`` with signature ``key``'s subgraph as subgraph 0 (see the module docstring);
    one-line `CircleFormatError` naming the available keys when there is no such one."""
    found = {s.key: s.subgraph_index for s in model.signature_defs}
    if key not in found:
        have = ", ".join(repr(k) for k in found) or "none"
        raise CircleFormatError(f"the model has no signature {key!r} (signatures: {have})")
    k = found[key]
    if not 0 <= k < len(model.subgraphs):
        raise CircleFormatError(f"signature {key!r} names subgraph {k}; the model has "
                                f"{len(model.subgraphs)}")
    return select_subgraph(model, k, {"signature": key}, "select_signature")


def select_subgraph(model: ir.Model, k: int, what: dict[str, str] | None = None,
                    name: str = "select_subgraph") -> ir.Model:
    """``model`` with subgraph ``k`` (which must exist) as subgraph 0, swapped as
    :func:`select_signature` does (recorded as pass ``name``, its changes after ``what``)."""
    what = dict(what or {"subgraph": str(k)})
    if k == 0:
        return record(model, name, what)
    swap = {0: k, k: 0}
    order = [swap.get(j, j) for j in range(len(model.subgraphs))]
    subgraphs = tuple(
        replace(model.subgraphs[j], index=n,
                operators=tuple(_renumbered(op, swap) for op in model.subgraphs[j].operators))
        for n, j in enumerate(order))
    signatures = tuple(replace(s, subgraph_index=swap.get(s.subgraph_index, s.subgraph_index))
                       for s in model.signature_defs)
    out = replace(model, subgraphs=subgraphs, signature_defs=signatures)
    return record(out, name, {**what, "subgraph 0": f"was subgraph {k}",
                              f"subgraph {k}": "was subgraph 0"})


def _renumbered(op: ir.Operator, swap: dict[int, int]) -> ir.Operator:
    """``op`` with the subgraph indices its options name renumbered by ``swap`` (those it
    lacks unchanged)."""
    refs = {name: swap[v] for name, v in op.options.items()
            if "subgraph" in name and isinstance(v, int) and v in swap}
    return replace(op, options=ir.Options({**op.options, **refs})) if refs else op


def keep_reachable(model: ir.Model) -> ir.Model:
    """``model`` with only subgraph 0 and the subgraphs it reaches (see the module
    docstring), renumbered in their order, with the signature defs of those kept."""
    reached = reachable(model, 0)
    if len(reached) == len(model.subgraphs):
        return record(model, "keep_reachable", {})
    new = {old: n for n, old in enumerate(sorted(reached))}
    subgraphs = tuple(
        replace(model.subgraphs[old], index=n,
                operators=tuple(_renumbered(op, new) for op in model.subgraphs[old].operators))
        for old, n in new.items())
    signatures = tuple(replace(s, subgraph_index=new[s.subgraph_index])
                       for s in model.signature_defs if s.subgraph_index in new)
    dropped = sorted(set(range(len(model.subgraphs))) - reached)
    return record(replace(model, subgraphs=subgraphs, signature_defs=signatures),
                  "keep_reachable", {f"subgraph {k}": "dropped" for k in dropped})


def reachable(model: ir.Model, k: int) -> set[int]:
    """Subgraph ``k`` and every subgraph it runs, directly or not (options naming a
    subgraph)."""
    reached, todo = {k}, [k]
    while todo:
        for op in model.subgraphs[todo.pop()].operators:
            for v in runs(model, op):
                if v not in reached:
                    reached.add(v)
                    todo.append(v)
    return reached


def runs(model: ir.Model, op: ir.Operator) -> list[int]:
    """The subgraphs ``op`` runs itself (options naming a subgraph of ``model``)."""
    return [v for name, v in op.options.items()
            if "subgraph" in name and isinstance(v, int) and 0 <= v < len(model.subgraphs)]
