"""What is a weight: the trainability policy for a model's float constant tensors.

Every float constant an operator reads as a value is a param of the loaded model
(:func:`param_table`); the policy decides which params train. Policies:

- ``"weights"`` (default): a param trains when some operator reads it as a weight:
  the weight and bias inputs of FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, CONV_3D,
  TRANSPOSE_CONV, CONV_3D_TRANSPOSE; a non-scalar constant operand of BATCH_MATMUL; the
  weights and biases of fused RNN / LSTM / GRU operators (never their states); PRELU's alpha;
  an embedding table: EMBEDDING_LOOKUP's, or the params (rank >= 2) of a GATHER / GATHER_ND
  whose indices are computed from data (a Keras Embedding converts to GATHER); INSTANCE_NORM /
  RMS_NORM gamma and beta; and a per-channel constant
  (more than one element, every dimension but the last equal to 1) of MUL (a scale) or ADD /
  SUB (a shift), such as a converted LayerNormalization's or a folded BatchNorm's gamma and
  beta. A float16 constant read through DEQUANTIZE counts as what the DEQUANTIZE output feeds.
  Everything else is frozen: scalars (a LayerNorm's epsilon), initial values passed to
  WHILE / IF (an LSTM's zero states), and constants in any other role.
- ``"all_float"``: every float constant trains (circle-jax's behaviour before the policy).
- ``"fc_conv"``: only the weights and biases of FULLY_CONNECTED and CONV_2D train (what
  onert-micro trains: its checkpoints hold only those; the ``onert-micro`` profile's policy).

Index, shape and quantization constants are never params (they are integers, or read at
inputs an operator needs static), whatever the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from . import ir

POLICIES = ("weights", "all_float", "fc_conv")
_FC_CONV = ("FULLY_CONNECTED", "CONV_2D")

ParamKey = tuple[int, int]  # (subgraph index, tensor index)

_WB = {1: "weights", 2: "bias"}
_RNN = {1: "weights", 2: "recurrent weights", 3: "bias"}
#: Operator -> {input position: role} of the inputs that are weights when constant.
WEIGHT_INPUTS: dict[str, dict[int, str]] = {
    "FULLY_CONNECTED": _WB, "CONV_2D": _WB, "DEPTHWISE_CONV_2D": _WB, "CONV_3D": _WB,
    "TRANSPOSE_CONV": {1: "weights", 3: "bias"},
    "CONV_3D_TRANSPOSE": {1: "weights", 3: "bias"},
    "CUSTOM:Convolution2DTransposeBias": _WB,
    "BATCH_MATMUL": {0: "matmul operand", 1: "matmul operand"},
    "CUSTOM:BatchMatMulV2": {0: "matmul operand", 1: "matmul operand"},
    "PRELU": {1: "alpha"},
    "EMBEDDING_LOOKUP": {1: "embedding table"},
    "INSTANCE_NORM": {1: "gamma", 2: "beta"},
    "RMS_NORM": {1: "gamma"},
    "RNN": _RNN, "UNIDIRECTIONAL_SEQUENCE_RNN": _RNN,
    "BIDIRECTIONAL_SEQUENCE_RNN": {**_RNN, 5: "weights", 6: "recurrent weights", 7: "bias"},
    "GRU": {1: "input weights", 2: "input bias", 3: "hidden weights", 4: "hidden bias"},
    # LSTM inputs: 1-17 weights, biases, peepholes, projection; 18-19 states; 20-23 norms.
    "LSTM": {**{p: "weights" for p in range(1, 18)}, **{p: "weights" for p in range(20, 24)}},
    "UNIDIRECTIONAL_SEQUENCE_LSTM": {**{p: "weights" for p in range(1, 18)},
                                     **{p: "weights" for p in range(20, 24)}},
    "BIDIRECTIONAL_SEQUENCE_LSTM": {**{p: "weights" for p in range(1, 35)},
                                    **{p: "weights" for p in range(40, 48)}},
}
#: Operators whose input 0 is an embedding table when it has rank >= 2 and input 1 (the
#: indices) is not a constant.
_TABLE_READERS = ("GATHER", "GATHER_ND")
_PER_CHANNEL = {"MUL": "per-channel scale", "ADD": "per-channel shift",
                "SUB": "per-channel shift"}
#: The control-flow operators (they run other subgraphs on run-time conditions).
CONTROL_FLOW = ("WHILE", "IF")

#: Operator -> the input positions it needs as values known when the model is lowered (they
#: set its output's shape: RANGE's start, limit and delta). A float constant read only at
#: such positions is kept as data, not a param, so the model still compiles; the lowering
#: hands these inputs to the operator as numpy values.
STATIC_INPUTS: dict[str, frozenset[int]] = {"RANGE": frozenset({0, 1, 2})}

#: The operators that take an optional bias, and the bias's input position.
BIAS_POSITION = {"FULLY_CONNECTED": 2, "CONV_2D": 2, "DEPTHWISE_CONV_2D": 2, "CONV_3D": 2,
                 "TRANSPOSE_CONV": 3}


def param_table(model: ir.Model) -> dict[str, ParamKey]:
    """Unique readable names for every float constant tensor that some operator reads as a
    value (not only at inputs that must be static, such as RANGE's bounds)."""
    table: dict[str, ParamKey] = {}
    for sg in model.subgraphs:
        read = {i for op in sg.operators for pos, i in enumerate(op.inputs)
                if i >= 0 and pos not in STATIC_INPUTS.get(op.key, ())}
        for t in sg.tensors:
            if t.is_constant and t.is_float and not t.is_variable and t.index in read:
                name, n = t.name, 1
                while name in table:
                    name, n = f"{t.name}_{n}", n + 1
                table[name] = (sg.index, t.index)
    return table


@dataclass(frozen=True)
class ParamRole:
    """Whether a param trains under the policy, and why (one phrase, for ``circle-jax info``)."""

    trainable: bool
    reason: str


def check_policy(policy: str) -> str:
    """``policy`` if it is a known policy name, else a ValueError naming the known ones."""
    if policy not in POLICIES:
        raise ValueError(f"unknown trainable policy {policy!r}: use one of {', '.join(POLICIES)}")
    return policy


def readers(sg: ir.Subgraph, index: int) -> list[tuple[ir.Operator, int]]:
    """(operator, input position) for every read of tensor ``index`` in subgraph ``sg``."""
    return [(op, pos) for op in sg.operators for pos, i in enumerate(op.inputs) if i == index]


def _per_channel(t: ir.Tensor) -> bool:
    return t.data is not None and t.data.size > 1 and all(d == 1 for d in t.shape[:-1])


def role_of_read(sg: ir.Subgraph, t: ir.Tensor, op: ir.Operator, pos: int,
                 depth: int = 0) -> str | None:
    """The weight role of ``t`` read by ``op`` at input ``pos``, or None when it is no weight."""
    role = WEIGHT_INPUTS.get(op.key, {}).get(pos)
    if role is not None and op.type == "BATCH_MATMUL" and t.data is not None and t.data.size <= 1:
        return None
    if role is not None:
        return role
    if op.type in _TABLE_READERS and pos == 0 and len(t.shape) >= 2 and len(op.inputs) > 1 \
            and sg.tensors[op.inputs[1]].data is None:
        return "embedding table"
    if op.type in _PER_CHANNEL and len(op.inputs) == 2 and _per_channel(t):
        return _PER_CHANNEL[op.type]
    # a weight read through DEQUANTIZE, or through a QDQ pair (QUANTIZE, then DEQUANTIZE)
    through = op.type == "DEQUANTIZE" and depth <= 1 or op.type == "QUANTIZE" and depth == 0
    if through and op.outputs and op.outputs[0] >= 0:
        out = sg.tensors[op.outputs[0]]
        for nxt, p in readers(sg, out.index):
            r = role_of_read(sg, out, nxt, p, depth + 1)
            if r is not None:
                return f"{r} via {op.type}"
    return None


def _frozen_reason(sg: ir.Subgraph, t: ir.Tensor, reads: list[tuple[ir.Operator, int]]) -> str:
    where = ", ".join(dict.fromkeys(f"{op.key} #{op.index}" for op, _ in reads)) or "no operator"
    if any(op.type in CONTROL_FLOW for op, _ in reads):
        return f"initial value passed to {where} (loop-carried state)"
    if t.data is not None and t.data.size <= 1:
        return f"scalar ({where})"
    return f"not a weight input ({where})"


def classify_params(model: ir.Model, param_keys: Mapping[str, ParamKey],
                    policy: str = "weights") -> dict[str, ParamRole]:
    """Each param's role under ``policy``: trainable or frozen, with the reason."""
    check_policy(policy)
    roles: dict[str, ParamRole] = {}
    for name, (k, i) in param_keys.items():
        sg = model.subgraphs[k]
        t = sg.tensors[i]
        reads = readers(sg, i)
        found = [(op, r) for op, pos in reads
                 if (r := role_of_read(sg, t, op, pos)) is not None
                 and (policy != "fc_conv" or op.type in _FC_CONV)]
        where = "" if k == 0 else f" in subgraph {k}"
        if found:
            text = "; ".join(f"{r} of {op.key} #{op.index}" for op, r in found)
            roles[name] = ParamRole(True, text + where)
        elif policy == "all_float":
            roles[name] = ParamRole(True, "all_float policy: " + _frozen_reason(sg, t, reads)
                                    + where)
        else:
            roles[name] = ParamRole(False, _frozen_reason(sg, t, reads) + where)
    return roles


def embedding_tables(model: ir.Model, param_keys: Mapping[str, ParamKey]) -> frozenset[str]:
    """The params read only as embedding tables (EMBEDDING_LOOKUP's, or a GATHER / GATHER_ND
    table with data-computed indices): each output element of their readers is one table
    element, so a reader's gradient is one row per index occurrence (Keras's IndexedSlices)."""
    out = set()
    for name, (k, i) in param_keys.items():
        sg = model.subgraphs[k]
        reads = readers(sg, i)
        if reads and all(role_of_read(sg, sg.tensors[i], op, pos) == "embedding table"
                         for op, pos in reads):
            out.add(name)
    return frozenset(out)


def shared_constants(model: ir.Model, param_keys: Mapping[str, ParamKey],
                     roles: Mapping[str, ParamRole]) -> dict[ParamKey, list[int]]:
    """Trainable params read by two or more operators: key -> reading operator indices."""
    out: dict[ParamKey, list[int]] = {}
    for name, (k, i) in param_keys.items():
        if not roles[name].trainable:
            continue
        ops = sorted({op.index for op, _ in readers(model.subgraphs[k], i)})
        if len(ops) > 1:
            out[(k, i)] = ops
    return out


def missing_biases(model: ir.Model) -> list[tuple[int, int, int]]:
    """(operator index, bias position, channels) of main-subgraph weighted operators with
    float weights and no bias.

    Only subgraph 0: the matmuls inside WHILE / IF bodies come from RNN cells, whose bias is
    an ADD of its own (a Keras LSTM's), so adding one there would train a bias twice.
    """
    sg = model.main
    out = []
    for op in sg.operators:
        pos = BIAS_POSITION.get(op.type)
        if pos is None or (len(op.inputs) > pos and op.inputs[pos] >= 0):
            continue
        w = sg.tensors[op.inputs[1]]
        y = sg.tensors[op.outputs[0]]
        if not (w.is_float and y.is_float) or y.quantization is not None:
            continue
        channels = w.shape[-1] if op.type in ("DEPTHWISE_CONV_2D", "CONV_3D") else w.shape[0]
        out.append((op.index, pos, int(channels)))
    return out


def describe_roles(roles: Mapping[str, ParamRole], shapes: Mapping[str, tuple[int, ...]]) -> str:
    """The params table ``circle-jax info`` prints: name, shape, trainable/frozen, reason."""
    lines = ["params (trainable policy):"]
    for name, role in roles.items():
        n = int(np.prod(shapes[name])) if name in shapes else 0
        state = "trainable" if role.trainable else "frozen"
        lines.append(f"  {state:9} {name} {list(shapes.get(name, ()))} ({n}): {role.reason}")
    n_train = sum(int(np.prod(shapes[k])) for k, r in roles.items() if r.trainable)
    lines.append(f"  {sum(r.trainable for r in roles.values())} trainable tensors "
                 f"({n_train} weights), {sum(not r.trainable for r in roles.values())} frozen")
    return "\n".join(lines)
