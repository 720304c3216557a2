"""Dequantize: a quantized model becomes the float32 model its integers stand for.

The rule (:func:`dequantize_model`), in every subgraph:

- every affine-quantized tensor (int8, uint8, int16 activations and weights; int32/int64
  biases: any integer tensor with a scale) becomes float32 without quantization parameters.
  A constant's data becomes ``scale * (q - zero_point)`` (float64, rounded once to float32),
  with one (scale, zero point) for the whole tensor or one per index of its
  ``quantized_dimension`` (per channel); a graph input, output or computed tensor becomes a
  float32 tensor of the same shape that holds the real value its integers stood for;
- a float16 constant read only by DEQUANTIZE operators becomes float32 (its values exactly);
- QUANTIZE and DEQUANTIZE operators, float32 to float32 now, are identities and are removed:
  their readers read the operator's input instead, or, when its output is a subgraph output,
  the operator that computes its input writes that output instead (names of inputs and
  outputs are kept). One between a subgraph input and a subgraph output (nothing computes
  its input) is kept as a float32 DEQUANTIZE, an identity circle-jax runs.

Tensor indices do not change (a removed identity's output stays, unread). Integer tensors
without quantization parameters (shapes, indices) and float tensors are left as they are.
The record maps each changed tensor to its former type and quantization (``int8 per-channel
16@0``: 16 scales along dimension 0) and each removed operator to ``removed``.

:func:`requantize_weights` is the inverse for weight-only quantized models (int8, int4,
int2 weights, per channel or blockwise, of hybrid operators or read by DEQUANTIZE; float16
weights): it writes float32 weights back in the layout the source model had, so a model
trained in float exports as the file it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from ..formats.schema import OPERATOR_CODES
from ..graph import ir
from ..graph.quantization import QParams, dequantize, quantize
from .edit import add_operator, add_tensor, record, replace_subgraph

#: Integer types whose tensors carry affine quantization (as `circle_jax.graph.checks`
#: accepts them).
QUANTIZED_TYPES = frozenset({"int8", "uint8", "int16", "int32", "int64", "int4", "uint4",
                             "int2"})
_CONVERSIONS = frozenset({"QUANTIZE", "DEQUANTIZE"})


def is_quantized(t: ir.Tensor) -> bool:
    """Whether ``t`` is an affine-quantized integer tensor."""
    q = t.quantization
    return t.dtype in QUANTIZED_TYPES and q is not None \
        and (len(q.scale) > 0 or q.blockwise is not None)


def describe_quantization(t: ir.Tensor) -> str:
    """``int8 per-tensor s=0.0039 zp=-128`` or ``int8 per-channel 16@0`` (16 scales along
    dimension 0); just the dtype for a tensor without parameters."""
    q = t.quantization
    if q is not None and q.blockwise is not None:
        return f"{t.dtype} blockwise {q.blockwise.block_size}"
    if q is None or not q.scale:
        return t.dtype
    if len(q.scale) == 1:
        return f"{t.dtype} per-tensor s={q.scale[0]:.4g} zp={q.zero_point[0]}"
    return f"{t.dtype} per-channel {len(q.scale)}@{q.quantized_dimension}"


def dequantized_values(t: ir.Tensor, sg: ir.Subgraph | None = None) -> np.ndarray:
    """A quantized constant's real values, ``scale * (q - zero_point)``, as float32; a
    blockwise one's (:class:`~circle_jax.graph.ir.Blockwise`) ``scale * q`` with each
    block's scale from its scales tensor in subgraph ``sg``."""
    q = t.quantization
    assert q is not None and t.data is not None
    if q.blockwise is not None:
        assert sg is not None, "a blockwise tensor's scales are in its subgraph"
        scales = sg.tensors[q.blockwise.scales].data.astype(np.float64)
        per_value = np.repeat(scales, q.blockwise.block_size, axis=-1)
        return (t.data.astype(np.float64) * per_value).astype(np.float32)
    return dequantize(t.data, q.scale, q.zero_point, q.quantized_dimension).astype(np.float32)


