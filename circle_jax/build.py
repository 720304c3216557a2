"""A small graph builder that writes .circle and .tflite bytes.

    b = Builder()
    x = b.input("x", (1, 4))
    w = b.constant("w", np.ones((3, 4), np.float32))
    y = b.op("FULLY_CONNECTED", [x, w, -1], {"fused_activation_function": "RELU"})
    b.output(y)
    data = b.to_bytes("tflite")

Output shapes and dtypes are inferred by running circle-jax's own operator on abstract values
(``jax.eval_shape``); pass ``shapes=``/``dtypes=`` where inference is not possible.

Quantized tensors: ``quantization=(scale, zero_point)`` per tensor or
``(scales, zero_points, quantized_dimension)`` per channel (or an ``ir.Quantization``) on
``input``, ``constant`` and ``tensor``; ``op(..., quantization=[...])`` gives one per output
(an output with quantization and no ``dtypes=`` takes the first input's type):

    x = b.input("x", (1, 8, 8, 3), "int8", quantization=(0.05, -3))
    w = b.constant("w", w_int8, quantization=(w_scales, [0] * 4, 0))
    y = b.op("CONV_2D", [x, w, bias], {"padding": "SAME"}, quantization=[(0.1, 2)])
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .formats.reader import options_of
from .formats.schema import OPERATOR_CODES, options_class, options_tag, schema, tensor_type
from .formats.writer import opcode_object, pack
from .graph import ir
from .ops.common import is_static
from .ops.registry import OpContext, definition, runs_integer

_ENUMS = {
    "padding": schema.Padding.Padding,
    "fused_activation_function": schema.ActivationFunctionType.ActivationFunctionType,
}
# enum options whose name is shared by several tables: (operator, option) -> enum
_OP_ENUMS = {("MIRROR_PAD", "mode"): schema.MirrorPadMode.MirrorPadMode}
_DTYPE_OPTIONS = {"in_data_type", "out_data_type", "out_type", "output_type", "idx_out_type"}


QuantizationSpec = Any  # (scale, zero_point), (scales, zero_points, dim) or ir.Quantization


def as_quantization(spec: QuantizationSpec) -> ir.Quantization | None:
    """An ``ir.Quantization`` from a (scale, zero_point[, quantized_dimension]) tuple."""
    if spec is None or isinstance(spec, ir.Quantization):
        return spec
    scale, zero = np.atleast_1d(spec[0]), np.atleast_1d(spec[1])
    return ir.Quantization(tuple(float(v) for v in scale), tuple(int(v) for v in zero),
                           int(spec[2]) if len(spec) > 2 else 0)


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None
    quantization: ir.Quantization | None = None


@dataclass
class _Op:
    type: str
    custom_code: str | None
    inputs: list[int]
    outputs: list[int]
    options_tag: int
    options: Any
    custom_options: bytes | None
    version: int


@dataclass
class GraphBuilder:
    """One subgraph under construction; tensors are referred to by their integer index."""

    owner: Builder
    index: int
    name: str
    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32",
              quantization: QuantizationSpec = None) -> int:
        """Add a graph input."""
        t = self._add(name, tuple(shape), np.dtype(dtype).name, quantization=quantization)
        self.inputs.append(t)
        return t

    def constant(self, name: str, value: Any, dtype: str | None = None,
                 quantization: QuantizationSpec = None) -> int:
        """Add a constant tensor holding ``value`` (its numpy dtype is kept unless given)."""
        arr = np.asarray(value, dtype=dtype)
        data = np.ascontiguousarray(arr).reshape(arr.shape)  # keeps 0-d constants 0-d
        return self._add(name, arr.shape, _dtype_name(arr.dtype), data, quantization)

    def tensor(self, name: str, shape: Sequence[int], dtype: str = "float32",
               quantization: QuantizationSpec = None) -> int:
        """Add a plain (non-constant) tensor, e.g. for an output computed by a later op."""
        return self._add(name, tuple(shape), np.dtype(dtype).name, quantization=quantization)

    def op(
        self,
        op_type: str,
        inputs: Sequence[int],
        options: Mapping[str, Any] | None = None,
        *,
        outputs: int | Sequence[int] = 1,
        shapes: Sequence[Sequence[int]] | None = None,
        dtypes: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        custom_code: str | None = None,
        custom_options: bytes | None = None,
        version: int = 1,
        quantization: Sequence[QuantizationSpec] | None = None,
    ) -> Any:
        """Add an operator; returns its output tensor (or a tuple when it has several).

        ``op_type`` is a builtin name (``"CONV_2D"``) or ``"CUSTOM"`` with ``custom_code``.
        ``options`` use snake_case names of the schema's options table; enum options accept
        names (``padding="VALID"``, ``fused_activation_function="RELU6"``). ``outputs`` is
        a count of new tensors or a list of existing tensor indices. ``quantization``: one
        spec (or None) per new output.
        """
        if op_type not in OPERATOR_CODES:
            raise ValueError(f"unknown operator {op_type!r}")
        tag = options_tag(op_type)
        opts = _options_object(op_type, tag, options or {})
        if isinstance(outputs, int):
            n = outputs
            out_idx = None
        else:
            out_idx, n = list(outputs), len(outputs)
        names = list(names) if names else [
            f"{op_type.lower()}_{len(self.ops)}" + (f"_{j}" if n > 1 else "") for j in range(n)
        ]
        if out_idx is None:
            quants = [as_quantization(q) for q in (quantization or [None] * n)]
            if dtypes is None and any(q is not None for q in quants) and inputs:
                dtypes = [self.tensors[inputs[0]].dtype] * n
            inferred = self._infer(op_type, custom_code, inputs, opts, custom_options, n,
                                   shapes, dtypes, quants)
            out_idx = [self._add(nm, s, d, quantization=q)
                       for nm, (s, d), q in zip(names, inferred, quants)]
        self.ops.append(
            _Op(op_type, custom_code, list(inputs), out_idx, tag, opts, custom_options, version)
        )
        return out_idx[0] if n == 1 else tuple(out_idx)

    def output(self, *tensors: int) -> None:
        """Mark tensors as graph outputs, in order."""
        self.outputs.extend(tensors)

    def shape(self, t: int) -> tuple[int, ...]:
        return self.tensors[t].shape

    def _add(self, name: str, shape: tuple[int, ...], dtype: str, data: Any = None,
             quantization: QuantizationSpec = None) -> int:
        self.tensors.append(_Tensor(name, tuple(int(d) for d in shape), dtype, data,
                                    as_quantization(quantization)))
        return len(self.tensors) - 1

    def _ir_tensor(self, i: int) -> ir.Tensor | None:
        if i < 0:
            return None
        t = self.tensors[i]
        return ir.Tensor(i, t.name, t.shape, t.dtype, 0, t.data, t.quantization)

    def _infer(self, op_type, custom_code, inputs, opts, custom_options, n, shapes, dtypes,
               quants=None):
        if shapes is not None:
            dts = dtypes or ["float32"] * n
            return [(tuple(s), np.dtype(d).name) for s, d in zip(shapes, dts)]
        key = f"CUSTOM:{custom_code}" if op_type == "CUSTOM" else op_type
        placeholder = tuple(
            ir.Tensor(-1, f"out{j}", (), np.dtype(dtypes[j]).name if dtypes else "float32", 0,
                      quantization=quants[j] if quants else None)
            for j in range(n)
        )
        ins = tuple(self._ir_tensor(i) for i in inputs)
        d = definition(key, runs_integer(key, ins, placeholder))
        if d is None:
            raise ValueError(f"cannot infer output shapes of {key}: pass shapes= and dtypes=")
        op = ir.Operator(len(self.ops), op_type, OPERATOR_CODES[op_type], tuple(inputs), (),
                         options_of(opts), custom_code, custom_options)
        ctx = OpContext(op, ins, placeholder, self.owner._abstract_subgraph)
        if d.check is not None:  # the load-time checks of the operator's options
            d.check(ctx)
        fn = d.fn
        values = [None if i < 0 else self.tensors[i] for i in inputs]
        dynamic = [j for j, t in enumerate(values) if t is not None and t.data is None]

        def run(*dyn: Any) -> Any:
            args = [None if t is None else t.data for t in values]
            for j, v in zip(dynamic, dyn):
                args[j] = v
            return fn(ctx, *args)

        structs = [jax.ShapeDtypeStruct(values[j].shape, ir.as_numpy_dtype(values[j].dtype))
                   for j in dynamic]
        if dynamic:
            out = jax.eval_shape(run, *structs)
        else:
            with jax.ensure_compile_time_eval():
                out = run()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        result = []
        for o in outs:
            dtype = o.dtype if not is_static(o) else np.asarray(o).dtype
            result.append((tuple(np.shape(o)), _dtype_name(dtype)))
        return result


class Builder:
    """Builds a whole model: the main graph (methods forwarded) plus optional subgraphs."""

    def __init__(self, description: str = "circle-jax builder") -> None:
        self.description = description
        self.graphs: list[GraphBuilder] = []
        self.main = self.subgraph("main")

    def subgraph(self, name: str) -> GraphBuilder:
        """A new subgraph (for IF / WHILE bodies); its index is ``.index``."""
        g = GraphBuilder(self, len(self.graphs), name)
        self.graphs.append(g)
        return g

    def __getattr__(self, name: str) -> Any:
        if name in ("input", "constant", "tensor", "op", "output", "shape"):
            return getattr(self.main, name)
        raise AttributeError(name)

    def _abstract_subgraph(self, k: int, args: Sequence[Any]) -> tuple[Any, ...]:
        g = self.graphs[k]
        return tuple(jnp.zeros(g.tensors[i].shape, ir.as_numpy_dtype(g.tensors[i].dtype))
                     for i in g.outputs)

    def to_object(self) -> Any:
        """circle-schema's ``ModelT`` of this model."""
        m = schema.Model.ModelT()
        m.version = 0
        m.description = self.description
        m.buffers = [schema.Buffer.BufferT()]
        codes: dict[tuple, int] = {}
        m.operatorCodes = []
        m.subgraphs = []
        for g in self.graphs:
            sg = schema.SubGraph.SubGraphT()
            sg.name = g.name
            sg.tensors = []
            for t in g.tensors:
                tt = schema.Tensor.TensorT()
                tt.name, tt.shape, tt.type = t.name, list(t.shape), tensor_type(t.dtype)
                if t.quantization is not None:
                    tt.quantization = _quantization_object(t.quantization)
                if t.data is not None:
                    b = schema.Buffer.BufferT()
                    b.data = np.ascontiguousarray(t.data).view(np.uint8).ravel()
                    m.buffers.append(b)
                    tt.buffer = len(m.buffers) - 1
                sg.tensors.append(tt)
            sg.inputs, sg.outputs = list(g.inputs), list(g.outputs)
            sg.operators = []
            for o in g.ops:
                key = (o.type, o.custom_code, o.version)
                if key not in codes:
                    codes[key] = len(m.operatorCodes)
                    m.operatorCodes.append(opcode_object(OPERATOR_CODES[o.type], o.custom_code,
                                                         o.version))
                op = schema.Operator.OperatorT()
                op.opcodeIndex = codes[key]
                op.inputs, op.outputs = list(o.inputs), list(o.outputs)
                if o.options is not None:
                    op.builtinOptionsType, op.builtinOptions = o.options_tag, o.options
                if o.custom_options is not None:
                    op.customOptions = np.frombuffer(o.custom_options, np.uint8)
                sg.operators.append(op)
            m.subgraphs.append(sg)
        return m

    def to_bytes(self, file_format: str = "circle") -> bytes:
        """The model as ``"circle"`` (CIR0) or ``"tflite"`` (TFL3, version 3) bytes."""
        return pack(self.to_object(), file_format)

    def save(self, path: str | os.PathLike, file_format: str | None = None) -> None:
        """Write the model; the format follows the extension unless given."""
        from .formats.atomic import atomic_write

        path = os.fspath(path)
        fmt = file_format or ("tflite" if path.endswith(".tflite") else "circle")
        atomic_write(path, self.to_bytes(fmt))


