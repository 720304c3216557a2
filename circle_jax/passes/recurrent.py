"""LSTM layers as their time steps: each UNIDIRECTIONAL_SEQUENCE_LSTM of subgraph 0 of the
plain form unrolled into the builtin operators of its cell, step by step.

The plain form: float, one output, an input gate (no CIFG), no peepholes, no layer
normalization, no projection, full recurrent weights, the cell activation TANH, RELU,
RELU6 or none. Other forms stay as they are. For time step ``t`` (gate order input,
forget, cell, output; ``W`` the input weights, ``R`` the recurrent ones, ``b`` the biases):

    z_k = FULLY_CONNECTED(x_t, W_k, b_k) + FULLY_CONNECTED(h, R_k)
    i, f, o = LOGISTIC(z_i), LOGISTIC(z_f), LOGISTIC(z_o);  g = act(z_c)
    c = f * c + i * g   (then MINIMUM(MAXIMUM(c, -cell_clip), cell_clip) when clipped)
    h = o * act(c)

``x_t`` comes from a SPLIT of the sequence along its time axis and a SQUEEZE; the output
is the CONCATENATION of each ``h`` given its time axis back (EXPAND_DIMS), so every
operator follows the batch. The state starts from the state tensors' buffers (the values
`circle_jax.ops.recurrent` starts from); a state that starts at zero drops its first
step's recurrent terms. The weights stay the tensors they were (each read by every time
step, so a gradient sums over the steps). The clip's gradient at exactly the bound goes
through (MAXIMUM's tie rule) where `circle_jax.ops.common.clip_tf`'s is 0: a difference
of measure zero. Used by the exported training step, whose backward rules cover these
operators.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..formats.schema import OPERATOR_CODES
from ..graph import ir
from .edit import record, replace_subgraph

LSTM = "UNIDIRECTIONAL_SEQUENCE_LSTM"
_ACTIVATIONS = {ir.ACT_NONE: None, ir.ACT_RELU: "RELU", ir.ACT_RELU6: "RELU6",
                ir.ACT_TANH: "TANH"}
# input positions (TFLite's numbering): input and recurrent weights, biases, state
_W, _R, _B, _H0, _C0 = range(1, 5), range(5, 9), range(12, 16), 18, 19
_UNUSED = (9, 10, 11, 16, 17, 20, 21, 22, 23)  # peepholes, projection, layer norm


def unroll_lstms(model: ir.Model) -> ir.Model:
    """``model`` with subgraph 0's plain LSTM layers unrolled (see the module docstring)."""
    main = model.main
    b = _Builder(list(main.tensors))
    unrolled = {}
    for op in main.operators:
        if not _plain(main, op):
            b.ops.append(replace(op, index=len(b.ops)))
            continue
        steps = _unroll(b, main, op)
        unrolled[f"operator {op.index}"] = f"{steps} time steps"
    if not unrolled:
        return record(model, "unroll_lstms", {})
    model = replace_subgraph(model, 0, tensors=tuple(b.tensors), operators=tuple(b.ops))
    return record(model, "unroll_lstms", unrolled)


def _plain(sg: ir.Subgraph, op: ir.Operator) -> bool:
    if op.type != LSTM or len(op.outputs) != 1:
        return False
    ins = list(op.inputs) + [-1] * (24 - len(op.inputs))
    o = op.options
    present = [ins[p] >= 0 for p in (*_W, *_R, *_B)]
    return all(present) and all(ins[p] < 0 for p in _UNUSED) and \
        o.fused_activation_function in _ACTIVATIONS and not o.diagonal_recurrent_tensors \
        and all(sg.tensors[i].dtype == "float32" for i in ins if i >= 0)


class _Builder:
    """Tensors and operators of the rewritten subgraph, appended in order."""

    def __init__(self, tensors: list[ir.Tensor]) -> None:
        self.tensors, self.ops = tensors, []

    def tensor(self, name: str, shape: tuple[int, ...], data: np.ndarray | None = None) -> int:
        self.tensors.append(ir.Tensor(len(self.tensors), name, shape, str(
            "float32" if data is None else data.dtype.name),
            0 if data is None else ir.NEW_BUFFER, data))
        return len(self.tensors) - 1

    def const(self, name: str, value: Any, dtype: str = "float32") -> int:
        data = np.array(value, dtype)
        data.flags.writeable = False
        return self.tensor(name, data.shape, data)

    def op(self, op_type: str, inputs: list[int], name: str, shape: tuple[int, ...],
           outputs: int = 1, **options: Any) -> list[int]:
        outs = [self.tensor(f"{name}:{k}" if outputs > 1 else name, shape)
                for k in range(outputs)]
        self.ops.append(ir.Operator(len(self.ops), op_type, OPERATOR_CODES[op_type],
                                    tuple(inputs), tuple(outs), ir.Options(options)))
        return outs

    def binary(self, op_type: str, a: int, c: int, name: str) -> int:
        return self.op(op_type, [a, c], name, self.tensors[a].shape)[0]

    def unary(self, op_type: str | None, a: int, name: str) -> int:
        return a if op_type is None else self.op(op_type, [a], name, self.tensors[a].shape)[0]


