"""Add missing biases: a weighted operator without its optional bias gets a zero one.

TF's converter drops all-zero FULLY_CONNECTED biases, which Keras still trains; a
``Dense(use_bias=False)`` converts to the same file. For each operator
`circle_jax.graph.params_policy.missing_biases` finds (main subgraph, float weights and
output, no bias) and the selection names, :func:`add_missing_biases` adds a zero constant
``<weights name>/bias`` of the output channel count in the output's dtype and makes it the
operator's bias input (padding the inputs with -1, "absent", up to the bias position).

A selection (:func:`bias_selection`) is "all", "none", or operators named by ``op<i>``,
``op<i>.bias``, ``op<i>.weight`` (the aliases `circle-jax info` prints) or their weights'
tensor name, as a list or one comma-separated string.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from ..graph import ir
from ..graph.params_policy import missing_biases
from .edit import add_constant, record, replace_subgraph

_OPERATOR = re.compile(r"op(\d+)(?:\.(?:bias|weight))?")


def bias_selection(spec: bool | str | Iterable[str]) -> str:
    """``spec`` as the text a numerics profile keeps: "all" (True), "none" (False), or the
    named operators joined by commas. Raises ValueError when it names nothing."""
    if isinstance(spec, bool):
        return "all" if spec else "none"
    words = [w.strip() for item in ([spec] if isinstance(spec, str) else list(spec))
             for w in str(item).split(",") if w.strip()]
    if not words:
        raise ValueError("add_missing_bias: expected 'none', 'all' or operator aliases "
                         "(op3, op3.bias), got nothing")
    if len(words) == 1 and words[0].lower() in ("all", "none"):
        return words[0].lower()
    return ",".join(words)


def bias_operators(model: ir.Model, selection: str) -> list[int]:
    """Indices of the main-subgraph operators without a bias that ``selection`` (see
    :func:`bias_selection`) names; a ValueError names a word that names none of them."""
    missing = {j: model.main.operators[j] for j, _, _ in missing_biases(model)}
    if selection == "all":
        return sorted(missing)
    if selection == "none":
        return []
    weights = {model.main.tensors[op.inputs[1]].name: j for j, op in missing.items()}
    chosen = set()
    for word in selection.split(","):
        match = _OPERATOR.fullmatch(word)
        j = int(match.group(1)) if match else weights.get(word)
        if j not in missing:
            have = ", ".join(f"op{k} ({op.key})" for k, op in missing.items()) or "none"
            raise ValueError(f"add_missing_bias: {word!r} names no operator without a bias "
                             f"(those without one: {have})")
        chosen.add(j)
    return sorted(chosen)


def add_missing_biases(model: ir.Model, selection: str = "all") -> ir.Model:
    """``model`` with a zero bias for every weighted operator without one that ``selection``
    names (see the module docstring); the record maps each added bias to its operator."""
    added: dict[str, str] = {}
    chosen = bias_operators(model, selection)
    for j, pos, channels in missing_biases(model):
        if j not in chosen:
            continue
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
