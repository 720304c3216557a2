"""Write models: any IR model as .circle / .tflite bytes, everything of its source preserved.

:func:`write_model` starts from the object tree of the bytes the model was read from
(``ir.Model.source``; an empty model when it has none) and applies what differs in the IR:

- subgraphs, tensors and operators are written in the IR's order; one with an ``origin``
  starts as a copy of that source element, so every field the IR does not model (sparsity,
  ``hasRank``, variant tensors, intermediates, debug metadata, an options table's unknown
  fields) is kept, and only the fields whose IR value differs from what the reader read
  are set; one without is built from the IR alone;
- a constant whose data equals its source buffer keeps that buffer (shared buffers stay
  shared); otherwise its data is written in place when it is the buffer's only reader, and
  into a new buffer when the buffer is shared, is buffer 0 or is ``ir.NEW_BUFFER``;
- operator codes: an operator keeps its code's index while its (code, custom code,
  version) is unchanged, else takes the first equal code of the table or a new one;
- signature defs are written in the IR's order, each from the source one of its key;
  metadata entries whose bytes change (or ``metadata=`` replaces) move to new buffers.

Source buffers no tensor reads any more are kept; data stored past the FlatBuffer (large
models) is moved inside it. Nothing is renumbered behind the IR's back: indices the IR
does not model (an operator's ``intermediates``) still name source tensors.
"""

from __future__ import annotations

import copy
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import flatbuffers
import numpy as np

from ..graph import ir
from .packed import pack_values
from .reader import model_from_object, unpack
from .schema import (
    CIRCLE_IDENTIFIER,
    QUANTIZATION_DETAILS,
    TFLITE_IDENTIFIER,
    builtin_code,
    options_class,
    options_tag,
    schema,
    snake_case,
    tensor_type,
)
from .strings import encode_strings

TensorKey = tuple[int, int]  # (subgraph index, tensor index)


def pack(model_object: Any, file_format: str) -> bytes:
    """Serialize circle-schema's ``ModelT`` as ``"circle"`` (CIR0) or ``"tflite"`` (TFL3, v3).

    LiteRT only reads identifier TFL3 with ``Model.version == 3``; Circle files keep their own
    version (0 when none was set).
    """
    if file_format not in ("circle", "tflite"):
        raise ValueError(f"unknown model format {file_format!r} (expected 'circle' or 'tflite')")
    if file_format == "tflite":
        model_object.version = 3
    builder = flatbuffers.Builder(1024 * 1024)
    root = model_object.Pack(builder)
    ident = CIRCLE_IDENTIFIER if file_format == "circle" else TFLITE_IDENTIFIER
    builder.Finish(root, file_identifier=ident)
    return bytes(builder.Output())


def write_model(model: ir.Model, file_format: str | None = None,
                metadata: Mapping[str, bytes | None] | None = None, *,
                share_equal_buffers: bool = False) -> bytes:
    """The bytes of ``model`` as ``"circle"`` or ``"tflite"`` (default: its own format); see
    the module docstring for what is kept. ``metadata`` adds or replaces named metadata
    buffers (``None`` removes one). ``share_equal_buffers``: constants (not variables)
    whose new buffers hold equal bytes read one buffer."""
    file_format = file_format or model.format
    return pack(model_object(model, metadata, file_format, share_equal_buffers),
                file_format)


def export_model(
    model: ir.Model,
    weights: Mapping[TensorKey, np.ndarray] | None = None,
    *,
    file_format: str | None = None,
    metadata: Mapping[str, bytes | None] | None = None,
) -> bytes:
    """The bytes of ``model`` with constant tensors replaced by ``weights``.

    ``weights`` maps (subgraph, tensor) to arrays of the tensor's shape; they are stored in
    the tensor's own dtype. Everything else is written as :func:`write_model` writes it.
    """
    return write_model(with_weights(model, weights or {}), file_format, metadata)


