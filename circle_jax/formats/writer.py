"""Write models back: new weights into the original bytes, everything else preserved."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flatbuffers
import numpy as np

from .. import ir
from .reader import unpack
from .schema import CIRCLE_IDENTIFIER, TFLITE_IDENTIFIER, schema

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


def export_model(
    model: ir.Model,
    weights: Mapping[TensorKey, np.ndarray] | None = None,
    *,
    file_format: str | None = None,
    metadata: Mapping[str, bytes | None] | None = None,
) -> bytes:
    """The bytes of ``model`` with constant tensors replaced by ``weights``.

    ``weights`` maps (subgraph, tensor) to arrays of the tensor's shape; they are stored in
    the tensor's own dtype. ``metadata`` adds or replaces named metadata buffers (``None``
    removes one). Operators, tensors, names, signature defs and other metadata are kept.
    """
    m = unpack(model.source)
    _inline_external_buffers(m, model.source)
    users: dict[int, int] = {}
    for sg in m.subgraphs or []:
        for t in sg.tensors or []:
            users[t.buffer] = users.get(t.buffer, 0) + 1
    for (k, i), value in (weights or {}).items():
        tensor = model.subgraphs[k].tensors[i]
        arr = np.asarray(value)
        if arr.shape != tensor.shape:
            raise ValueError(
                f"weight for tensor {tensor.name!r} has shape {list(arr.shape)}, "
                f"expected {list(tensor.shape)}"
            )
        data = np.ascontiguousarray(arr.astype(ir.as_numpy_dtype(tensor.dtype))).view(np.uint8)
        t = m.subgraphs[k].tensors[i]
        if users.get(t.buffer, 0) > 1 or t.buffer == 0:  # shared buffer: give it its own
            users[t.buffer] -= 1
            m.buffers.append(schema.Buffer.BufferT())
            t.buffer = len(m.buffers) - 1
            users[t.buffer] = 1
        m.buffers[t.buffer].data = data.ravel()
    for name, payload in (metadata or {}).items():
        _set_metadata(m, name, payload)
    return pack(m, file_format or model.format)


def _inline_external_buffers(m: Any, source: bytes) -> None:
    for b in m.buffers or []:
        if b.offset > 1:
            b.data = np.frombuffer(source[b.offset : b.offset + b.size], np.uint8)
            b.offset, b.size = 0, 0


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
