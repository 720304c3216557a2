"""Composites as their decompositions: each STABLEHLO_COMPOSITE of subgraph 0 replaced by
the operators of its decomposition subgraph.

A STABLEHLO_COMPOSITE names a pattern (``odml.scaled_dot_product_attention``) and a
decomposition subgraph that computes it; circle-jax runs the decomposition
(`circle_jax.ops.control`), so the inlined graph computes the same values. The
decomposition's operators take the composite's place, in order: its inputs read the
composite's inputs, its outputs write the composite's outputs, and its other tensors are
appended to subgraph 0, named ``<composite name>#<operator index>/<tensor name>``
(constants keep their buffers). Composites inside a decomposition are inlined in turn.
A composite whose decomposition passes an input straight to an output, or names no
subgraph, stays as it is. The decomposition subgraphs stay (`keep_reachable` drops those
nothing runs any more).
"""

from __future__ import annotations

from dataclasses import replace

from ..graph import ir
from .edit import record, replace_subgraph

COMPOSITE = "STABLEHLO_COMPOSITE"


def inline_composites(model: ir.Model) -> ir.Model:
    """``model`` with subgraph 0's composites inlined (see the module docstring)."""
    inlined: dict[str, str] = {}
    for _ in range(len(model.subgraphs)):  # a nesting deeper than that is a cycle
        main = model.main
        tensors, operators, found = list(main.tensors), [], False
        for op in main.operators:
            body = _decomposition(model, op)
            found = found or body is not None
            if body is None:
                operators.append(replace(op, index=len(operators)))
                continue
            where = {**dict(zip(body.inputs, op.inputs)), **dict(zip(body.outputs, op.outputs))}
            prefix = f"{op.options.get('name') or COMPOSITE}#{op.index}"
            for t in body.tensors:
                if t.index not in where:
                    where[t.index] = len(tensors)
                    tensors.append(replace(t, index=len(tensors), name=f"{prefix}/{t.name}",
                                           origin=None))
            for inner in body.operators:
                operators.append(replace(
                    inner, index=len(operators), origin=None,
                    inputs=tuple(where[i] if i >= 0 else i for i in inner.inputs),
                    outputs=tuple(where[o] for o in inner.outputs)))
            inlined[f"operator {op.index}"] = f"{prefix}: {len(body.operators)} operators " \
                f"of subgraph {op.options.get('decomposition_subgraph_index')}"
        if not found:
            break
        model = replace_subgraph(model, 0, tensors=tuple(tensors), operators=tuple(operators))
    return record(model, "inline_composites", inlined)


def _decomposition(model: ir.Model, op: ir.Operator) -> ir.Subgraph | None:
    """The subgraph that ``op`` (a composite) can be replaced by, else None."""
    if op.type != COMPOSITE:
        return None
    k = op.options.get("decomposition_subgraph_index")
    if not isinstance(k, int) or not 0 < k < len(model.subgraphs):
        return None
    body = model.subgraphs[k]
    if set(body.inputs) & set(body.outputs) or len(body.inputs) != len(op.inputs) \
            or len(body.outputs) != len(op.outputs):
        return None
    return body
