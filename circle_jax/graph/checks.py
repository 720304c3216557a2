"""Whole-graph validation at load, before anything is traced: every operator's input count
against its kernel's signature, every tensor read after it is computed (operators run in
file order), every subgraph an operator calls exists and calls do not recurse, every
tensor's quantization parameters are well formed and every quantized tensor meets a kernel
that computes on it.

Each check returns refusals as one-line strings;
:class:`~circle_jax.lowering.interpreter.Lowered` gathers them with the operators' own option
checks into the single load-time error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from . import ir
from .variables import check_variables, may_have_no_output


@cache
def arity(fn: Callable[..., Any]) -> tuple[int, float]:
    """(required, maximum) count of operator inputs ``fn(ctx, *inputs)`` accepts."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # after ctx
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    most = float("inf") if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    return required, most


def check_arity(op: ir.Operator, fn: Callable[..., Any]) -> None:
    """ValueError when ``op`` gives its kernel fewer or more inputs than it takes."""
    required, most = arity(fn)
    n = len(op.inputs)
    if n < required or n > most:
        takes = f"{required}" if required == most else (
            f"{required} or more" if most == float("inf") else f"{required} to {int(most)}")
        raise ValueError(f"has {n} inputs; {op.key} takes {takes}")


def _subgraph_refs(op: ir.Operator) -> list[tuple[str, int]]:
    return [(k, int(v)) for k, v in op.options.items()
            if k.endswith("subgraph_index") and isinstance(v, (int, float))]


def check_graph(model: ir.Model) -> list[str]:
    """One line per refusal: reads before writes, operators without outputs (but those whose
    effect is on variables, and Flex ones: `circle_jax.graph.variables`), unknown or
    recursive subgraph calls, inputs and outputs of unknown type, variables used
    inconsistently across subgraphs (they share them)."""
    refusals: list[str] = []
    n = len(model.subgraphs)
    calls: dict[int, set[int]] = {}
    for sg in model.subgraphs:
        known = set(sg.inputs)
        known.update(t.index for t in sg.tensors if t.data is not None or t.is_variable)
        calls[sg.index] = set()
        for op in sg.operators:
            where = (f"subgraph {sg.index} " if len(model.subgraphs) > 1 else "") \
                + f"operator {op.index} ({op.key})"
            if not any(i >= 0 for i in op.outputs) and not may_have_no_output(op):
                refusals.append(f"{where} has no output (expected at least one)")
            late = [i for i in op.inputs if i >= 0 and i not in known]
            if late:
                name = sg.tensors[late[0]].name[:60]
                refusals.append(f"{where} reads tensor {late[0]} {name!r} before any operator "
                                "computes it (operators must be in execution order)")
            known.update(i for i in op.outputs if i >= 0)
            for field, k in _subgraph_refs(op):
                if not 0 <= k < n:
                    refusals.append(f"{where}: {field} {k} is out of range "
                                    f"(the model has {n} subgraphs)")
                else:
                    calls[sg.index].add(k)
        for i in (*sg.inputs, *sg.outputs):
            if sg.tensors[i].dtype.startswith("unknown"):
                refusals.append(f"subgraph {sg.index} input/output tensor {i} has an unknown "
                                f"type ({sg.tensors[i].dtype}); expected a TensorType")
        missing = [i for i in sg.outputs if i not in known]
        if missing:
            refusals.append(f"subgraph {sg.index} output tensor {missing[0]} is never computed")
    refusals += check_variables(model)
    cycle = _recursion(calls)
    if cycle:
        refusals.append("subgraphs call each other in a cycle "
                        + " -> ".join(map(str, cycle)) + " (recursion has no end)")
    return refusals


def _recursion(calls: dict[int, set[int]]) -> list[int] | None:
    state: dict[int, int] = {}
    path: list[int] = []

    def visit(k: int) -> list[int] | None:
        state[k] = 1
        path.append(k)
        for j in sorted(calls.get(k, ())):
            if state.get(j) == 1:
                return path[path.index(j):] + [j]
            if j not in state and (found := visit(j)):
                return found
        path.pop()
        state[k] = 2
        return None

    for k in sorted(calls):
        if k not in state and (found := visit(k)):
            return found
    return None


# ----------------------------------------------------------------------------- quantization