def _read_by_dequantize(sg: ir.Subgraph) -> set[int]:
    """Constants every reader of which is a DEQUANTIZE (weight-only files' weights)."""
    readers: dict[int, set[str]] = {}
    for op in sg.operators:
        for i in op.inputs:
            if i >= 0:
                readers.setdefault(i, set()).add(op.type)
    return {t.index for t in sg.tensors if t.is_constant
            and readers.get(t.index) == {"DEQUANTIZE"}}


def _float16_weights(sg: ir.Subgraph) -> set[int]:
    """Float16 constants every reader of which is a DEQUANTIZE."""
    return {i for i in _read_by_dequantize(sg) if sg.tensors[i].dtype == "float16"}


def weight_only(model: ir.Model) -> bool:
    """Whether the model's only quantized tensors are constants (dynamic-range int8 weights,
    float16 weights read by DEQUANTIZE) and there is at least one: the models `circle_jax.load`
    dequantizes by default, since its float activations leave no integer model to run."""
    found = False
    for sg in model.subgraphs:
        for t in sg.tensors:
            if is_quantized(t):
                if not t.is_constant:
                    return False
                found = True
        found |= bool(_float16_weights(sg))
    return found


def dequantize_model(model: ir.Model, keep_hybrid: bool = False) -> ir.Model:
    """``model`` with every quantized tensor float32 and the identities removed (see the
    module docstring); the record maps each change to what it was. ``keep_hybrid``: the
    weights of hybrid operators (:func:`hybrid_weights`) keep their quantization parameters,
    so those operators compute as LiteRT's hybrid kernels (`circle_jax.ops.hybrid`)."""
    changes: dict[str, str] = {}
    for sg in model.subgraphs:
        half = _float16_weights(sg)
        hybrid = hybrid_weights(sg) if keep_hybrid else set()
        tensors = []
        for t in sg.tensors:
            if is_quantized(t) or t.index in half:
                data = None if t.data is None else (
                    t.data.astype(np.float32) if t.index in half else dequantized_values(t, sg))
                if data is not None:
                    data.flags.writeable = False
                changes[_where(model, sg, t.name)] = describe_quantization(t) + (
                    " (hybrid)" if t.index in hybrid else "")
                t = replace(t, dtype="float32", data=data,
                            quantization=t.quantization if t.index in hybrid else None)
            tensors.append(t)
        sg = replace(sg, tensors=tuple(tensors))
        operators, removed = _without_identities(sg)
        changes.update({_where(model, sg, f"operator {op.index} {op.type}"): "removed"
                        for op in removed})
        model = replace_subgraph(model, sg.index, tensors=sg.tensors, operators=operators)
    return record(model, "dequantize", changes, "tensor: was; operator: removed")


#: (operator, weight input position) of the operators LiteRT runs hybrid.
_HYBRID_WEIGHTS = {("FULLY_CONNECTED", 1), ("CONV_2D", 1), ("DEPTHWISE_CONV_2D", 1)}


def hybrid_weights(sg: ir.Subgraph) -> set[int]:
    """The quantized constants of ``sg`` read only as the weight of a hybrid operator: an
    affine (per tensor or per channel) one as the weight of a FULLY_CONNECTED, CONV_2D or
    DEPTHWISE_CONV_2D with a float input, or as the int8 right operand of a BATCH_MATMUL
    with a float left one (LiteRT refuses an int4 one; circle-jax computes it in float); a
    blockwise 2-d one as the weight of a FULLY_CONNECTED with a float input (LiteRT's only
    blockwise hybrid kernel)."""
    uses: dict[int, bool] = {}
    for op in sg.operators:
        float_input = bool(op.inputs) and op.inputs[0] >= 0 and sg.tensors[op.inputs[0]].is_float
        for pos, i in enumerate(op.inputs):
            if i >= 0:
                t = sg.tensors[i]
                if t.quantization is not None and t.quantization.blockwise is not None:
                    hybrid = float_input and (op.key, pos) == ("FULLY_CONNECTED", 1) \
                        and len(t.shape or ()) == 2
                else:
                    hybrid = float_input and ((op.key, pos) in _HYBRID_WEIGHTS or (
                        (op.key, pos) == ("BATCH_MATMUL", 1) and t.dtype == "int8"))
                uses[i] = uses.get(i, True) and hybrid
    return {i for i, only in uses.items() if only and is_quantized(t := sg.tensors[i])
            and t.is_constant}