def with_weights(model: ir.Model, weights: Mapping[TensorKey, np.ndarray]) -> ir.Model:
    """``model`` with the data of constant tensors (subgraph, tensor) replaced, in their
    own dtype; a ValueError names a tensor given an array of another shape."""
    changed: dict[int, dict[int, np.ndarray]] = {}
    for (k, i), value in weights.items():
        tensor = model.subgraphs[k].tensors[i]
        arr = np.asarray(value)
        if arr.shape != tensor.shape:
            raise ValueError(f"weight for tensor {tensor.name!r} has shape {list(arr.shape)}, "
                             f"expected {list(tensor.shape)}")
        changed.setdefault(k, {})[i] = arr.astype(ir.as_numpy_dtype(tensor.dtype))
    if not changed:
        return model
    subgraphs = tuple(
        sg if sg.index not in changed else replace(sg, tensors=tuple(
            replace(t, data=changed[sg.index][t.index]) if t.index in changed[sg.index]
            else t for t in sg.tensors))
        for sg in model.subgraphs)
    return replace(model, subgraphs=subgraphs)


def model_object(model: ir.Model, metadata: Mapping[str, bytes | None] | None = None,
                 file_format: str | None = None, share_equal_buffers: bool = False) -> Any:
    """circle-schema's ``ModelT`` of ``model`` (see the module docstring), its tensor types
    and quantization details coded by the schema of ``file_format`` (default: the model's)."""
    identifier = CIRCLE_IDENTIFIER if (file_format or model.format) == "circle" \
        else TFLITE_IDENTIFIER
    if model.source:
        m = unpack(model.source)
        _inline_external_buffers(m, model.source)
        before: ir.Model | None = model_from_object(m, model.source, max_elements=sys.maxsize)
    else:
        m, before = schema.Model.ModelT(), None
        m.buffers = [schema.Buffer.BufferT()]  # buffer 0: the empty buffer, by convention
    m.buffers = m.buffers or []
    if before is None or model.version != before.version:
        m.version = model.version
    if before is None or model.description != before.description:
        m.description = model.description
    users = Counter(t.buffer for sg in model.subgraphs for t in sg.tensors)
    users.update(e.buffer for e in m.metadata or [])
    codes = _Codes(m)
    sources = m.subgraphs or []
    first_new = len(m.buffers)
    m.subgraphs = [_subgraph(sg, before, sources, m.buffers, users, codes, identifier)
                   for sg in model.subgraphs]
    if share_equal_buffers:
        _share_equal_buffers(m, first_new)
    signatures = _signatures(model, before, m.signatureDefs or [])
    m.signatureDefs = signatures if signatures or m.signatureDefs is not None else None
    wanted = {**model.metadata, **(metadata or {})}
    for name, payload in wanted.items():
        if payload is None or payload != _metadata(m, name):
            _set_metadata(m, name, payload)
    for e in m.metadata or []:
        if _name(e.name) not in wanted:
            _set_metadata(m, _name(e.name), None)
    return m


def _subgraph(sg: ir.Subgraph, before: ir.Model | None, sources: list[Any], buffers: list[Any],
              users: Counter, codes: _Codes, identifier: bytes) -> Any:
    old = None if before is None or sg.origin is None else before.subgraphs[sg.origin]
    if old is None:
        obj, tensors, ops = schema.SubGraph.SubGraphT(), [], []
    else:
        obj = copy.copy(sources[sg.origin])
        tensors, ops = obj.tensors or [], obj.operators or []
    obj.tensors = [
        _tensor(t, None, schema.Tensor.TensorT(), buffers, users, identifier)
        if old is None or t.origin is None else
        _tensor(t, old.tensors[t.origin], copy.copy(tensors[t.origin]), buffers, users,
                identifier)
        for t in sg.tensors]
    obj.operators = [
        _operator(op, None, schema.Operator.OperatorT(), codes)
        if old is None or op.origin is None else
        _operator(op, old.operators[op.origin], copy.copy(ops[op.origin]), codes)
        for op in sg.operators]
    for field in ("inputs", "outputs"):
        if old is None or getattr(sg, field) != getattr(old, field):
            setattr(obj, field, list(getattr(sg, field)))
    if old is None or sg.name != old.name:
        obj.name = sg.name
    return obj


def _tensor(t: ir.Tensor, old: ir.Tensor | None, obj: Any, buffers: list[Any],
            users: Counter, identifier: bytes) -> Any:
    def changed(field: str) -> bool:
        return old is None or getattr(t, field) != getattr(old, field)

    if changed("name"):
        obj.name = t.name
    if changed("shape"):
        obj.shape = list(t.shape)
    if not t.dtype.startswith("unknown"):  # coded anew: the target's schema may differ
        stored = t.quantization.storage if t.quantization is not None else ""
        obj.type = tensor_type(stored or t.dtype, identifier)
    if changed("shape_signature"):
        obj.shapeSignature = None if t.shape_signature is None else list(t.shape_signature)
    if changed("is_variable"):
        obj.isVariable = t.is_variable
    if changed("quantization") or (t.quantization is not None and t.quantization.blockwise):
        obj.quantization = _quantization(t.quantization, identifier)
    obj.buffer = _buffer(t, buffers, users)
    return obj


