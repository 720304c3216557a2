"""A subgraph under construction from builtin operators, for the training-step pass.

:class:`Emitter` starts from a list of IR tensors and operators (the forward graph) and
appends tensors and operators, each helper stating the shape rule of the operator it emits
(this layer cannot run circle-jax's operators to infer shapes). Every helper returns the
index of its output tensor. Tensors are float32 unless a helper says otherwise (RESHAPE and
TRANSPOSE keep their input's dtype); constants get ``ir.NEW_BUFFER`` and are written with
buffers of their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...formats.schema import OPERATOR_CODES
from ...graph import ir

Shape = tuple[int, ...]

#: Operator versions other than 1 that LiteRT registers the operator from.
VERSIONS = {"BROADCAST_TO": 2}


class Emitter:
    """Tensors and operators of one subgraph; ``prefix`` names the tensors it adds."""

    def __init__(self, tensors: Sequence[ir.Tensor], operators: Sequence[ir.Operator],
                 prefix: str = "train") -> None:
        self.tensors: list[ir.Tensor] = list(tensors)
        self.operators: list[ir.Operator] = list(operators)
        self.prefix = prefix

    # ------------------------------------------------------------------ tensors

    def shape(self, t: int) -> Shape:
        return self.tensors[t].shape

    def dtype(self, t: int) -> str:
        return self.tensors[t].dtype

    def tensor(self, name: str, shape: Sequence[int], dtype: str = "float32") -> int:
        """A new non-constant tensor (a graph input, or an operator's output)."""
        i = len(self.tensors)
        self.tensors.append(ir.Tensor(i, name, tuple(int(d) for d in shape), dtype, 0))
        return i

    def const(self, value: Any, dtype: str = "float32", name: str | None = None) -> int:
        """A constant tensor holding ``value`` in ``dtype``."""
        data = np.asarray(value, dtype=dtype)
        data.setflags(write=False)
        i = len(self.tensors)
        self.tensors.append(ir.Tensor(i, name or f"{self.prefix}/const_{i}", data.shape,
                                      data.dtype.name, ir.NEW_BUFFER, data))
        return i

    def scalar(self, value: float) -> int:
        """A float32 scalar constant (shape ``[]``)."""
        return self.const(np.float32(value))

    # ------------------------------------------------------------------ operators

    def op(self, op_type: str, inputs: Sequence[int], shape: Sequence[int],
           options: Mapping[str, Any] | None = None, dtype: str = "float32",
           name: str | None = None) -> int:
        """Append operator ``op_type`` with one output of ``shape`` and ``dtype``."""
        out = self.tensor(name or f"{self.prefix}/{op_type.lower()}_{len(self.operators)}",
                          shape, dtype)
        self.operators.append(ir.Operator(len(self.operators), op_type,
                                          OPERATOR_CODES[op_type], tuple(inputs), (out,),
                                          ir.Options(options or {}),
                                          version=VERSIONS.get(op_type, 1)))
        return out

    def binary(self, op_type: str, a: int, b: int, dtype: str = "float32") -> int:
        """An elementwise operator of two operands: the output takes numpy's broadcast
        shape (ADD, SUB, MUL, DIV, MAXIMUM, POW, GREATER, ...)."""
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        return self.op(op_type, [a, b], shape, dtype=dtype)

    def add(self, a: int, b: int) -> int:
        return self.binary("ADD", a, b)

    def sub(self, a: int, b: int) -> int:
        return self.binary("SUB", a, b)

    def mul(self, a: int, b: int) -> int:
        return self.binary("MUL", a, b)

    def div(self, a: int, b: int) -> int:
        return self.binary("DIV", a, b)

    def scale(self, a: int, factor: float) -> int:
        """``a * factor`` (no operator when the factor is 1)."""
        return a if factor == 1.0 else self.mul(a, self.scalar(factor))

    def unary(self, op_type: str, a: int) -> int:
        """An elementwise operator of one operand (NEG, SQRT, LOG, SQUARE, ...)."""
        return self.op(op_type, [a], self.shape(a))

    def mask(self, op_type: str, a: int, b: int) -> int:
        """A comparison (GREATER, LESS, ...) as float32 0/1 of the broadcast shape."""
        flags = self.binary(op_type, a, b, dtype="bool")
        return self.op("CAST", [flags], self.shape(flags))

    def reshape(self, a: int, shape: Sequence[int]) -> int:
        """RESHAPE to ``shape`` (no operator when ``a`` has it already)."""
        shape = tuple(int(d) for d in shape)
        if self.shape(a) == shape:
            return a
        return self.op("RESHAPE", [a, self.const(shape, "int32")], shape,
                       {"new_shape": shape}, dtype=self.dtype(a))

    def transpose(self, a: int, perm: Sequence[int]) -> int:
        """TRANSPOSE: output dimension k is input dimension ``perm[k]``."""
        shape = tuple(self.shape(a)[p] for p in perm)
        return self.op("TRANSPOSE", [a, self.const(list(perm), "int32")], shape,
                       dtype=self.dtype(a))

    def reduce(self, op_type: str, a: int, axes: Sequence[int], keep_dims: bool) -> int:
        """SUM / MEAN / REDUCE_MAX over ``axes`` (no operator when there are none). A SUM
        over several axes is one SUM per axis, the last first: LiteRT's SUM adds the values
        of one output in one running float32 total, so summing a long axis at a time keeps
        each total short (MediaPipe's face detector's bias gradients: 1.3e-6 of each largest
        one from float64's, against 5.0e-6 in one SUM; XLA's 1.1e-6)."""
        axes = sorted({ax % len(self.shape(a)) for ax in axes})
        if not axes:
            return a
        if op_type == "SUM" and len(axes) > 1:
            out = a
            for ax in reversed(axes):
                out = self.reduce("SUM", out, [ax], keep_dims=True)
            return out if keep_dims else self.reshape(
                out, [d for k, d in enumerate(self.shape(a)) if k not in axes])
        shape = [1 if k in axes else d for k, d in enumerate(self.shape(a))]
        if not keep_dims:
            shape = [d for k, d in enumerate(shape) if k not in axes]
        return self.op(op_type, [a, self.const(axes, "int32")], shape,
                       {"keep_dims": keep_dims})

    def unbroadcast(self, g: int, shape: Shape) -> int:
        """``g`` summed over the axes numpy broadcasting expanded from ``shape``: the
        cotangent of an operand of that shape."""
        gshape = self.shape(g)
        lead = len(gshape) - len(shape)
        axes = list(range(lead)) + [lead + k for k, d in enumerate(shape)
                                    if d == 1 and gshape[lead + k] != 1]
        return self.reshape(self.reduce("SUM", g, axes, keep_dims=True), shape)

    def broadcast_to(self, a: int, shape: Sequence[int]) -> int:
        """BROADCAST_TO ``shape`` (no operator when ``a`` has it already)."""
        shape = tuple(shape)
        if self.shape(a) == shape:
            return a
        return self.op("BROADCAST_TO", [a, self.const(shape, "int32")], shape)

    def matmul(self, a: int, b: int, adj_x: bool = False, adj_y: bool = False) -> int:
        """BATCH_MATMUL, ``adj_*`` transposing an operand's last two dimensions first; the
        leading (batch) dimensions broadcast as numpy's matmul broadcasts them."""
        sa, sb = self.shape(a), self.shape(b)
        (m, k), (k2, n) = sa[-2:][::-1 if adj_x else 1], sb[-2:][::-1 if adj_y else 1]
        assert k == k2, (sa, sb, adj_x, adj_y)
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.op("BATCH_MATMUL", [a, b], (*batch, m, n), {"adjoint_lhs": adj_x,
                                                                 "adjoint_rhs": adj_y})

    def dense(self, a: int, weights: np.ndarray) -> int:
        """``a @ weights.T`` for ``a`` ``[..., K]`` and constant ``weights`` ``[O, K]``: one
        FULLY_CONNECTED of ``a``'s rows with a zero bias, reshaped back to ``[..., O]`` (a
        product every runtime has, where BATCH_MATMUL's broadcasting is not onert's)."""
        shape, (o, k) = self.shape(a), weights.shape
        assert shape[-1] == k, (shape, weights.shape)
        rows = self.reshape(a, (math.prod(shape[:-1]), k))
        out = self.op("FULLY_CONNECTED", [rows, self.const(weights),
                                          self.const(np.zeros(o, np.float32))],
                      (math.prod(shape[:-1]), o), {"fused_activation_function": ir.ACT_NONE,
                                                   "keep_num_dims": False})
        return self.reshape(out, (*shape[:-1], o))

    def concat(self, parts: Sequence[int], axis: int) -> int:
        """CONCATENATION along ``axis`` (one part: no operator)."""
        if len(parts) == 1:
            return parts[0]
        shape = list(self.shape(parts[0]))
        axis %= len(shape)
        shape[axis] = sum(self.shape(p)[axis] for p in parts)
        return self.op("CONCATENATION", list(parts), shape, {"axis": axis})

    def scatter_nd(self, indices: int, updates: int, shape: Sequence[int]) -> int:
        """SCATTER_ND: zeros of ``shape`` plus each row of ``updates`` at its index row
        (``indices`` int32 ``[..., k]``; repeated indices add up)."""
        return self.op("SCATTER_ND", [indices, updates, self.const(list(shape), "int32")],
                       tuple(shape))

    def pad(self, a: int, pads: Sequence[tuple[int, int]]) -> int:
        """PAD with zeros, ``pads[k]`` = (before, after) of dimension k (none: no operator)."""
        if not any(p for pair in pads for p in pair):
            return a
        shape = [d + lo + hi for d, (lo, hi) in zip(self.shape(a), pads)]
        return self.op("PAD", [a, self.const(np.asarray(pads, np.int32), "int32")], shape)

    def slice(self, a: int, begin: Sequence[int], size: Sequence[int]) -> int:
        """SLICE ``size`` elements from ``begin`` (the whole tensor: no operator)."""
        if tuple(size) == self.shape(a) and not any(begin):
            return a
        return self.op("SLICE", [a, self.const(list(begin), "int32"),
                                 self.const(list(size), "int32")], tuple(size))
