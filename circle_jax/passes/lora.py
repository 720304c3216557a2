"""LoRA: low-rank adapters beside the weighted operators, as operators of the graph.

For each targeted operator with constant float weights ``W`` (main subgraph),
:func:`add_lora` adds ``A`` (``<W name>/lora_a``: Kaiming-uniform with a = sqrt(5), i.e.
uniform in +-1/sqrt(fan_in), as in the LoRA paper's reference code and peft) and ``B``
(``<W name>/lora_b``: zeros), and rewrites ``y = op(x, W)`` as
``y = act(op(x, W) + s * op_B(op_A(x, A), B))`` with ``s = alpha / rank``:

- FULLY_CONNECTED ``W [out, in]``: ``A [R, in]`` and ``B [out, R]``, two FULLY_CONNECTED;
- CONV_2D ``W [O, kh, kw, I]``: ``A [R, kh, kw, I]`` (a convolution with the operator's
  strides, padding and dilation to R channels), then ``B [O, 1, 1, R]`` (a 1x1 one);
- BATCH_MATMUL whose second operand ``W [..., K, N]`` is constant (``[..., N, K]`` under
  ``adjoint_rhs``): ``A [..., K, R]`` (``[..., R, K]``) then ``B [..., R, N]``.

The base operator keeps its inputs and writes ``<y name>/base`` without activation; an
ADD (with the base's fused activation) writes ``y``; a MUL by ``s`` stands between when
``s != 1``. Targets: ``"all"``, ``"fc"``, ``"conv"``, ``"matmul"`` (comma-separated) or
param names / aliases of the weights (``op3.weight``); the new head's weights are never a
target (they train whole). A rank above ``min(out, fan_in)`` of a layer is refused, and so
is a model whose weights are quantized or float16 behind DEQUANTIZE, when no target has
float weights (`circle_jax.passes.head.float_weights_refusal`: dequantize it first).

:func:`merge_lora` is the inverse: each base weight becomes ``W + s * (B A)`` (computed in
float64, stored in W's dtype), the adapter operators go, and the base writes ``y`` with its
activation again: the original graph with merged weights.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from ..errors import ConfigError
from ..graph import ir
from ..graph.aliases import alias_table
from ..graph.params_policy import param_table
from .edit import add_constant, add_operator, add_tensor, record, replace_subgraph
from .head import float_weights_refusal, seeded_uniform

KINDS = {"fc": "FULLY_CONNECTED", "conv": "CONV_2D", "matmul": "BATCH_MATMUL"}
RECORD = "add_lora"
#: what a target may be, for refusals
TARGETS = "expected all, fc, conv, matmul, or a weight's name or alias from `circle-jax info`"


def _weight_pos(sg: ir.Subgraph, op: ir.Operator) -> int | None:
    """The input position of ``op``'s constant float weights, if LoRA can adapt it."""
    if op.type not in KINDS.values() or len(op.inputs) < 2:
        return None
    t = sg.tensors[op.inputs[1]] if op.inputs[1] >= 0 else None
    if t is None or not t.is_constant or not t.is_float or t.quantization is not None:
        return None
    if op.type == "BATCH_MATMUL" and (len(t.shape) < 2 or sg.tensors[op.inputs[0]].is_constant):
        return None
    return 1