def _quantization(q: ir.Quantization | None, identifier: bytes) -> Any:
    if q is None:
        return None
    if q.other_details:
        raise ValueError(f"cannot write {q.other_details} quantization details")
    obj = schema.QuantizationParameters.QuantizationParametersT()
    # empty vectors are left out, as a blockwise tensor's are in the quantizer's files
    obj.scale, obj.zeroPoint = list(q.scale) or None, list(q.zero_point) or None
    obj.quantizedDimension = q.quantized_dimension
    if q.blockwise is not None:
        details = schema.BlockwiseQuantization.BlockwiseQuantizationT()
        b = q.blockwise
        details.scales, details.zeroPoints, details.blockSize = \
            b.scales, b.zero_points, b.block_size
        tags = QUANTIZATION_DETAILS[identifier]
        obj.detailsType = next(tag for tag, kind in tags.items() if kind == "blockwise")
        obj.details = details
    return obj


def _buffer(t: ir.Tensor, buffers: list[Any], users: Counter) -> int:
    """The buffer ``t`` is written with (see the module docstring)."""
    b = t.buffer
    if t.data is None:
        return max(b, 0)
    data = pack_values(t.data, t.dtype) if t.dtype in ir.PACKED_BITS else \
        encode_strings(t.data) if t.dtype == "string" else \
        np.ascontiguousarray(t.data, ir.as_numpy_dtype(t.dtype)).reshape(-1).view(np.uint8)
    if 0 <= b < len(buffers) and np.array_equal(_buffer_data(buffers[b]), data):
        return b
    if 0 < b < len(buffers) and users[b] == 1:
        buffers[b].data = data
        return b
    users[b] -= 1
    new = schema.Buffer.BufferT()
    new.data = data
    buffers.append(new)
    users[len(buffers) - 1] = 1
    return len(buffers) - 1


def _share_equal_buffers(m: Any, first_new: int) -> None:
    """Point each constant reading a new buffer (index ``first_new`` on) at the first new
    buffer of equal bytes, and drop the buffers no tensor reads any more."""
    first: dict[bytes, int] = {}
    target = list(range(len(m.buffers)))
    for b in range(first_new, len(m.buffers)):
        target[b] = first.setdefault(_buffer_data(m.buffers[b]).tobytes(), b)
    read = set(range(first_new))
    for sg in m.subgraphs:
        for t in sg.tensors or []:
            if t.buffer >= first_new and not t.isVariable:
                t.buffer = target[t.buffer]
            read.add(t.buffer)
    kept = [b for b in range(len(m.buffers)) if b in read]
    index = {b: k for k, b in enumerate(kept)}
    m.buffers = [m.buffers[b] for b in kept]
    for sg in m.subgraphs:
        for t in sg.tensors or []:
            t.buffer = index[t.buffer]


def _buffer_data(b: Any) -> np.ndarray:
    return np.zeros(0, np.uint8) if b.data is None else np.asarray(b.data, np.uint8)


def _operator(op: ir.Operator, old: ir.Operator | None, obj: Any, codes: _Codes) -> Any:
    if old is None or (op.code, op.custom_code, op.version) != (
            old.code, old.custom_code, old.version):
        obj.opcodeIndex = codes.index(op.code, op.custom_code, op.version)
    for field in ("inputs", "outputs"):
        if old is None or getattr(op, field) != getattr(old, field):
            setattr(obj, field, list(getattr(op, field)))
    if old is None or op.custom_options != old.custom_options:
        obj.customOptions = (None if op.custom_options is None
                             else np.frombuffer(op.custom_options, np.uint8))
    if old is None or dict(op.options) != dict(old.options):
        _set_options(op, old, obj)
    return obj