def _where(model: ir.Model, sg: ir.Subgraph, what: str) -> str:
    return f"subgraph {sg.index} {what}" if len(model.subgraphs) > 1 else what


def _without_identities(sg: ir.Subgraph) -> tuple[tuple[ir.Operator, ...], list[ir.Operator]]:
    """(operators with the float-to-float QUANTIZE/DEQUANTIZE removed, those removed)."""
    produced = {i for op in sg.operators for i in op.outputs}
    ends = set(sg.inputs) | set(sg.outputs)
    alias: dict[int, int] = {}  # readers of key read value instead
    rename: dict[int, int] = {}  # key is written and read as value everywhere
    kept, removed = [], []
    for op in sg.operators:
        op = replace(op, inputs=tuple(alias.get(i, i) for i in op.inputs))
        x, y = (op.inputs[0], op.outputs[0]) if op.inputs and op.outputs else (-1, -1)
        if op.type not in _CONVERSIONS or x < 0 or sg.tensors[x].dtype != "float32" \
                or sg.tensors[y].dtype != "float32":
            kept.append(op)
        elif y not in sg.outputs:
            alias[y] = x
            removed.append(op)
        elif x in produced and x not in ends and x not in rename:
            rename[x] = y
            removed.append(op)
        else:
            kept.append(replace(op, type="DEQUANTIZE", code=OPERATOR_CODES["DEQUANTIZE"]))

    def name(i: int) -> int:
        return rename.get(i, i)

    return tuple(replace(op, index=j, inputs=tuple(map(name, op.inputs)),
                         outputs=tuple(map(name, op.outputs)))
                 for j, op in enumerate(kept)), removed


# ------------------------------------------------------------------------------ inverse

def requantize_weights(model: ir.Model, source: ir.Model,
                       copies: Mapping[str, str] | None = None) -> ir.Model:
    """``model`` (float32, from ``dequantize_model(source)`` and maybe later passes) with every
    weight that was quantized or float16 in ``source`` written back in that layout: a weight
    still equal to its dequantized source is the source tensor again, bit for bit; a changed
    one is requantized into its own type by :func:`requantized_weight` (the rule
    ai-edge-quantizer writes: symmetric, per tensor, per channel or per block); a changed
    float16 weight is rounded to float16. Weights the source read through a DEQUANTIZE
    (weight-only files: float16, int8, int4 constants) are read through it again, the
    source's operator and output tensor; weights of hybrid operators are read directly, as
    in the source. ``copies`` maps tensors a later pass copied from a source weight (untied
    copies: ``copy name -> source name``) to it; they get the source's layout (a copy of a
    blockwise weight a scales tensor of its own)."""
    copies = dict(copies or {})
    changes: dict[str, str] = {}
    for k, (sg, before) in enumerate(zip(model.subgraphs, source.subgraphs)):
        by_name = {t.name: t for t in before.tensors}
        half = _float16_weights(before)
        through = {i for i in _read_by_dequantize(before)
                   if i in half or is_quantized(before.tensors[i])}
        dq_out = {op.inputs[0]: op for op in before.operators if op.type == "DEQUANTIZE"
                  and op.inputs and op.inputs[0] in through}
        tensors = list(sg.tensors)
        dequantized: list[tuple[int, ir.Operator | None]] = []
        scales: list[tuple[int, np.ndarray]] = []
        for t in sg.tensors:
            was = by_name.get(copies.get(t.name, t.name))
            if not t.is_constant or t.dtype != "float32" or was is None or not (
                    is_quantized(was) and was.is_constant or was.index in half):
                continue
            unchanged = np.array_equal(
                t.data, was.data.astype(np.float32) if was.index in half
                else dequantized_values(was, before))
            if unchanged:
                new = replace(t, dtype=was.dtype, data=was.data, quantization=was.quantization)
            elif was.index in half:
                data = t.data.astype(np.float16)
                data.flags.writeable = False
                new = replace(t, dtype="float16", data=data, quantization=None)
            else:
                new, block_scales = requantized_weight(t, was, before)
                if block_scales is not None:
                    scales.append((t.index, block_scales))
            tensors[t.index] = new
            changes[_where(model, sg, t.name)] = describe_quantization(new) + (
                "" if unchanged else " (requantized)")
            if was.index in through:
                ref = dq_out.get(was.index) if t.name == was.name else None
                dequantized.append((t.index, ref))
        model = replace_subgraph(model, k, tensors=tuple(tensors))
        for i, values in scales:
            model = _with_block_scales(model, k, i, values)
        dequantized.sort(key=lambda e: (e[1] is None, e[1].index if e[1] else 0, e[0]))
        for i, ref in dequantized:
            model = _read_through_dequantize(model, k, i, ref)
    return record(model, "requantize_weights", changes, "tensor: written as")