def _unroll(b: _Builder, sg: ir.Subgraph, op: ir.Operator) -> int:
    """Append ``op``'s time steps to ``b``; their number."""
    ins = list(op.inputs) + [-1] * (24 - len(op.inputs))
    o = op.options
    x, y = sg.tensors[ins[0]], sg.tensors[op.outputs[0]]
    axis = 0 if o.time_major else 1
    steps = x.shape[axis]
    n_cell = sg.tensors[ins[_W[0]]].shape[0]
    batch = x.shape[1 - axis]
    act = _ACTIVATIONS[o.fused_activation_function]
    name = f"{y.name}/unrolled"
    slot = (batch, n_cell)
    parts = b.op("SPLIT", [b.const(f"{name}/axis", axis, "int32"), x.index], f"{name}/x",
                 tuple(1 if d == axis else n for d, n in enumerate(x.shape)), outputs=steps,
                 num_splits=steps)
    h, c = (_start(b, sg, ins[k], f"{name}/{s}0", slot) for k, s in ((_H0, "h"), (_C0, "c")))
    outs = []
    for t, part in enumerate(parts):
        at = f"{name}/t{t}"
        x_t = b.op("SQUEEZE", [part], f"{at}/x", (batch, x.shape[2]), squeeze_dims=(axis,))[0]
        z = []
        for k, gate in enumerate("ifco"):
            zk = b.op("FULLY_CONNECTED", [x_t, ins[_W[k]], ins[_B[k]]], f"{at}/{gate}x", slot,
                      fused_activation_function=ir.ACT_NONE, weights_format=0,
                      keep_num_dims=False)[0]
            if h is not None:
                zh = b.op("FULLY_CONNECTED", [h, ins[_R[k]], -1], f"{at}/{gate}h", slot,
                          fused_activation_function=ir.ACT_NONE, weights_format=0,
                          keep_num_dims=False)[0]
                zk = b.binary("ADD", zk, zh, f"{at}/{gate}z")
            z.append(zk)
        i, f, g, og = (b.unary("LOGISTIC", z[0], f"{at}/i"), b.unary("LOGISTIC", z[1], f"{at}/f"),
                       b.unary(act, z[2], f"{at}/g"), b.unary("LOGISTIC", z[3], f"{at}/o"))
        new_c = b.binary("MUL", i, g, f"{at}/ig")
        if c is not None:
            new_c = b.binary("ADD", b.binary("MUL", f, c, f"{at}/fc"), new_c, f"{at}/c_sum")
        if o.cell_clip and o.cell_clip > 0:
            lo = b.const(f"{at}/clip_lo", -float(o.cell_clip))
            hi = b.const(f"{at}/clip_hi", float(o.cell_clip))
            new_c = b.binary("MINIMUM", b.binary("MAXIMUM", new_c, lo, f"{at}/c_lo"), hi,
                             f"{at}/c_clip")
        c = new_c
        h = b.binary("MUL", og, b.unary(act, c, f"{at}/act_c"), f"{at}/h")
        outs.append(b.op("EXPAND_DIMS", [h, b.const(f"{at}/axis", axis, "int32")],
                         f"{at}/y", (1, batch, n_cell) if axis == 0 else (batch, 1, n_cell))[0])
    b.ops.append(ir.Operator(len(b.ops), "CONCATENATION", OPERATOR_CODES["CONCATENATION"],
                             tuple(outs), (y.index,),
                             ir.Options({"axis": axis, "fused_activation_function": 0})))
    return steps


def _start(b: _Builder, sg: ir.Subgraph, i: int, name: str, shape: tuple[int, ...]
           ) -> int | None:
    """The state's starting value as a constant (its buffer), or None when it is zero."""
    data = sg.tensors[i].data if i >= 0 else None
    if data is None or not np.any(data):
        return None
    return b.const(name, np.broadcast_to(data, shape) if data.size == 1 else data)
