"""Fake quantization: a fully quantized model becomes the float model that simulates it.

The rule (:func:`fake_quantize`), in every subgraph: every affine-quantized tensor (int8,
uint8, int16 activations and weights; int32/int64 biases) becomes a float32 tensor without
quantization parameters (the float kernels run on it). A constant's data becomes its real value
(`circle_jax.passes.dequantize.dequantized_values`), so it is a float param (a
float32 master); a computed tensor or graph input holds the real value its integers stand
for. QUANTIZE and DEQUANTIZE operators become float32 DEQUANTIZE operators (identities),
whose outputs are then rounded as the source's outputs were quantized. Tensor and operator
indices and names do not change, so every tensor maps back to the source's.

The lowering (`circle_jax.lowering.interpreter`) runs a model this pass produced with the
rounding it describes, from the :class:`FakeQuantPlan` of the source model
(:func:`fake_quant_plan`):

- an *activation* (a graph input or computed tensor that was quantized) is rounded to its
  grid with the file's scale and zero point and clamped to its type's range;
- a *weight* (a quantized constant other than a bias) is re-quantized from its float value
  at every call with the file's scheme: symmetric (every zero point 0) as
  ``scale = max|w| / qmax`` with ``q`` in ``[-qmax, qmax]``, asymmetric as
  ``scale = (max(w, 0) - min(w, 0)) / (qmax - qmin)`` with the zero point that maps 0 to an
  integer; per channel along the file's quantized dimension, or per tensor, as the file has it;
- a *grid constant* (a quantized constant no operator reads as such a weight or through a
  QUANTIZE / DEQUANTIZE: the constant operand of an ADD or MUL, e.g. a LayerNorm's epsilon,
  gamma and beta) is rounded on the file's grid, its scale and zero point (per tensor or per
  channel), clamped to its type's range: the integer kernel reading it reads the file's
  parameters, so it trains as its integers move on that grid;
- a *bias* (input 2 of CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED; input 3 of
  TRANSPOSE_CONV) is re-quantized at scale ``s_input * s_weight`` (per output channel) with
  the weight's scales of that call, zero point 0, as int32 (int64 biases are not clamped),
  when its weight is a constant (a bias of a computed weight rounds as a weight does).

A *weight* is a quantized constant read as input 1 of CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED or TRANSPOSE_CONV, or read through a QUANTIZE / DEQUANTIZE (QDQ files).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from ..formats.schema import OPERATOR_CODES
from ..graph import ir
from ..graph.params_policy import BIAS_POSITION
from ..graph.quantization import QParams
from .dequantize import dequantized_values, is_quantized
from .edit import record, replace_subgraph


@dataclass(frozen=True)
class Bias:
    """A bias re-quantized at ``s_input * s_weight``: the tensors of its operator's input
    and weight, and the bias's own type."""

    input: int
    weight: int
    grid: QParams


@dataclass(frozen=True)
class FakeQuantPlan:
    """Where the simulation rounds, keyed by (subgraph, tensor index) of the source."""

    activations: dict[tuple[int, int], QParams]
    weights: dict[tuple[int, int], QParams]
    biases: dict[tuple[int, int], Bias]
    #: main-subgraph activations whose ranges move (`moving_ranges`; empty: the file's)
    moving: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: grid constants (module docstring): rounded with the file's own parameters
    constants: dict[tuple[int, int], QParams] = field(default_factory=dict)


#: Operators whose input 1, a quantized constant, is a weight (module docstring).
WEIGHT_READERS = frozenset(BIAS_POSITION)


def _grid_constants(sg: ir.Subgraph) -> set[int]:
    """Tensors of ``sg`` read, and only read, by operators other than QUANTIZE and
    DEQUANTIZE at positions other than a weight's (module docstring)."""
    grid: dict[int, bool] = {}
    for op in sg.operators:
        for pos, i in enumerate(op.inputs):
            if i >= 0:
                weight = op.type in ("QUANTIZE", "DEQUANTIZE") or (
                    op.type in WEIGHT_READERS and pos == 1)
                grid[i] = grid.get(i, True) and not weight
    return {i for i, only in grid.items() if only}