def integer_range(dtype: str) -> tuple[int, int]:
    """(qmin, qmax) ai-edge-quantizer's symmetric weights of signed ``dtype`` take: the
    narrow range ``[-qmax, qmax]`` for 8 bits and more (int8: -127..127), the type's whole
    range below (int4: -8..7, int2: -2..1); ``qmax = 2**(bits - 1) - 1`` sets the scale."""
    bits = ir.PACKED_BITS.get(dtype) or np.iinfo(dtype).bits
    qmax = 2 ** (bits - 1) - 1
    return (-qmax if bits >= 8 else -qmax - 1), qmax


def requantized_weight(t: ir.Tensor, was: ir.Tensor,
                       source: ir.Subgraph) -> tuple[ir.Tensor, np.ndarray | None]:
    """(float32 constant ``t`` quantized in the layout of tensor ``was`` of subgraph
    ``source``, the new float16 block scales when ``was`` is blockwise, else None):
    symmetric with zero point 0 in ``was``'s signed type (an unsigned one's weights become
    int8), as ai-edge-quantizer writes them (:func:`integer_range`): per tensor or per
    index of the source's quantized dimension ``scale = max|w| / qmax`` in float32; per
    block of ``block_size`` values along the last axis ``scale = max|w_block| / qmax``
    rounded to bfloat16's 8 significant bits, stored as float16 (exactly); then
    ``q = clip(round(w / scale), qmin, qmax)`` (`circle_jax.graph.quantization.quantize`'s
    rule, ties away from zero). An all-zero channel or block keeps its source scale (its
    integers are 0)."""
    import ml_dtypes

    q = was.quantization
    assert q is not None
    dtype = "int8" if was.dtype.startswith("u") else was.dtype
    qmin, qmax = integer_range(dtype)
    w = np.asarray(t.data, np.float32)
    if q.blockwise is not None:
        b = q.blockwise.block_size
        blocks = w.reshape(*w.shape[:-1], w.shape[-1] // b, b)
        old = source.tensors[q.blockwise.scales].data.astype(np.float32)
        peak = np.max(np.abs(blocks), axis=-1)
        scale = np.where(peak > 0, (peak / np.float32(qmax)).astype(ml_dtypes.bfloat16)
                         .astype(np.float32), old).astype(np.float16)
        per_value = np.repeat(scale.astype(np.float32), b, axis=-1)
        data = quantize(w, per_value, 0, qmin, qmax).astype(np.int8)
        data = data.astype(ir.as_numpy_dtype(dtype))
        data.flags.writeable = False
        scale.flags.writeable = False
        return replace(t, dtype=dtype, data=data, quantization=q), scale
    axis = q.quantized_dimension if len(q.scale) > 1 else None
    other = tuple(d for d in range(w.ndim) if d != axis)
    peak = np.max(np.abs(w), axis=other, keepdims=True) if w.size else np.zeros(1, np.float32)
    old = np.asarray(q.scale, np.float32).reshape(peak.shape if axis is not None else ())
    scale = np.where(peak > 0, peak / np.float32(qmax), old)
    data = quantize(w, scale, 0, qmin, qmax).astype(np.int8).astype(ir.as_numpy_dtype(dtype))
    data.flags.writeable = False
    written = QParams(dtype, tuple(scale.reshape(-1).tolist()), 0, q.quantized_dimension)
    return replace(t, dtype=dtype, data=data, quantization=written.quantization()), None


def _with_block_scales(model: ir.Model, k: int, i: int, values: np.ndarray) -> ir.Model:
    """``model`` with blockwise weight ``i``'s scales tensor holding ``values``: its own
    scales tensor when no other tensor's quantization names it, else (an untied copy and
    its source) a new float16 tensor ``<weight>_scales``, which ``i`` then names."""
    sg = model.subgraphs[k]
    q = sg.tensors[i].quantization
    assert q is not None and q.blockwise is not None
    s = q.blockwise.scales
    shared = any(t.index != i and t.quantization is not None
                 and t.quantization.blockwise is not None
                 and t.quantization.blockwise.scales == s for t in sg.tensors)
    if not shared:
        tensors = list(sg.tensors)
        tensors[s] = replace(tensors[s], data=values)
        return replace_subgraph(model, k, tensors=tuple(tensors))
    model, s = add_tensor(model, k, f"{sg.tensors[i].name}_scales", values.shape, "float16",
                          data=values)
    tensors = list(model.subgraphs[k].tensors)
    tensors[i] = replace(tensors[i], quantization=replace(
        q, blockwise=replace(q.blockwise, scales=s)))
    return replace_subgraph(model, k, tensors=tuple(tensors))


def _read_through_dequantize(model: ir.Model, k: int, i: int,
                             ref: ir.Operator | None) -> ir.Model:
    """``model`` with the readers of float16 constant ``i`` reading a DEQUANTIZE of it.
    ``ref``, the source's DEQUANTIZE, is written as it was read, its output tensor reused,
    at its source place (after the operators that preceded it there, before the first
    reader); a new one goes just before the first reader."""
    sg = model.subgraphs[k]
    if ref is not None:
        out = ref.outputs[0]
        kept = next((op for op in sg.operators if op.inputs[:1] == (i,)
                     and op.outputs[:1] == (out,)), None)
        if kept is not None:  # the identity dequantize_model kept: the source operator again
            ops = [replace(ref, index=op.index) if op is kept else op for op in sg.operators]
            return replace_subgraph(model, k, operators=tuple(ops))
    else:
        t = sg.tensors[i]
        model, out = add_tensor(model, k, f"{t.name}/dequantized", t.shape)
    ops = [replace(op, inputs=tuple(out if j == i else j for j in op.inputs))
           for op in model.subgraphs[k].operators]
    first = next((j for j, op in enumerate(ops) if out in op.inputs), None)
    if first is None:
        return model
    at = first
    if ref is not None and ref.origin is not None:
        at = min(first, max((j + 1 for j, op in enumerate(ops)
                             if op.origin is not None and op.origin < ref.origin), default=0))
    model = replace_subgraph(model, k, operators=tuple(ops))
    model = add_operator(model, k, "DEQUANTIZE", (i,), (out,), at=at)
    if ref is not None:
        ops = list(model.subgraphs[k].operators)
        ops[at] = replace(ref, index=at)
        model = replace_subgraph(model, k, operators=tuple(ops))
    return model