#: Integer types that may carry affine quantization, and their value ranges.
_QUANT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                 "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 31), (1 << 31) - 1),
                 "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1)}
#: Types quantized only as weights (constants), never as activations.
WEIGHT_ONLY_TYPES = frozenset(ir.PACKED_BITS)
#: (operator, input position) pairs where a quantized int32/int64 tensor is a bias.
BIAS_INPUTS = {("CONV_2D", 2), ("DEPTHWISE_CONV_2D", 2), ("FULLY_CONNECTED", 2),
               ("TRANSPOSE_CONV", 3)}
#: Operators that only move or select stored values: exact on quantized integers as they
#: are, as LiteRT computes them (no integer kernel needed; REDUCE_MAX/MIN refuse differing
#: input and output parameters themselves).
DATA_MOVEMENT = frozenset({
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "STRIDED_SLICE", "SLICE", "GATHER",
    "GATHER_ND", "SPLIT", "SPLIT_V", "UNPACK", "PACK", "TILE", "BROADCAST_TO",
    "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "BATCH_TO_SPACE_ND", "REVERSE_V2", "SHAPE",
    "REDUCE_MAX", "REDUCE_MIN",
})


def tensor_quantization_refusals(sg: ir.Subgraph, t: ir.Tensor) -> tuple[list[str], list[str]]:
    """(malformed, unsupported) one-line refusals of one tensor's quantization parameters:
    scales positive and finite, one zero point per scale inside the type's range, a per-axis
    count equal to the quantized dimension's size, blockwise details that fit the tensor
    (:func:`blockwise_refusals`); sub-byte types (:data:`WEIGHT_ONLY_TYPES`) only on
    constants, details other than blockwise unsupported."""
    q = t.quantization
    if q is None:
        return [], []
    where = f"subgraph {sg.index} tensor {t.index} {t.name[:60]!r} ({t.dtype})"
    if q.other_details:
        return [], [f"{where}: {q.other_details} quantization details are not supported "
                    "(affine per-tensor, per-channel or blockwise quantization)"]
    if t.dtype not in _QUANT_RANGES:
        if t.is_float:
            return [], []  # a converter's leftover range on a float tensor: unused
        return [], [f"{where}: quantized {t.dtype} tensors are not supported "
                    "(int8, uint8, int16 activations; int32/int64 biases; int4/uint4/int2 "
                    "weights)"]
    if t.dtype in WEIGHT_ONLY_TYPES and not t.is_constant:
        return [], [f"{where}: quantized {t.dtype} activations are not supported ({t.dtype} "
                    "only as a constant weight, as LiteRT's kernels take it)"]
    if q.blockwise is not None:
        return blockwise_refusals(sg, t, where), []
    bad = []
    scale = np.asarray(q.scale, np.float64)
    if len(q.zero_point) != len(q.scale):
        bad.append(f"{where}: {len(q.scale)} scales but {len(q.zero_point)} zero points "
                   "(expected one per scale)")
    if not np.all(np.isfinite(scale) & (scale > 0)):
        worst = next(float(s) for s in scale if not (np.isfinite(s) and s > 0))
        bad.append(f"{where}: quantization scale {worst} (expected finite and > 0)")
    lo, hi = _QUANT_RANGES[t.dtype]
    out = [z for z in q.zero_point if not lo <= z <= hi]
    if out:
        bad.append(f"{where}: zero point {out[0]} is outside {t.dtype}'s range [{lo}, {hi}]")
    if len(q.scale) > 1:
        dim = q.quantized_dimension
        if not 0 <= dim < len(t.shape):
            bad.append(f"{where}: quantized_dimension {dim} is outside the tensor's "
                       f"{len(t.shape)} dimensions")
        elif t.shape[dim] != len(q.scale):
            bad.append(f"{where}: {len(q.scale)} per-channel scales for dimension {dim} of "
                       f"size {t.shape[dim]} (expected one per index)")
    return bad, []