def fake_quant_plan(source: ir.Model) -> FakeQuantPlan:
    """The activations, weights and biases of ``source`` that :func:`fake_quantize`'s
    output rounds (see the module docstring)."""
    acts: dict[tuple[int, int], QParams] = {}
    weights: dict[tuple[int, int], QParams] = {}
    biases: dict[tuple[int, int], Bias] = {}
    constants: dict[tuple[int, int], QParams] = {}
    for sg in source.subgraphs:
        for op in sg.operators:
            pos = BIAS_POSITION.get(op.type)
            if pos is not None and len(op.inputs) > pos and op.inputs[pos] >= 0:
                b, x, w = (sg.tensors[op.inputs[j]] for j in (pos, 0, 1))
                if all(map(is_quantized, (b, x, w))) and b.is_constant and w.is_constant:
                    biases[(sg.index, b.index)] = Bias(x.index, w.index, QParams.of(b))
        grid = _grid_constants(sg)
        for t in sg.tensors:
            key = (sg.index, t.index)
            if not is_quantized(t) or key in biases:
                continue
            kind = acts if not t.is_constant else constants if t.index in grid else weights
            kind[key] = QParams.of(t)
    return FakeQuantPlan(acts, weights, biases, constants=constants)


def fake_quantize(model: ir.Model) -> ir.Model:
    """``model`` with every quantized tensor float32, without parameters, and its
    QUANTIZE / DEQUANTIZE operators float32 DEQUANTIZE identities (see the module
    docstring); the record maps each changed tensor to its former type."""
    changes: dict[str, str] = {}
    dequantize = OPERATOR_CODES["DEQUANTIZE"]
    for sg in model.subgraphs:
        tensors = []
        for t in sg.tensors:
            if is_quantized(t):
                where = f"subgraph {sg.index} {t.name}" if len(model.subgraphs) > 1 else t.name
                changes[where] = t.dtype
                data = None if t.data is None else dequantized_values(t)
                t = replace(t, dtype="float32", data=data, quantization=None)
            tensors.append(t)
        ops = tuple(replace(op, type="DEQUANTIZE", code=dequantize)
                    if op.type in ("QUANTIZE", "DEQUANTIZE") else op for op in sg.operators)
        model = replace_subgraph(model, sg.index, tensors=tuple(tensors), operators=ops)
    return record(model, "fake_quantize", changes, "tensor: was")


def quantized_activations(model: ir.Model) -> bool:
    """Whether ``model`` computes on quantized tensors (a full-integer model, which
    :func:`fake_quantize` simulates), not only stores quantized constants."""
    return any(is_quantized(t) and not t.is_constant
               for sg in model.subgraphs for t in sg.tensors)


#: Operators whose quantized output LiteRT's kernels give their input's parameters (they
#: move or select integers): where the file's parameters agree, their tensors share one
#: moving range.
SAME_PARAMETERS = frozenset({
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "MAX_POOL_2D", "AVERAGE_POOL_2D", "PAD",
    "PADV2", "STRIDED_SLICE", "SLICE", "GATHER", "CONCATENATION", "SPLIT", "SPLIT_V", "PACK",
    "UNPACK", "MAXIMUM", "MINIMUM", "TILE", "BROADCAST_TO"})
#: Operators whose quantized output has parameters the kernel fixes (e.g. 1/256 for SOFTMAX).
FIXED_PARAMETERS = frozenset({"LOGISTIC", "SOFTMAX", "LOG_SOFTMAX", "TANH"})


def moving_ranges(source: ir.Model) -> dict[str, tuple[int, ...]]:
    """The activations of ``source``'s main subgraph whose ranges quantization-aware training
    re-estimates (``load(qat_ranges="ema")``), in groups that share one range: name (its
    first tensor's) -> tensor indices. The rule: the inputs and output of a
    :data:`SAME_PARAMETERS` operator are one group where the file gives them equal scale and
    zero point; a group keeps the file's parameters (and is left out) when it holds a graph
    input (the model's interface) or the output of a :data:`FIXED_PARAMETERS` operator."""
    sg = source.main
    acts = {i for (k, i) in fake_quant_plan(source).activations if k == 0}
    parent = {i: i for i in acts}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    fixed = set(sg.inputs)
    for op in sg.operators:
        outs = [i for i in op.outputs if i in acts]
        if op.type in FIXED_PARAMETERS:
            fixed.update(outs)
        if op.type not in SAME_PARAMETERS:
            continue
        for y in outs:
            for x in (i for i in op.inputs if i in acts):
                qx, qy = sg.tensors[x].quantization, sg.tensors[y].quantization
                if (qx.scale, qx.zero_point) == (qy.scale, qy.zero_point):
                    parent[root(y)] = root(x)
    groups: dict[int, list[int]] = {}
    for i in sorted(acts):
        groups.setdefault(root(i), []).append(i)
    names = Counter(t.name for t in sg.tensors)
    return {(t.name if names[t.name] == 1 else f"{t.name}@{t.index}"): tuple(members)
            for members in groups.values() if not fixed.intersection(members)
            for t in (sg.tensors[members[0]],)}
