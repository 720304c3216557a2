"""TensorFlow's protobuf messages without TensorFlow: NodeDef, AttrValue, TensorProto and the
messages of TF's V1 checkpoints, with TensorProto <-> numpy.

NodeDef, AttrValue, TensorProto, TensorShapeProto, DataType and VersionDef are tensorboardX's
generated modules (``tensorboardX.proto``: the same wire format as TensorFlow's own, proto
package ``tensorboardX``). No package ships ``saved_tensor_slice.proto``, so its four messages
(and ``TensorSliceProto``) are declared here as a ``FileDescriptorProto`` on top of them and
built by protobuf's message factory; their field numbers are TensorFlow's:

- ``TensorSliceProto {repeated Extent extent = 1}``, ``Extent {int64 start = 1; oneof
  has_length {int64 length = 2}}`` (an extent without length is the whole dimension);
- ``SavedSliceMeta {string name = 1; TensorShapeProto shape = 2; DataType type = 3;
  repeated TensorSliceProto slice = 4}``;
- ``SavedTensorSliceMeta {repeated SavedSliceMeta tensor = 1; VersionDef versions = 2}``;
- ``SavedSlice {string name = 1; TensorSliceProto slice = 2; TensorProto data = 3}``;
- ``SavedTensorSlices {SavedTensorSliceMeta meta = 1; SavedSlice data = 2}``.

Element types: a TF ``DataType`` is named by its numpy dtype name (``float32``, ``int64``,
``bool``; ``bfloat16`` is ml_dtypes', which JAX ships) or, for types numpy has none of, by
TF's own lower-case name without ``DT_`` (``string``, ``resource``, ``variant``, ``qint8``).
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tensorboardX.proto import (  # noqa: F401  (tensor_shape, versions: the pool needs them)
    attr_value_pb2,
    node_def_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
    versions_pb2,
)

from circle_jax.errors import CircleFormatError

NodeDef = node_def_pb2.NodeDef
AttrValue = attr_value_pb2.AttrValue
TensorProto = tensor_pb2.TensorProto

_PACKAGE = "circle_jax.tf"


def _saved_tensor_slice_file() -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of TF's saved_tensor_slice.proto (and tensor_slice.proto) messages."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(
        name="circle_jax/tf/saved_tensor_slice.proto", package=_PACKAGE, syntax="proto3",
        dependency=["tensorboardX/proto/tensor.proto", "tensorboardX/proto/tensor_shape.proto",
                    "tensorboardX/proto/types.proto", "tensorboardX/proto/versions.proto"])

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> Any:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            m.field.add(name=fname, number=number, type=ftype, label=label,
                        **({"type_name": type_name} if type_name else {}))
        return m

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg, i64, string, enum = F.TYPE_MESSAGE, F.TYPE_INT64, F.TYPE_STRING, F.TYPE_ENUM
    slice_ = message("TensorSliceProto", ("extent", 1, msg, many,
                                          f".{_PACKAGE}.TensorSliceProto.Extent"))
    extent = slice_.nested_type.add(name="Extent")
    extent.field.add(name="start", number=1, type=i64, label=one)
    extent.oneof_decl.add(name="has_length")
    extent.field.add(name="length", number=2, type=i64, label=one, oneof_index=0)
    message("SavedSliceMeta", ("name", 1, string, one, ""),
            ("shape", 2, msg, one, ".tensorboardX.TensorShapeProto"),
            ("type", 3, enum, one, ".tensorboardX.DataType"),
            ("slice", 4, msg, many, f".{_PACKAGE}.TensorSliceProto"))
    message("SavedTensorSliceMeta", ("tensor", 1, msg, many, f".{_PACKAGE}.SavedSliceMeta"),
            ("versions", 2, msg, one, ".tensorboardX.VersionDef"))
    message("SavedSlice", ("name", 1, string, one, ""),
            ("slice", 2, msg, one, f".{_PACKAGE}.TensorSliceProto"),
            ("data", 3, msg, one, ".tensorboardX.TensorProto"))
    message("SavedTensorSlices", ("meta", 1, msg, one, f".{_PACKAGE}.SavedTensorSliceMeta"),
            ("data", 2, msg, one, f".{_PACKAGE}.SavedSlice"))
    return f


def _message_classes() -> dict[str, Any]:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName("circle_jax/tf/saved_tensor_slice.proto")
    except KeyError:
        pool.Add(_saved_tensor_slice_file())
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in ("TensorSliceProto", "SavedSliceMeta", "SavedTensorSliceMeta",
                     "SavedSlice", "SavedTensorSlices")}


_CLASSES = _message_classes()
TensorSliceProto = _CLASSES["TensorSliceProto"]
SavedSliceMeta = _CLASSES["SavedSliceMeta"]
SavedTensorSliceMeta = _CLASSES["SavedTensorSliceMeta"]
SavedSlice = _CLASSES["SavedSlice"]
SavedTensorSlices = _CLASSES["SavedTensorSlices"]

_NUMPY_TYPES: dict[int, str] = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 8: "complex64",
    9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 18: "complex128", 19: "float16",
    22: "uint32", 23: "uint64",
}
_OTHER_TYPES: dict[int, str] = {
    7: "string", 11: "qint8", 12: "quint8", 13: "qint32", 15: "qint16", 16: "quint16",
    20: "resource", 21: "variant",
}
_CODES = {name: code for code, name in {**_NUMPY_TYPES, **_OTHER_TYPES}.items()}


def dtype_name(code: int) -> str:
    """The name of TF DataType ``code`` (see the module's docstring); a reference type
    (``DT_FLOAT_REF``, code + 100) is named as its value type."""
    code = code - 100 if code > 100 else code
    name = _NUMPY_TYPES.get(code) or _OTHER_TYPES.get(code)
    if name is None:
        raise CircleFormatError(f"unknown TensorFlow DataType {code}")
    return name


def dtype_code(dtype: Any) -> int:
    """The TF DataType code of a numpy dtype (bytes/str arrays: ``DT_STRING``) or type name."""
    if isinstance(dtype, str) and dtype in _CODES:
        return _CODES[dtype]
    dt = np.dtype(dtype)
    if dt.kind in "SUO":
        return _CODES["string"]
    if dt.name not in _CODES:
        raise CircleFormatError(f"numpy dtype {dt.name} has no TensorFlow DataType")
    return _CODES[dt.name]


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a type name (``string``: object, holding bytes)."""
    if name == "string":
        return np.dtype(object)
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    if name not in _CODES or _CODES[name] not in _NUMPY_TYPES:
        raise CircleFormatError(f"TensorFlow type {name} has no numpy array form")
    return np.dtype(name)


def shape_of(proto: Any) -> tuple[int, ...] | None:
    """A TensorShapeProto as a tuple (-1: an unknown dimension), None for an unknown rank."""
    if proto.unknown_rank:
        return None
    return tuple(int(d.size) for d in proto.dim)


# The TensorProto field holding each element type's values (TF's tensor.proto), and what a
# value of it becomes: half-precision types keep their bit patterns in int32s.
_VALUE_FIELDS: dict[str, str] = {
    "float32": "float_val", "float64": "double_val", "int32": "int_val", "int16": "int_val",
    "int8": "int_val", "uint8": "int_val", "uint16": "int_val", "int64": "int64_val",
    "bool": "bool_val", "complex64": "scomplex_val", "complex128": "dcomplex_val",
    "float16": "half_val", "bfloat16": "half_val", "string": "string_val",
}


def array_from_proto(proto: Any, dtype: str | None = None,
                     shape: tuple[int, ...] | None = None, what: str = "tensor",
                     max_elements: int | None = None) -> np.ndarray:
    """A TensorProto's values as a numpy array of ``dtype`` and ``shape`` (by default the
    proto's own ``dtype`` and ``tensor_shape``; a checkpoint's slices carry neither).

    The values are ``tensor_content`` (raw little-endian bytes) when present, else the type's
    repeated field; as TF reads them, fewer values than elements repeat the last one (none:
    zeros), more is an error. Filling can make an array far larger than ``proto``: a shape of
    more than ``max_elements`` elements is refused (callers bound it by their file's size)."""
    dtype = dtype or dtype_name(proto.dtype)
    if shape is None:
        shape = shape_of(proto.tensor_shape)
        if shape is None or min(shape, default=0) < 0:
            raise CircleFormatError(f"{what}: a TensorProto without a complete shape")
    n = math.prod(shape)
    if max_elements is not None and n > max_elements:
        raise CircleFormatError(f"{what}: a tensor of shape {list(shape)} ({n} elements) is "
                                f"larger than its file allows ({max_elements})")
    np_dtype = numpy_dtype(dtype)
    if proto.tensor_content:
        if dtype == "string":
            raise CircleFormatError(f"{what}: string values cannot be raw tensor_content")
        if len(proto.tensor_content) != n * np_dtype.itemsize:
            raise CircleFormatError(
                f"{what}: tensor_content holds {len(proto.tensor_content)} bytes, expected "
                f"{n * np_dtype.itemsize} for {dtype} {list(shape)}")
        return np.frombuffer(proto.tensor_content, np_dtype.newbyteorder("<")).astype(
            np_dtype).reshape(shape)
    field = _VALUE_FIELDS.get(dtype)
    if field is None:
        raise CircleFormatError(f"{what}: TensorFlow type {dtype} is not supported here")
    values = list(getattr(proto, field))
    if dtype.startswith("complex"):
        values = [complex(r, i) for r, i in zip(values[0::2], values[1::2])]
    if len(values) > n:
        raise CircleFormatError(f"{what}: {len(values)} values for {n} elements "
                                f"({dtype} {list(shape)})")
    if dtype in ("float16", "bfloat16"):
        out = np.asarray(values, np.uint16).view(np_dtype)
    elif dtype == "string":
        out = np.empty(len(values), object)
        out[:] = values
    else:
        out = np.asarray(values, np_dtype)
    if len(values) < n:
        fill = out[-1] if len(values) else (b"" if dtype == "string" else np_dtype.type(0))
        out = np.concatenate([out, np.full(n - len(values), fill, np_dtype)])
    return out.reshape(shape)


def fill_values(proto: Any, array: np.ndarray) -> None:
    """Set ``proto``'s typed value field to ``array``'s elements in row-major order, as TF's
    checkpoint writer does (no ``tensor_content``, no dtype or shape: the metadata has them)."""
    name = dtype_name(dtype_code(array.dtype))
    field = _VALUE_FIELDS.get(name)
    if field is None:
        raise CircleFormatError(f"TensorFlow type {name} cannot be written to a checkpoint")
    flat = array.reshape(-1)
    if name in ("float16", "bfloat16"):
        values: Any = flat.view(np.uint16).astype(np.int32)
    elif name.startswith("complex"):
        values = np.stack([flat.real, flat.imag], axis=-1).reshape(-1)
    elif name == "string":
        values = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
    else:
        values = flat
    getattr(proto, field).extend(values.tolist() if isinstance(values, np.ndarray) else values)