def blockwise_refusals(sg: ir.Subgraph, t: ir.Tensor, where: str) -> list[str]:
    """Malformed blockwise details of constant ``t``: a block size > 0 dividing the last
    dimension, and a float16 or float32 constant scales tensor of the tensor's shape with the
    last dimension divided by it, finite and > 0; zero points absent (-1)."""
    b = t.quantization.blockwise
    n = len(sg.tensors)
    if not t.shape or b.block_size <= 0 or t.shape[-1] % b.block_size:
        return [f"{where}: blockwise block size {b.block_size} does not divide the last "
                f"dimension of shape {list(t.shape)} (expected a divisor > 0)"]
    if not 0 <= b.scales < n:
        return [f"{where}: blockwise scales tensor {b.scales} is out of range (expected "
                f"0..{n - 1})"]
    s = sg.tensors[b.scales]
    want = (*t.shape[:-1], t.shape[-1] // b.block_size)
    if s.data is None or s.dtype not in ("float16", "float32") or s.shape != want:
        return [f"{where}: blockwise scales tensor {b.scales} {s.name[:40]!r} is a "
                f"{'constant' if s.data is not None else 'computed'} {s.dtype}{list(s.shape)}"
                f" (expected a float16 constant of shape {list(want)})"]
    if not np.all(np.isfinite(s.data) & (s.data > 0)):
        return [f"{where}: blockwise scales tensor {b.scales} holds a scale that is not "
                "finite and > 0"]
    if b.zero_points != -1:
        return [f"{where}: blockwise zero points (tensor {b.zero_points}) are not supported "
                "(symmetric blocks, as ai-edge-quantizer writes and LiteRT runs)"]
    return []


def check_tensor_quantization(model: ir.Model) -> tuple[list[str], list[str]]:
    """(malformed, unsupported) refusals of every tensor's quantization parameters
    (:func:`tensor_quantization_refusals`): what must hold before a pass reads them."""
    bad: list[str] = []
    unsupported: list[str] = []
    for sg in model.subgraphs:
        for t in sg.tensors:
            b, u = tensor_quantization_refusals(sg, t)
            bad += b
            unsupported += u
    return bad, unsupported


#: Operators that read only their input's shape, whatever its values stand for.
SHAPE_READERS = frozenset({"SHAPE", "RANK"})


def check_quantization(
    model: ir.Model, runs_integer: Callable[[str, tuple, tuple], bool],
) -> tuple[list[str], list[str], set[tuple[int, int]]]:
    """(malformed, unsupported) refusals of a model's quantization: every tensor's parameters
    (:func:`tensor_quantization_refusals`), quantized int32/int64 tensors anywhere but a
    bias, and operators reading or writing quantized int8/uint8/int16 tensors that have no
    integer kernel for them (``runs_integer``) and do not merely move values
    (:data:`DATA_MOVEMENT`; QUANTIZE and DEQUANTIZE convert): among them the hybrid
    (dynamic-range) operators, int8 weights with float activations. The third value holds
    the (subgraph, operator) pairs refused, whose own checks need not run."""
    bad, unsupported = check_tensor_quantization(model)
    refused: set[tuple[int, int]] = set()
    for sg in model.subgraphs:
        for op in sg.operators:
            ins = tuple(sg.tensors[i] if i >= 0 else None for i in op.inputs)
            outs = tuple(sg.tensors[i] for i in op.outputs if i >= 0)
            where = (f"subgraph {sg.index} " if len(model.subgraphs) > 1 else "") \
                + f"operator {op.index} ({op.key})"
            for pos, t in enumerate(ins):
                if t is not None and t.quantization is not None and t.dtype in (
                        "int32", "int64") and (op.key, pos) not in BIAS_INPUTS:
                    unsupported.append(f"{where}: quantized {t.dtype} tensor {t.name[:60]!r} "
                                       "is only supported as a bias")
            quantized = [t for t in (*ins, *outs) if t is not None and t.quantization
                         is not None and t.dtype in ("int8", "uint8", "int16")]
            if not quantized or op.key in ("QUANTIZE", "DEQUANTIZE") or op.key in SHAPE_READERS:
                continue
            if runs_integer(op.key, ins, outs):
                continue
            if op.key in DATA_MOVEMENT and outs and ins and ins[0] is not None \
                    and outs[0].dtype == ins[0].dtype:
                continue
            t = quantized[0]
            kind = ("hybrid: float activations; load with dequantize=True"
                    if any(o.is_float for o in outs) else "no integer kernel")
            unsupported.append(f"{where} on quantized {t.dtype} tensor {t.name[:40]!r} is not "
                               f"supported ({kind})")
            refused.add((sg.index, op.index))
    return bad, unsupported, refused
