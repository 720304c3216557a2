"""Whether a graph follows the batch: the rule that decides how a batch of N samples runs.

A model's inputs declare a leading (batch) dimension D, often 1. Given N samples instead,
the graph either runs as one batched graph, which is right only when every operator
computes each sample from that sample alone with the batch still on axis 0, or the
declared graph runs on each sample alone, mapped over the samples (``jax.vmap``).

:func:`batch_blocker` decides by shape propagation over subgraph 0, operator by operator,
from the declared shapes, options and constant operands only. A tensor is *batched* when it
depends on an input; every batched tensor must declare dimension 0 equal to D. An operator
reading a batched tensor follows the batch when its rule below says that its options and
constant operands leave dimension 0 alone:

- elementwise operators: every batched operand has the output's rank; every other operand
  has a lower rank or dimension 0 of size 1 (it broadcasts over the samples);
- operators over trailing axes (convolutions, pooling, resizing, softmax, normalizations)
  and the LSTM (batch-major): only the data operand is batched;
- FULLY_CONNECTED: each sample is one row (``keep_num_dims``, or the input's per-sample
  size equals the weights' input size);
- BATCH_MATMUL: batched operands have the output's rank (rank 2: only the unadjointed lhs);
- axis and axes operands or options (CONCATENATION, PACK, UNPACK, SPLIT, SPLIT_V, EXPAND_DIMS,
  SQUEEZE, reductions, ARG_MAX, CUMSUM, REVERSE_V2, ONE_HOT, GATHER) never name axis 0;
  EMBEDDING_LOOKUP's rows follow its ids (only they are batched); TRANSPOSE keeps axis 0
  first; TILE multiplies it by 1; PAD pads it by 0; SLICE and STRIDED_SLICE take it whole
  (begin 0 or masked, size -1 or end masked, stride 1, no ellipsis, new axis or shrink
  there); RESHAPE's requested shape, computed at the declared
  input, keeps dimension 0 at D and each sample's size;
- every output of the subgraph is batched.

Anything else (a SHAPE of a batched tensor, BROADCAST_TO, SPACE_TO_BATCH_ND, control flow,
composites, an operand computed in the graph where a constant is needed, an undeclared
shape, ...) does not follow: the rule is conservative, so a graph it passes is right when
batched, and a graph it stops still runs right, mapped over the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..errors import DataError
from . import ir

Rule = Callable[["_Op"], "str | None"]


class _Op:
    """An operator seen by its batch rule: which operands are batched, their declared
    shapes, its constant operands."""

    def __init__(self, sg: ir.Subgraph, op: ir.Operator, batched: set[int], batch: int) -> None:
        self.sg, self.op, self.batch = sg, op, batch
        self.options = op.options
        self.is_batched = [i >= 0 and i in batched for i in op.inputs]
        self.out_rank = len(sg.tensors[op.outputs[0]].shape) if op.outputs else 0

    def shape(self, pos: int) -> tuple[int, ...]:
        return self.sg.tensors[self.op.inputs[pos]].shape

    def const(self, pos: int) -> list[int] | None:
        """Input ``pos`` as a flat list of ints when it is an integer constant of the file
        (None otherwise: a float constant where integers belong, infinity included, is the
        operator's own checks' to refuse)."""
        if pos >= len(self.op.inputs) or self.op.inputs[pos] < 0:
            return None
        data = self.sg.tensors[self.op.inputs[pos]].data
        if data is None or not np.issubdtype(np.asarray(data).dtype, np.integer):
            return None
        return [int(v) for v in np.asarray(data).reshape(-1)]

    def only(self, *positions: int) -> str | None:
        """None when only inputs at ``positions`` are batched."""
        for pos, b in enumerate(self.is_batched):
            if b and pos not in positions:
                return f"its input {pos} (not its data operand) depends on the batch"
        return None


def batch_blocker(model: ir.Model) -> str | None:
    """None when subgraph 0 follows a batch on axis 0 of its inputs (so a batch of N runs as
    one batched graph); else why not, naming the first operator that does not follow."""
    sg = model.main
    shapes = [sg.tensors[i].shape for i in sg.inputs]
    if not shapes or any(not s for s in shapes) or len({s[0] for s in shapes}) != 1:
        return "its inputs share no leading (batch) dimension"
    batch = shapes[0][0]
    batched = set(sg.inputs)
    for op in sg.operators:
        if not any(i in batched for i in op.inputs if i >= 0):
            continue
        where = f"operator {op.index} ({op.key})"
        rule = RULES.get(op.key)
        if rule is None:
            return f"{where} is not known to follow the batch"
        why = rule(_Op(sg, op, batched, batch))
        if why is None:
            why = next((f"its output {sg.tensors[i].name!r} declares shape "
                        f"{list(sg.tensors[i].shape)}, not batch {batch}"
                        for i in op.outputs if i >= 0 and sg.tensors[i].shape[:1] != (batch,)),
                       None)
        if why is not None:
            return f"{where}: {why}"
        batched.update(i for i in op.outputs if i >= 0)
    for i in sg.outputs:
        if i not in batched:
            return f"output {sg.tensors[i].name!r} does not depend on the inputs"
    return None


def _axis(axis: int, rank: int) -> int:
    return axis % rank if rank else axis


def _broadcast(o: _Op) -> str | None:
    for pos, b in enumerate(o.is_batched):
        if o.op.inputs[pos] < 0:
            continue
        shape = o.shape(pos)
        if b and len(shape) != o.out_rank:
            return f"its batched input {pos} has rank {len(shape)}, the output {o.out_rank}"
        if not b and len(shape) == o.out_rank and shape[0] != 1:
            return f"its constant input {pos} {list(shape)} spans dimension 0"
    return None


def _data(*positions: int) -> Rule:
    return lambda o: o.only(*positions)


def _trailing_axis(o: _Op) -> str | None:
    return o.only(0) or (None if o.out_rank >= 2 else "it works along dimension 0")


def _axes(input_pos: int | None = None, option: str = "axis", rank_plus: int = 0,
          data: Sequence[int] = (0,)) -> Rule:
    """Axes from a constant input (``input_pos``) or an option must not name axis 0 of the
    data operand (of rank + ``rank_plus`` when they index the output, as EXPAND_DIMS's)."""
    def rule(o: _Op) -> str | None:
        why = o.only(*data)
        if why:
            return why
        axes = o.const(input_pos) if input_pos is not None else [
            int(getattr(o.options, option) or 0)]
        if axes is None:
            return f"its input {input_pos} (axes) is not a constant of the file"
        rank = len(o.shape(data[0])) + rank_plus
        return "it works along dimension 0" if 0 in {_axis(a, rank) for a in axes} else None
    return rule


def _all_batched_axis(rank_plus: int = 0) -> Rule:
    def rule(o: _Op) -> str | None:
        if not all(o.is_batched):
            return "some of its inputs do not depend on the batch"
        return _axes(rank_plus=rank_plus, data=range(len(o.op.inputs)))(o)
    return rule


def _fully_connected(o: _Op) -> str | None:
    why = o.only(0)
    if why or o.options.keep_num_dims:
        return why
    per_sample = int(np.prod(o.shape(0)[1:], dtype=np.int64))
    n_in = o.shape(1)[1] if len(o.shape(1)) == 2 else None
    return None if per_sample == n_in else (
        f"it flattens {per_sample} values per sample into rows of {n_in}")


def _batch_matmul(o: _Op) -> str | None:
    why = _broadcast(o)
    if why:
        return why
    if o.out_rank == 2 and (o.is_batched[1] or o.options.adjoint_lhs):
        return "its rank-2 batched operand is contracted along dimension 0"
    return None


def _first_entry(check: Callable[[_Op], str | None], *consts: int) -> Rule:
    """``check`` after the data operand alone is batched and ``consts`` are constants."""
    def rule(o: _Op) -> str | None:
        why = o.only(0)
        if why:
            return why
        missing = [p for p in consts if o.const(p) is None]
        if missing:
            return f"its input {missing[0]} is not a constant of the file"
        return check(o)
    return rule


def _transpose(o: _Op) -> str | None:
    return None if o.const(1)[0] == 0 else "it moves dimension 0"


def _tile(o: _Op) -> str | None:
    return None if o.const(1)[0] == 1 else "it tiles dimension 0"


def _pad(o: _Op) -> str | None:
    return None if o.const(1)[:2] == [0, 0] else "it pads dimension 0"


def _slice(o: _Op) -> str | None:
    return None if o.const(1)[0] == 0 and o.const(2)[0] == -1 else (
        "its begin/size pin dimension 0")


def _strided_slice(o: _Op) -> str | None:
    opt = o.options
    if (opt.ellipsis_mask or 0) or (opt.new_axis_mask or 0) or opt.offset:
        return "its ellipsis/new-axis/offset masks move dimension 0"
    begin, strides = o.const(1), o.const(3) if len(o.op.inputs) > 3 else [1]
    if strides is None:
        return "its strides are not a constant of the file"
    whole = ((opt.begin_mask or 0) & 1 or begin[0] == 0) and (opt.end_mask or 0) & 1 \
        and strides[0] == 1 and not (opt.shrink_axis_mask or 0) & 1
    return None if whole else "its begin/end/strides pin dimension 0"


def _reshape(o: _Op) -> str | None:
    why = o.only(0)
    if why:
        return why
    shape = o.const(1) if len(o.op.inputs) > 1 else None
    if shape is None and len(o.op.inputs) > 1 and o.op.inputs[1] >= 0:
        return "its shape operand is not a constant of the file"
    if shape is None:
        shape = [int(d) for d in o.options.new_shape] if o.options.new_shape is not None \
            else list(o.sg.tensors[o.op.outputs[0]].shape)
    tail = int(np.prod(o.shape(0)[1:], dtype=np.int64))
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if shape.count(-1) > 1 or not shape or not known:
        return f"its new shape {shape} is not one the batch can follow"
    if -1 in shape:
        shape[shape.index(-1)] = o.batch * tail // known
    if shape[0] != o.batch or int(np.prod(shape[1:], dtype=np.int64)) != tail:
        return f"its new shape {shape} does not keep dimension 0 at {o.batch} per sample"
    return None


def _gather(o: _Op) -> str | None:
    axis = _axis(int(o.options.axis or 0), len(o.shape(0)))
    dims = int(o.options.batch_dims or 0)
    params, indices = o.is_batched[:2]
    if params and indices:
        return None if dims >= 1 else "it gathers across the samples"
    if params:
        return None if axis != 0 and dims == 0 else "it gathers along dimension 0"
    return None if axis == 0 and dims == 0 else "its batched indices land off dimension 0"


def _gather_nd(o: _Op) -> str | None:
    return o.only(1) or (None if len(o.shape(1)) >= 2 else "its indices have no batch axis")


def _lstm(o: _Op) -> str | None:
    return o.only(0) or ("it is time-major" if o.options.time_major else None)


def _one_hot(o: _Op) -> str | None:
    axis = -1 if o.options.axis is None else int(o.options.axis)
    last = axis == -1 or axis == len(o.shape(0))
    return o.only(0) or (None if last or _axis(axis, len(o.shape(0)) + 1) != 0
                         else "its new axis is dimension 0")


_ELEMENTWISE = (
    "ABS ADD ADD_N CAST CEIL COS DIV ELU EQUAL EXP FLOOR FLOOR_DIV FLOOR_MOD GELU GREATER "
    "GREATER_EQUAL HARD_SWISH LEAKY_RELU LESS LESS_EQUAL LOG LOGICAL_AND LOGICAL_NOT "
    "LOGICAL_OR LOGISTIC MAXIMUM MINIMUM MUL NEG NOT_EQUAL POW PRELU RELU RELU6 RELU_0_TO_1 "
    "RELU_N1_TO_1 ROUND RSQRT SELECT SELECT_V2 SIGN SIN SQRT SQUARE SQUARED_DIFFERENCE SUB "
    "TANH ZEROS_LIKE").split()
_SPATIAL = (
    "CONV_2D DEPTHWISE_CONV_2D CONV_3D AVERAGE_POOL_2D MAX_POOL_2D L2_POOL_2D RESIZE_BILINEAR "
    "RESIZE_NEAREST_NEIGHBOR SPACE_TO_DEPTH DEPTH_TO_SPACE INSTANCE_NORM "
    "CUSTOM:Convolution2DTransposeBias").split()
_REDUCTIONS = "MEAN SUM REDUCE_MAX REDUCE_MIN REDUCE_PROD REDUCE_ANY REDUCE_ALL ARG_MAX " \
    "ARG_MIN CUMSUM REVERSE_V2".split()

RULES: dict[str, Rule] = {
    **{k: _broadcast for k in _ELEMENTWISE},
    **{k: _data(0) for k in _SPATIAL},
    **{k: _axes(1) for k in _REDUCTIONS},
    **{k: _trailing_axis for k in ("SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION",
                                   "LOCAL_RESPONSE_NORMALIZATION", "TOPK_V2")},
    "TRANSPOSE_CONV": _data(2),
    "FULLY_CONNECTED": _fully_connected,
    "BATCH_MATMUL": _batch_matmul,
    "CUSTOM:BatchMatMulV2": _batch_matmul,
    "CONCATENATION": _all_batched_axis(),
    "PACK": _all_batched_axis(rank_plus=1),
    "UNPACK": _axes(),
    "SPLIT": _axes(0, data=(1,)),
    "SPLIT_V": _axes(2),
    "EXPAND_DIMS": _axes(1, rank_plus=1),
    "SQUEEZE": lambda o: o.only(0) or (
        None if o.options.squeeze_dims and 0 not in {
            _axis(int(d), len(o.shape(0))) for d in o.options.squeeze_dims}
        else "it may squeeze dimension 0"),
    "TRANSPOSE": _first_entry(_transpose, 1),
    "TILE": _first_entry(_tile, 1),
    "PAD": _first_entry(_pad, 1),
    "PADV2": _first_entry(_pad, 1),
    "MIRROR_PAD": _first_entry(_pad, 1),
    "SLICE": _first_entry(_slice, 1, 2),
    "STRIDED_SLICE": _first_entry(_strided_slice, 1, 2),
    "RESHAPE": _reshape,
    "GATHER": _gather,
    "GATHER_ND": _gather_nd,
    "EMBEDDING_LOOKUP": lambda o: o.only(0),  # ids [N] -> rows [N, ...]
    "ONE_HOT": _one_hot,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _lstm,
}
"""Operator key -> its batch rule: None when it follows the batch, else why not."""


def check_inputs(model: ir.Model, inputs: Sequence[Any]) -> None:
    """DataError (one line, naming the input) for inputs subgraph 0 cannot take: another
    count or rank, a sample dimension (axis 1 on) other than declared unless the tensor's
    shape signature leaves it free (-1), or real data for an integer or bool input that is
    not quantized (token ids, indices: rounding them is never meant)."""
    main = model.main
    declared = [main.tensors[i] for i in main.inputs]
    check_input_count(len(declared), len(inputs))
    for t, x in zip(declared, inputs, strict=True):
        given = tuple(np.shape(x))
        if not takes_samples(t, given):
            want = ", ".join(["N", *map(str, t.shape[1:])] if t.shape else [])
            raise DataError(f"input {t.name!r}: an array of shape {list(given)}, the model "
                            f"expects [{want}] (N samples on axis 0)")
        dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        if t.quantization is None and not t.is_float and jax.dtypes.issubdtype(dtype,
                                                                                np.inexact):
            raise DataError(f"input {t.name!r}: {dtype} data, the model expects {t.dtype} "
                            "(integers: convert them yourself, circle-jax does not round)")


def free_axes(t: ir.Tensor) -> set[int]:
    """The axes past 0 that ``t``'s shape signature leaves free (-1): its declared size
    there is a placeholder."""
    return {k for k, d in enumerate(t.shape_signature or ()) if k > 0 and d < 0}


def takes_samples(t: ir.Tensor, given: Sequence[int]) -> bool:
    """Whether input ``t`` takes an array of shape ``given``: its rank, and its declared size
    on each axis past 0 but its `free_axes`."""
    free = free_axes(t)
    return len(given) == len(t.shape) and all(
        given[k] == t.shape[k] for k in range(1, len(t.shape)) if k not in free)


def check_input_count(declared: int, given: int) -> None:
    """DataError (one line) unless ``given`` arrays feed a model of ``declared`` inputs."""
    if given != declared:
        raise DataError(f"the model has {declared} inputs, got {given} arrays")
