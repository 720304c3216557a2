"""QDQ pairs as fake quantization: the middle tensor of a QUANTIZE/DEQUANTIZE pair holds real
values, so gradients pass the pair.

The rule (:func:`fake_quantize_pairs`), in every subgraph: a QUANTIZE from a float tensor to
an 8- or 16-bit integer tensor ``q`` that only DEQUANTIZE operators read (and that is no
subgraph output) is a fake quantization, as tfmot's QAT models converted without
optimizations write them around float operators and weights. ``q`` becomes a float32 tensor
that keeps its quantization, its integer type recorded as ``Quantization.storage``: QUANTIZE
then computes the real value of the integer it rounds to (``scale * (clip(round(x / scale)
+ zero_point) - zero_point)``, the same integers as before) with the clipped straight-through
gradient, and DEQUANTIZE of a float tensor is the identity. Values do not change, so the
forward is the file's; the writer writes ``q`` in its stored type again. The record maps each
tensor to its stored type.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph import ir
from .edit import record, replace_subgraph

_STORED = frozenset({"int8", "uint8", "int16"})


def fake_quantize_pairs(model: ir.Model) -> ir.Model:
    """``model`` with its QDQ pairs as fake quantizations (see the module docstring)."""
    changes: dict[str, str] = {}
    for sg in model.subgraphs:
        readers: dict[int, set[str]] = {}
        for op in sg.operators:
            for i in op.inputs:
                if i >= 0:
                    readers.setdefault(i, set()).add(op.type)
        tensors = list(sg.tensors)
        for op in sg.operators:
            if op.type != "QUANTIZE" or not op.inputs or op.inputs[0] < 0 or not op.outputs:
                continue
            x, q = tensors[op.inputs[0]], tensors[op.outputs[0]]
            if not x.is_float or q.dtype not in _STORED or q.quantization is None \
                    or not q.quantization.scale or q.index in sg.outputs \
                    or readers.get(q.index) != {"DEQUANTIZE"}:
                continue
            tensors[q.index] = replace(q, dtype="float32",
                                       quantization=replace(q.quantization, storage=q.dtype))
            where = f"subgraph {sg.index} " if len(model.subgraphs) > 1 else ""
            changes[f"{where}{q.name}"] = q.dtype
        if changes:
            model = replace_subgraph(model, sg.index, tensors=tuple(tensors))
    if not changes:
        return model
    return record(model, "fake_quantize_pairs", changes, "tensor: stored as")