def lora_targets(model: ir.Model, targets: str | Iterable[str] = "all",
                 exclude: Iterable[str] = ()) -> list[int]:
    """Indices of the main subgraph's operators that ``targets`` names (see the module
    docstring); a ConfigError names a target that names nothing, and refuses targets that
    name no target at all ("" or an empty list)."""
    sg = model.main
    items = list(targets) if isinstance(targets, Iterable) and not isinstance(targets, str) \
        else [targets]
    if not all(isinstance(item, str) for item in items):
        raise ConfigError(f"LoRA targets must be names, got {targets!r}; {TARGETS}")
    words = [w.strip() for item in items for w in item.split(",") if w.strip()]
    if not words:
        raise ConfigError(f"LoRA targets {targets!r} name nothing; {TARGETS}")
    skip = set(exclude)
    weighted = [op for op in sg.operators if _weight_pos(sg, op) is not None]
    able = [op for op in weighted if sg.tensors[op.inputs[1]].name not in skip]
    but = " but the new head, which trains whole" if len(able) < len(weighted) else ""
    if not able:
        producer = {t: op for op in sg.operators for t in op.outputs}
        for op in sg.operators:
            refusal = op.type in KINDS.values() and len(op.inputs) > 1 and op.inputs[1] >= 0 \
                and float_weights_refusal(sg, op, producer)
            if refusal:
                raise ConfigError(f"LoRA: {refusal}")
    chosen: set[int] = set()
    table = alias_table(model, param_table(model))
    names = {k: (kk, i) for k, (kk, i) in param_table(model).items() if kk == 0}
    for w in words:
        if w == "all":
            found = {op.index for op in able}
        elif w in KINDS:
            found = {op.index for op in able if op.type == KINDS[w]}
        else:
            name = table.get(w, w)
            key = names.get(name)
            found = {op.index for op in able if key is not None and op.inputs[1] == key[1]}
            if not found:
                raise ConfigError(f"LoRA target {w!r} names no weights of a FULLY_CONNECTED, "
                                  "CONV_2D or BATCH_MATMUL (use all, fc, conv, matmul, or a "
                                  "weight's name or alias from `circle-jax info`)")
        if not found:
            raise ConfigError(f"LoRA target {w!r} names nothing: the model has no such operator "
                              f"with constant float weights{but}")
        chosen |= found
    return sorted(chosen)


def kaiming_uniform(shape: tuple[int, ...], in_axis: tuple[int, ...], seed: int
                    ) -> np.ndarray:
    """Kaiming-uniform with a = sqrt(5) (torch's ``kaiming_uniform_`` as the LoRA paper's
    code and peft call it): uniform on +-1/sqrt(fan-in), the fan-in the product of the
    ``in_axis`` sizes."""
    return seeded_uniform(1 / math.sqrt(math.prod(shape[k] for k in in_axis)), shape, seed)


def _shapes(op: ir.Operator, w: ir.Tensor, rank: int
            ) -> tuple[tuple, tuple[int, ...], tuple, int]:
    """(A's shape, its fan-in axes, B's shape, the layer's rank bound)."""
    if op.type == "FULLY_CONNECTED":
        out, n_in = w.shape
        return (rank, n_in), (1,), (out, rank), min(out, n_in)
    if op.type == "CONV_2D":
        o, kh, kw, i = w.shape
        return (rank, kh, kw, i), (1, 2, 3), (o, 1, 1, rank), min(o, kh * kw * i)
    batch, last = w.shape[:-2], len(w.shape) - 1
    if op.options.adjoint_rhs:  # W [..., N, K]
        n, k = w.shape[-2:]
        return (*batch, rank, k), (last,), (*batch, rank, n), min(k, n)
    k, n = w.shape[-2:]
    return (*batch, k, rank), (last - 1,), (*batch, rank, n), min(k, n)


