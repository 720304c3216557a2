"""Untie shared constants: a trainable constant read by several operators gets one copy per
reader.

TF's converter deduplicates equal buffers (e.g. the zero biases of several convolutions),
so one constant may feed several operators; onert trains such readers' weights apart.
:func:`untie_shared_constants` keeps the first reader on the original tensor and gives
each other reader ``k`` a new tensor ``<name>/op<k>`` (a copy of the original: same data,
shape, type and quantization, a buffer of its own when written), so every trained weight
has a tensor of its own and an exported file computes what was trained. Which constants
train follows the trainable policy (`circle_jax.graph.params_policy`); frozen ones stay shared.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph import ir
from ..graph.params_policy import classify_params, param_table, shared_constants
from .edit import record, replace_inputs


def untie_shared_constants(model: ir.Model, policy: str = "weights") -> ir.Model:
    """``model`` with every trainable constant read by several operators copied once per
    reader after the first (see the module docstring); the record maps each copy's name to
    the shared tensor's."""
    keys = param_table(model)
    shared = shared_constants(model, keys, classify_params(model, keys, policy))
    subgraphs = list(model.subgraphs)
    untied: dict[str, str] = {}
    for (k, i), readers in shared.items():
        sg = subgraphs[k]
        t = sg.tensors[i]
        tensors, ops = list(sg.tensors), list(sg.operators)
        for j in readers[1:]:
            copy = replace(t, index=len(tensors), name=f"{t.name}/op{j}", buffer=ir.NEW_BUFFER)
            tensors.append(copy)
            ops[j] = replace_inputs(ops[j], i, copy.index)
            untied[copy.name] = t.name
        subgraphs[k] = replace(sg, tensors=tuple(tensors), operators=tuple(ops))
    out = replace(model, subgraphs=tuple(subgraphs))
    return record(out, "untie_shared_constants", untied, "copy: shared tensor")
