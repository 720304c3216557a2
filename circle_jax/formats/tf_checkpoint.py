"""TensorFlow's V1 checkpoint: what ``tf.raw_ops.Save`` writes and ``Restore`` reads, as the
Flex ``Save``/``Restore`` operators of LiteRT's on-device training files use it.

One file, a LevelDB table (:mod:`circle_jax.formats.leveldb_table`). Its first key, ``""``,
holds a ``SavedTensorSlices`` whose ``meta`` lists every tensor (name, shape, type and its
slices; TF sorts them by name) and ``versions {producer: 1}``. Then one entry per tensor
slice, its value a ``SavedTensorSlices`` whose ``data`` is a ``SavedSlice`` (name, slice and
a ``TensorProto`` with the values in the type's repeated field, no dtype, no shape). A slice's
key is TF's OrderedCode of (0, name, rank, then per dimension start and length): a
0 byte; the name with 0x00 escaped as 00 ff and 0xff as ff 00, ended by 00 01; the rank as an
increasing number (its byte count, then big-endian bytes); a whole dimension's start 0 and
length -1 as signed increasing numbers, 0x80 and 0x7f. ``Save`` writes whole tensors only;
slices of a partitioned tensor (``SaveSlices``) are assembled when read.

A TF V2 checkpoint (``tf.train.Checkpoint``, ``SaveV2``: an ``.index`` table plus ``.data``
shards) is told apart and refused. Allocation is bounded by the file: all tensors together
hold no more elements than the file has bytes (each element is at least one byte of it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from circle_jax.errors import CircleFormatError, DataError
from circle_jax.formats import tf_proto
from circle_jax.formats.atomic import atomic_write
from circle_jax.formats.leveldb_table import build_table, read_table
from circle_jax.formats.reader import MAX_RANK, read_regular_file

_PRODUCER = 1
"""TF_CHECKPOINT_VERSION, the ``versions.producer`` TF's writer records."""

_WHAT = "TensorFlow V1 checkpoint"

_REFUSED = {14: "bfloat16"}
"""Types TF 2.21's Save and Restore refuse ("Saving data type bfloat16 not yet supported")."""


def _name_key(name: str, rank: int) -> bytes:
    """The table key of a whole tensor's slice (OrderedCode; see the module's docstring)."""
    escaped = b"".join(b"\x00\xff" if c == 0 else b"\xff\x00" if c == 0xFF else bytes([c])
                       for c in name.encode())
    count = (rank.bit_length() + 7) // 8
    return (b"\x00" + escaped + b"\x00\x01" + bytes([count]) + rank.to_bytes(count, "big")
            + b"\x80\x7f" * rank)


def encode_checkpoint(tensors: Mapping[str, Any]) -> bytes:
    """The bytes of a V1 checkpoint holding ``tensors`` (name -> array), as TF's Save makes
    them: names sorted, one whole slice each."""
    arrays = {str(k): np.asarray(v) for k, v in tensors.items()}
    meta = tf_proto.SavedTensorSlices()
    entries: list[tuple[bytes, bytes]] = []
    for name in sorted(arrays, key=str.encode):
        a = arrays[name]
        if a.dtype.kind == "O" and not all(isinstance(v, (bytes, str)) for v in a.flat):
            raise DataError(f"tensor {name!r}: an object array must hold bytes or str")
        try:
            code = tf_proto.dtype_code(a.dtype)
        except CircleFormatError as e:
            raise DataError(f"tensor {name!r}: {e}") from None
        if code in _REFUSED:
            raise DataError(f"tensor {name!r} is {_REFUSED[code]}, which TensorFlow's V1 "
                            "checkpoints do not take (TF's Save and Restore refuse it)")
        t = meta.meta.tensor.add(name=name, type=code)
        t.shape.SetInParent()
        for d in a.shape:
            t.shape.dim.add(size=d)
        full = t.slice.add()
        for _ in a.shape:
            full.extent.add()
        entry = tf_proto.SavedTensorSlices()
        entry.data.name = name
        entry.data.slice.CopyFrom(full)
        entry.data.data.SetInParent()
        try:
            tf_proto.fill_values(entry.data.data, a)
        except CircleFormatError as e:
            raise DataError(f"tensor {name!r}: {e}") from None
        entries.append((_name_key(name, a.ndim), entry.SerializeToString()))
    meta.meta.versions.producer = _PRODUCER
    return build_table([(b"", meta.SerializeToString()), *entries])


def write_checkpoint(path: str | os.PathLike, tensors: Mapping[str, Any]) -> None:
    """Write ``tensors`` (name -> array) to ``path`` as a V1 checkpoint (atomically)."""
    atomic_write(path, encode_checkpoint(tensors))


def _parse(value: bytes, where: str, what: str) -> Any:
    try:
        return tf_proto.SavedTensorSlices.FromString(value)
    except DecodeError:
        raise CircleFormatError(f"{where}: {what} is not a SavedTensorSlices message "
                                "(the file is corrupted)") from None