def add_lora(model: ir.Model, rank: int, alpha: float | None = None,
             targets: str | Iterable[str] = "all", seed: int = 0,
             exclude: Iterable[str] = ("head/weights",)) -> ir.Model:
    """``model`` with rank-``rank`` adapters on the operators ``targets`` names, scaled by
    ``alpha / rank`` (default alpha: rank); see the module docstring. The record maps each
    adapter's A and B to what it adapts."""
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or rank < 1:
        raise ConfigError(f"LoRA rank must be an integer >= 1, got {rank!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real)
                              or not 0 < alpha < math.inf):
        raise ConfigError(f"LoRA alpha must be a finite number > 0 (the adapters' scale is "
                          f"alpha / rank), got {alpha!r}")
    scale = float(rank if alpha is None else alpha) / rank
    ops = lora_targets(model, targets, exclude)
    changes: dict[str, str] = {}
    for n, j in enumerate(sorted(ops, reverse=True)):  # later first: earlier indices hold
        sg = model.main
        op = sg.operators[j]
        w, y = sg.tensors[op.inputs[1]], sg.tensors[op.outputs[0]]
        a_shape, fan, b_shape, bound = _shapes(op, w, rank)
        if rank > bound:
            raise ConfigError(f"LoRA rank {rank} exceeds the rank {bound} of {op.key} #{j} "
                              f"(weights {w.name!r} {list(w.shape)})")
        act = op.options.fused_activation_function or ir.ACT_NONE
        model, y0 = add_tensor(model, 0, f"{y.name}/base", y.shape, y.dtype)
        base_opts = dict(op.options)
        if "fused_activation_function" in base_opts:
            base_opts["fused_activation_function"] = ir.ACT_NONE
        base = replace(op, outputs=(y0, *op.outputs[1:]), options=ir.Options(base_opts))
        model = replace_subgraph(model, 0, operators=tuple(
            base if o.index == j else o for o in model.main.operators))
        model, a = add_constant(model, 0, f"{w.name}/lora_a",
                                kaiming_uniform(a_shape, fan, seed + n))
        model, b = add_constant(model, 0, f"{w.name}/lora_b", np.zeros(b_shape, np.float32))
        if op.type == "FULLY_CONNECTED":
            keep = bool(op.options.keep_num_dims)
            mid = (*y.shape[:-1], rank)
            opts_a = {"fused_activation_function": ir.ACT_NONE, "keep_num_dims": keep}
            opts_b = {"fused_activation_function": ir.ACT_NONE, "keep_num_dims": len(mid) != 2}
        elif op.type == "CONV_2D":
            mid = (*y.shape[:-1], rank)
            opts_a = {**base_opts}
            opts_b = {"padding": ir.PAD_VALID, "stride_w": 1, "stride_h": 1,
                      "dilation_w_factor": 1, "dilation_h_factor": 1,
                      "fused_activation_function": ir.ACT_NONE}
        else:
            mid = (*y.shape[:-1], rank)
            opts_a = {**base_opts}
            opts_b = {"adjoint_lhs": False, "adjoint_rhs": False}
        bias_a = bias_b = -1
        if op.type == "CONV_2D":  # LiteRT's CONV_2D needs a bias: zeros, never trained
            model, bias_a = add_constant(model, 0, f"{w.name}/lora_a_bias",
                                         np.zeros([rank], np.float32))
            model, bias_b = add_constant(model, 0, f"{w.name}/lora_b_bias",
                                         np.zeros([b_shape[0]], np.float32))
            changes[f"{w.name}/lora_a_bias"] = changes[f"{w.name}/lora_b_bias"] = "zeros, frozen"
        ins_a = (op.inputs[0], a, bias_a) if op.type != "BATCH_MATMUL" else (op.inputs[0], a)
        model, t = add_tensor(model, 0, f"{w.name}/lora_ax", mid, y.dtype)
        model, d = add_tensor(model, 0, f"{w.name}/lora_bax", y.shape, y.dtype)
        at = j + 1
        model = add_operator(model, 0, op.type, ins_a, (t,), opts_a, at=at)
        ins_b = (t, b, bias_b) if op.type != "BATCH_MATMUL" else (t, b)
        model = add_operator(model, 0, op.type, ins_b, (d,), opts_b, at=at + 1)
        at += 2
        if scale != 1.0:
            model, s = add_constant(model, 0, f"{w.name}/lora_scale", np.float32(scale))
            model, ds = add_tensor(model, 0, f"{w.name}/lora_scaled", y.shape, y.dtype)
            model = add_operator(model, 0, "MUL", (d, s), (ds,),
                                 {"fused_activation_function": ir.ACT_NONE}, at=at)
            d, at = ds, at + 1
        model = add_operator(model, 0, "ADD", (y0, d), (y.index,),
                             {"fused_activation_function": act}, at=at)
        what = f"{op.key} #{j} weights {w.name!r}, rank {rank}, scale {scale:g}"
        changes[f"{w.name}/lora_a"] = f"A {list(a_shape)} of {what}"
        changes[f"{w.name}/lora_b"] = f"B {list(b_shape)} of {what}"
    return record(model, RECORD, dict(sorted(changes.items())), "adapter: what it adapts")