def _set_options(op: ir.Operator, old: ir.Operator | None, obj: Any) -> None:
    """Write the IR options that differ into the operator's options table (a new one of the
    operator's type when it has none). A new operator (``old`` None) of a type that has an
    options table always gets one, defaults included, as TF's converter writes them: onert's
    loader reads the table of such an operator without checking that it is there."""
    second = obj.builtinOptions is None and obj.builtinOptions2 is not None
    table = copy.copy(obj.builtinOptions2 if second else obj.builtinOptions)
    if table is None:
        tag = options_tag(op.type)
        if not op.options and (old is not None or not tag):
            return
        if not tag:
            raise ValueError(f"operator {op.index} ({op.key}) has options "
                             f"{sorted(op.options)} but {op.type} takes none")
        table = options_class(tag)()
        obj.builtinOptionsType = tag
    attrs = {snake_case(a): a for a in vars(table)}
    previous = old.options if old is not None else {}
    for key, value in op.options.items():
        if key in previous and previous[key] == value:
            continue
        if key not in attrs:
            raise ValueError(f"operator {op.index} ({op.key}) has no option {key!r}; "
                             f"its table has {sorted(attrs)}")
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, str) and isinstance(getattr(table, attrs[key]), bytes):
            value = value.encode()
        setattr(table, attrs[key], value)
    if second:
        obj.builtinOptions2 = table
    else:
        obj.builtinOptions = table


class _Codes:
    """The model's operator code table: the index of a (code, custom code, version)."""

    def __init__(self, m: Any) -> None:
        m.operatorCodes = m.operatorCodes or []
        self.table = m.operatorCodes
        self.found: dict[tuple[int, str | None, int], int] = {}
        for i, c in enumerate(self.table):
            code = builtin_code(c.deprecatedBuiltinCode, c.builtinCode)
            custom = None if c.customCode is None else _name(c.customCode)
            self.found.setdefault((int(code), custom, int(c.version)), i)

    def index(self, code: int, custom_code: str | None, version: int) -> int:
        key = (code, custom_code, version)
        if key not in self.found:
            self.found[key] = len(self.table)
            self.table.append(opcode_object(code, custom_code, version))
        return self.found[key]


def opcode_object(code: int, custom_code: str | None, version: int) -> Any:
    """An ``OperatorCodeT``: Circle's negative codes and codes from 127 on are stored in
    ``builtinCode`` with 127 in the deprecated byte."""
    oc = schema.OperatorCode.OperatorCodeT()
    oc.builtinCode = code
    oc.deprecatedBuiltinCode = code if 0 <= code < 127 else 127
    oc.customCode, oc.version = custom_code, version
    return oc


def _signatures(model: ir.Model, before: ir.Model | None, sources: list[Any]) -> list[Any]:
    old = {s.key: s for s in (before.signature_defs if before is not None else ())}
    objs = {_name(s.signatureKey): s for s in sources}
    out = []
    for s in model.signature_defs:
        prev = old.get(s.key)
        obj = copy.copy(objs[s.key]) if prev is not None else schema.SignatureDef.SignatureDefT()
        if prev is None:
            obj.signatureKey = s.key
        if prev is None or prev.subgraph_index != s.subgraph_index:
            obj.subgraphIndex = s.subgraph_index
        for field in ("inputs", "outputs"):
            if prev is None or dict(getattr(prev, field)) != dict(getattr(s, field)):
                setattr(obj, field, [_tensor_map(n, i) for n, i in getattr(s, field).items()])
        out.append(obj)
    return out


def _tensor_map(name: str, index: int) -> Any:
    t = schema.TensorMap.TensorMapT()
    t.name, t.tensorIndex = name, index
    return t


def _inline_external_buffers(m: Any, source: bytes) -> None:
    for b in m.buffers or []:
        if b.offset > 1:
            b.data = np.frombuffer(source[b.offset : b.offset + b.size], np.uint8)
            b.offset, b.size = 0, 0


def _metadata(m: Any, name: str) -> bytes | None:
    for e in m.metadata or []:
        if _name(e.name) == name:
            return _buffer_data(m.buffers[e.buffer]).tobytes()
    return None


def _set_metadata(m: Any, name: str, payload: bytes | None) -> None:
    entries = [e for e in (m.metadata or []) if _name(e.name) != name]
    if payload is not None:
        buf = schema.Buffer.BufferT()
        buf.data = np.frombuffer(payload, np.uint8)
        m.buffers.append(buf)
        entry = schema.Metadata.MetadataT()
        entry.name, entry.buffer = name, len(m.buffers) - 1
        entries.append(entry)
    m.metadata = entries or None


def _name(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
