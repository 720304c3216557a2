"""Add missing biases: a weighted operator without its optional bias gets a zero one.

TF's converter drops all-zero FULLY_CONNECTED biases, which Keras still trains. For each
operator `circle_jax.graph.params_policy.missing_biases` finds (main subgraph, float weights
and output, no bias), :func:`add_missing_biases` adds a zero constant
``<weights name>/bias`` of the output channel count in the output's dtype and makes it the
operator's bias input (padding the inputs with -1, "absent", up to the bias position).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph import ir
from ..graph.params_policy import missing_biases
from .edit import add_constant, record, replace_subgraph


def add_missing_biases(model: ir.Model) -> ir.Model:
    """``model`` with a zero bias for every weighted operator that has none (see the module
    docstring); the record maps each added bias to its operator."""
    added: dict[str, str] = {}
    for j, pos, channels in missing_biases(model):
        op = model.main.operators[j]
        weights = model.main.tensors[op.inputs[1]]
        dtype = model.main.tensors[op.outputs[0]].dtype
        name = f"{weights.name}/bias"
        model, b = add_constant(model, 0, name, np.zeros([channels], ir.as_numpy_dtype(dtype)),
                                dtype)
        inputs = [*op.inputs, *[-1] * (pos + 1 - len(op.inputs))]
        inputs[pos] = b
        ops = list(model.main.operators)
        ops[j] = replace(op, inputs=tuple(inputs))
        model = replace_subgraph(model, 0, operators=tuple(ops))
        added[name] = f"zero bias of {op.key} #{j}"
    return record(model, "add_missing_biases", added, "bias: operator")