def _dtype_name(dtype: Any) -> str:
    name = np.dtype(dtype).name
    return name


def _options_object(op_type: str, tag: int, options: Mapping[str, Any]) -> Any:
    if not tag:
        if options:
            raise ValueError(f"{op_type} takes no options, got {sorted(options)}")
        return None
    obj = options_class(tag)()
    from .formats.schema import camel_case

    valid = {k for k in vars(obj)}
    for key, value in options.items():
        attr = camel_case(key)
        if attr not in valid:
            from .formats.schema import snake_case

            raise ValueError(
                f"{op_type} has no option {key!r}; valid: {sorted(snake_case(v) for v in valid)}"
            )
        enum = _OP_ENUMS.get((op_type, key), _ENUMS.get(key))
        if isinstance(value, str) and enum is not None:
            value = getattr(enum, value.upper())
        elif key in _DTYPE_OPTIONS and not isinstance(value, int):
            value = tensor_type(value)
        elif isinstance(value, (tuple, np.ndarray)):
            value = list(np.asarray(value).tolist())
        setattr(obj, attr, value)
    return obj


def _quantization_object(q: ir.Quantization) -> Any:
    """circle-schema's ``QuantizationParametersT`` of ``q``."""
    t = schema.QuantizationParameters.QuantizationParametersT()
    t.scale = [float(v) for v in q.scale]
    t.zeroPoint = [int(v) for v in q.zero_point]
    t.quantizedDimension = q.quantized_dimension
    return t
