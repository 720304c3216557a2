"""Conversion shapes: a QUANTIZE or DEQUANTIZE output declared without a shape takes its
input's.

The rule (:func:`fill_conversion_shapes`), in every subgraph: QUANTIZE and DEQUANTIZE keep
their input's shape, so an output tensor whose declared shape is empty (rank 0) while the
input's is not gets the input's shape (and shape signature). TF's converter writes such
tensors in QDQ files (a weight's QUANTIZE/DEQUANTIZE pair, tfmot's QAT models converted
without optimizations); LiteRT sizes them at Prepare. Nothing else changes; the record names
each tensor with its new shape (no record when nothing changed).
"""

from __future__ import annotations

from dataclasses import replace

from ..graph import ir
from .edit import record, replace_subgraph

_CONVERSIONS = frozenset({"QUANTIZE", "DEQUANTIZE"})


def fill_conversion_shapes(model: ir.Model) -> ir.Model:
    """``model`` with the conversions' shapeless outputs shaped (see the module docstring)."""
    changes: dict[str, str] = {}
    for sg in model.subgraphs:
        tensors = list(sg.tensors)
        for op in sg.operators:
            if op.type not in _CONVERSIONS or not op.inputs or op.inputs[0] < 0 \
                    or not op.outputs or op.outputs[0] < 0:
                continue
            x, y = tensors[op.inputs[0]], tensors[op.outputs[0]]
            if y.shape == () and x.shape != () and y.data is None:
                tensors[y.index] = replace(y, shape=x.shape, shape_signature=x.shape_signature)
                where = f"subgraph {sg.index} " if len(model.subgraphs) > 1 else ""
                changes[f"{where}{y.name}"] = str(list(x.shape))
        if changes:
            model = replace_subgraph(model, sg.index, tensors=tuple(tensors))
    if not changes:  # most files: no record, so Model.passes lists what changed the model
        return model
    return record(model, "fill_conversion_shapes", changes, "tensor: shape")