def _extents(s: Any, shape: tuple[int, ...], name: str, where: str) -> tuple[slice, ...]:
    """The index of slice ``s`` (a TensorSliceProto) in a tensor of ``shape``."""
    if len(s.extent) != len(shape):
        raise CircleFormatError(f"{where}: tensor {name!r} has a slice of rank "
                                f"{len(s.extent)}, its shape {list(shape)} rank {len(shape)}")
    index = []
    for e, n in zip(s.extent, shape):
        if not e.HasField("length"):
            index.append(slice(0, n))
        elif e.start < 0 or e.length < 0 or e.start + e.length > n:
            raise CircleFormatError(f"{where}: tensor {name!r} has a slice "
                                    f"[{e.start}, +{e.length}) outside its dimension of {n}")
        else:
            index.append(slice(e.start, e.start + e.length))
    return tuple(index)


def decode_checkpoint(buf: bytes, where: str = "<checkpoint bytes>") -> dict[str, np.ndarray]:
    """Every tensor of the V1 checkpoint in ``buf``, by name (see the module's docstring)."""
    entries = read_table(buf, where, _WHAT)
    if not entries or entries[0][0] != b"":
        raise CircleFormatError(f"{where} is a LevelDB table without the SavedTensorSlices "
                                f"metadata (key \"\") that a {_WHAT} begins with")
    if any(not key.startswith(b"\x00") for key, _ in entries[1:]):
        raise CircleFormatError(
            f"{where} looks like a TensorFlow V2 checkpoint's .index (keys are plain tensor "
            "names); circle-jax reads V1 checkpoints, as tf.raw_ops.Save writes them")
    meta = _parse(entries[0][1], where, "its metadata").meta
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    total = 0
    for t in meta.tensor:
        shape = tf_proto.shape_of(t.shape)
        if shape is None or len(shape) > MAX_RANK or min(shape, default=0) < 0:
            raise CircleFormatError(f"{where}: tensor {t.name!r} has no complete shape")
        try:
            dtype = tf_proto.dtype_name(t.type)
            tf_proto.numpy_dtype(dtype)
        except CircleFormatError as e:
            raise CircleFormatError(f"{where}: tensor {t.name!r}: {e}") from None
        specs[t.name] = dtype, shape
        total += math.prod(shape)
    if total > len(buf):
        raise CircleFormatError(f"{where}: its metadata lists {total} elements, more than the "
                                f"file's {len(buf)} bytes can hold (the file is corrupted)")
    out: dict[str, np.ndarray] = {}
    covered: dict[str, np.ndarray] = {}
    for i, (_, value) in enumerate(entries[1:], 1):
        s = _parse(value, where, f"entry {i}").data
        if s.name not in specs:
            raise CircleFormatError(f"{where}: entry {i} holds tensor {s.name!r}, which its "
                                    "metadata does not list")
        dtype, shape = specs[s.name]
        index = _extents(s.slice, shape, s.name, where)
        part_shape = tuple(x.stop - x.start for x in index)
        part = tf_proto.array_from_proto(s.data, dtype, part_shape, f"{where}: {s.name!r}")
        if part_shape == shape:
            out[s.name] = part
            covered[s.name] = np.ones(shape, bool)
            continue
        if s.name not in out:
            out[s.name] = np.zeros(shape, part.dtype)
            covered[s.name] = np.zeros(shape, bool)
        out[s.name][index] = part
        covered[s.name][index] = True
    for name, (dtype, shape) in specs.items():
        if name not in out or not covered[name].all():
            have = int(covered[name].sum()) if name in covered else 0
            raise CircleFormatError(f"{where}: tensor {name!r} ({dtype} {list(shape)}) has "
                                    f"values for {have} of its {math.prod(shape)} elements")
    return {name: out[name] for name in specs}


def read_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the V1 checkpoint file at ``path``, by name."""
    p = os.fspath(path)
    return decode_checkpoint(read_regular_file(p, _WHAT), p)


def _describe(dtype: Any, shape: Any) -> str:
    return f"{np.dtype(dtype).name if not isinstance(dtype, str) else dtype} {list(shape)}"


def restore(path: str | os.PathLike,
            expected: Mapping[str, tuple[tuple[int, ...], Any]]) -> dict[str, np.ndarray]:
    """The tensors ``expected`` names (name -> (shape, dtype)) from the checkpoint at ``path``,
    each checked: a missing name, or one of another shape or type, is a DataError naming it
    (the file may hold more tensors than asked for)."""
    p = os.fspath(path)
    held = read_checkpoint(p)
    missing = [n for n in expected if n not in held]
    if missing:
        raise DataError(f"checkpoint {p!r} holds no tensor {', '.join(map(repr, missing))} "
                        f"(it holds {', '.join(map(repr, held)) or 'none'})")
    for name, (shape, dtype) in expected.items():
        a = held[name]
        want = tf_proto.numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
        if tuple(a.shape) != tuple(shape) or a.dtype != want:
            raise DataError(f"checkpoint {p!r}: tensor {name!r} is {_describe(a.dtype, a.shape)}"
                            f", expected {_describe(want, shape)}")
    return {name: held[name] for name in expected}