def adapter_names(model: ir.Model) -> dict[str, str]:
    """Adapter param name (A and B) -> the name of the base weight it adapts."""
    return {n: base for n, base in _recorded(model).items() if n.endswith(("/lora_a",
                                                                           "/lora_b"))}


def lora_frozen(model: ir.Model) -> frozenset[str]:
    """What never trains under LoRA: the adapted base weights and the adapters' zero
    convolution biases."""
    recorded = _recorded(model)
    return frozenset(recorded.values()) | frozenset(
        n for n in recorded if n.endswith("_bias"))


def _recorded(model: ir.Model) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in model.passes:
        if r.name == "merge_lora":
            out = {}
        if r.name == RECORD:
            for name in r.changes:
                out[name] = name.rsplit("/lora_", 1)[0]
    return out


def merge_lora(model: ir.Model) -> ir.Model:
    """``model`` with every adapter of :func:`add_lora` folded into its base weights and
    its operators and tensors removed (see the module docstring)."""
    adapters = adapter_names(model)
    if not adapters:
        return model
    sg = model.main
    by_name = {t.name: t for t in sg.tensors}
    producer = {t: op for op in sg.operators for t in op.outputs}
    readers: dict[int, list[ir.Operator]] = {}
    for op in sg.operators:
        for i in op.inputs:
            readers.setdefault(i, []).append(op)
    tensors = list(sg.tensors)
    gone_ops: set[int] = set()
    added = {i for name in adapters for i in [by_name[name].index]}
    new_ops = {}
    for a_name in [n for n in adapters if n.endswith("/lora_a")]:
        a = by_name[a_name]
        b = by_name[adapters[a_name] + "/lora_b"]
        op_a = readers[a.index][0]
        op_b = readers[b.index][0]
        chain = [op_a, op_b]
        nxt = readers[op_b.outputs[0]][0]
        scale = 1.0
        if nxt.type == "MUL":
            scale = float(sg.tensors[nxt.inputs[1]].data)
            chain.append(nxt)
            nxt = readers[nxt.outputs[0]][0]
        add = nxt
        chain.append(add)
        y0 = add.inputs[0]
        base = producer[y0]
        w = sg.tensors[base.inputs[1]]
        aa, bb = np.asarray(a.data, np.float64), np.asarray(b.data, np.float64)
        if base.type == "FULLY_CONNECTED":
            delta = bb @ aa
        elif base.type == "CONV_2D":
            delta = np.einsum("or,rhwi->ohwi", bb[:, 0, 0, :], aa)
        else:
            delta = aa @ bb if not base.options.adjoint_rhs else np.swapaxes(
                np.swapaxes(aa, -1, -2) @ bb, -1, -2)
        merged = (np.asarray(w.data, np.float64) + scale * delta).astype(w.data.dtype)
        merged.flags.writeable = False
        tensors[w.index] = replace(w, data=merged)
        opts = dict(base.options)
        if "fused_activation_function" in opts:
            opts["fused_activation_function"] = add.options.fused_activation_function
        new_ops[base.index] = replace(base, outputs=(add.outputs[0], *base.outputs[1:]),
                                      options=ir.Options(opts))
        gone_ops |= {o.index for o in chain}
        added |= {y0, *(t for o in chain for t in o.inputs + o.outputs if t != add.outputs[0])}
        added.discard(op_a.inputs[0])
    ops = [new_ops.get(o.index, o) for o in sg.operators if o.index not in gone_ops]
    ops = [replace(o, index=k) for k, o in enumerate(ops)]
    first = min(i for i in added if i >= 0)
    if set(range(first, len(tensors))) != {i for i in added if i >= 0}:
        raise ValueError("merge_lora: the adapters' tensors are not the last of the table "
                         "(a pass ran after add_lora)")
    model = replace_subgraph(model, 0, tensors=tuple(tensors[:first]), operators=tuple(ops))
    merged_names = sorted({adapters[n] for n in adapters})
    return record(model, "merge_lora", {n: "W + s * (B A)" for n in merged_names},
                  "weight: merged")
