"""Short readable aliases for params: operator index + role, e.g. ``op3.bias``, ``op5.weight``.

Tensor names written by converters (``arith.constant1``, ``seq/conv2d_1/Relu;seq/...``) are
hard to type. Every param also answers to ``op<i>.<role>`` for each operator ``i`` of
subgraph 0 that reads it (``sg<k>.op<i>.<role>`` in subgraph ``k``), where the role is the
input's meaning for weighted operators (``weight``, ``bias``, ``gamma``, ...) and ``in<pos>``
otherwise. The alias of the first reader is the one printed. Aliases are accepted wherever
weight names are (`circle_jax.train.select_trainable`, ``circle-jax train --trainable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from . import ir

ParamKey = tuple[int, int]  # (subgraph index, tensor index), as circle_jax.lowering.interpreter's

#: input position -> role, per operator type (other inputs are ``in<pos>``)
ROLES: dict[str, dict[int, str]] = {
    "CONV_2D": {1: "weight", 2: "bias"},
    "CONV_3D": {1: "weight", 2: "bias"},
    "DEPTHWISE_CONV_2D": {1: "weight", 2: "bias"},
    "FULLY_CONNECTED": {1: "weight", 2: "bias"},
    "TRANSPOSE_CONV": {1: "weight", 3: "bias"},
    "BCQ_FULLY_CONNECTED": {3: "bias"},
    "INSTANCE_NORM": {1: "gamma", 2: "beta"},
    "RMS_NORM": {1: "gamma"},
    "PRELU": {1: "alpha"},
    "EMBEDDING_LOOKUP": {1: "table"},
    "GATHER": {0: "table"},
}


def _role(op: ir.Operator, pos: int) -> str:
    return ROLES.get(op.type, {}).get(pos, f"in{pos}")


def alias_table(model: ir.Model, param_keys: Mapping[str, ParamKey]) -> dict[str, str]:
    """Every alias -> param name; a param read by several operators has one alias each."""
    by_key = {key: name for name, key in param_keys.items()}
    table: dict[str, str] = {}
    for sg in model.subgraphs:
        prefix = f"sg{sg.index}." if sg.index else ""
        for op in sg.operators:
            for pos, i in enumerate(op.inputs):
                name = by_key.get((sg.index, i))
                alias = f"{prefix}op{op.index}.{_role(op, pos)}"
                if name is not None and alias not in table:
                    table[alias] = name
    for name, (k, i) in param_keys.items():  # a param no operator reads: its tensor index
        if name not in table.values():
            table[f"sg{k}.t{i}" if k else f"t{i}"] = name
    return table


def param_aliases(model: ir.Model, param_keys: Mapping[str, ParamKey]) -> dict[str, str]:
    """Param name -> its printed alias (that of the first operator reading it)."""
    out: dict[str, str] = {}
    for alias, name in alias_table(model, param_keys).items():
        out.setdefault(name, alias)
    return out


def resolve_param_names(model: ir.Model, param_keys: Mapping[str, ParamKey],
                        names: Iterable[str]) -> frozenset[str]:
    """The param names meant by ``names`` (each a param name or an alias).

    Unknown names raise one ValueError that lists them and shows how to see the choices.
    """
    aliases = alias_table(model, param_keys)
    chosen, unknown = set(), []
    for n in names:
        if n in param_keys:
            chosen.add(n)
        elif n in aliases:
            chosen.add(aliases[n])
        else:
            unknown.append(n)
    if unknown:
        known = sorted(param_keys) if len(param_keys) <= 10 else f"{len(param_keys)} names"
        some = list(param_aliases(model, param_keys).values())[:4]
        raise ValueError(f"unknown weight name(s) {unknown}; the model's params are {known}, "
                         f"or their aliases such as {some} (`circle-jax info MODEL` lists them)")
    return frozenset(chosen)
