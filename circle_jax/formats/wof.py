"""onert-micro's ``.wof`` "weight only format": the weights of a circle model, cut out.

Layout (little-endian, packed)::

    u16 magic = 429
    u8  schema = 1
    u8  unused (0)
    u32 num_buffers            = number of tensors of the model's subgraph 0
    u32 offset[num_buffers]    absolute offset of tensor k's data; 0 = no data
    ...data...

Buffer k belongs to tensor k. The file stores no sizes; :func:`decode_wof` derives them:
the size of buffer k is the distance from its offset to the next larger non-zero offset
of any buffer, or to the end of the file for the last one. Non-zero offsets must
therefore not decrease with k (that is how :func:`encode_wof` writes them: data in tensor
order, packed, no padding). Two equal offsets make the earlier buffer zero-sized.

:func:`encode_wof` writes ``None`` *and* empty arrays as offset 0, so a zero-size buffer
never appears in files it writes; :func:`decode_wof` returns ``None`` for offset 0 and a
zero-length array only for a file (not written here) that repeats an offset.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from circle_jax.errors import CircleFormatError
from circle_jax.formats import checksum as checksum_seal

MAGIC = 429
SCHEMA = 1
HEADER_SIZE = 8
_HEADER = struct.Struct("<HBBI")


def _raw(a: np.ndarray | bytes | bytearray | memoryview) -> bytes:
    """The little-endian, row-major bytes of an array (or bytes unchanged)."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        return bytes(a)
    arr = np.asarray(a)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr).tobytes()


def encode_wof(buffers: Sequence[np.ndarray | bytes | None], checksum: bool = True) -> bytes:
    """Serialize one buffer per tensor of subgraph 0 (``None`` = the tensor has no data).

    Arrays are written as their raw little-endian bytes, packed in tensor order, after the
    offset table and (``checksum``) circle-jax's seal (:mod:`~circle_jax.formats.checksum`).
    """
    datas = [None if b is None else _raw(b) for b in buffers]
    n = len(datas)
    gap = checksum_seal.SIZE if checksum else 0
    pos = HEADER_SIZE + 4 * n + gap
    offsets = []
    for d in datas:
        if d:
            offsets.append(pos)
            pos += len(d)
        else:
            offsets.append(0)
    if pos > 0xFFFFFFFF:
        raise ValueError(f"weights take {pos} bytes; a .wof file holds at most 4 GiB (u32 offsets)")
    parts = [_HEADER.pack(MAGIC, SCHEMA, 0, n), struct.pack(f"<{n}I", *offsets), bytes(gap)]
    parts += [d for d in datas if d]
    out = b"".join(parts)
    return checksum_seal.seal(out, HEADER_SIZE + 4 * n) if checksum else out


def decode_wof(
    buf: bytes | bytearray | memoryview, num_tensors: int | None = None
) -> list[np.ndarray | None]:
    """Parse a ``.wof`` file into one ``uint8`` array (or ``None``) per tensor.

    ``num_tensors``, when given, is the number of tensors of the model's subgraph 0 and must
    equal the file's buffer count. Sizes follow the rule in the module docstring.
    """
    buf = bytes(buf)
    size = len(buf)
    if size < HEADER_SIZE:
        raise CircleFormatError(
            f"wof file is truncated: {size} bytes, the header alone needs {HEADER_SIZE}"
        )
    magic, schema, _, n = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CircleFormatError(f"not a wof file: magic number is {magic}, expected {MAGIC}")
    if schema != SCHEMA:
        raise CircleFormatError(f"unsupported wof schema version {schema}, expected {SCHEMA}")
    if num_tensors is not None and n != num_tensors:
        raise CircleFormatError(
            f"wof file does not fit the model: expected {num_tensors} tensors "
            f"(the model's subgraph 0), file has {n}"
        )
    table_end = HEADER_SIZE + 4 * n
    if table_end > size:
        raise CircleFormatError(
            f"wof file is truncated: {n} offsets need {table_end} bytes of header, file has {size}"
        )
    offsets = struct.unpack_from(f"<{n}I", buf, HEADER_SIZE)

    prev, prev_k = table_end, None
    for k, off in enumerate(offsets):
        if off == 0:
            continue
        if off < table_end or off > size:
            raise CircleFormatError(
                f"wof buffer {k} offset {off} is outside the data area "
                f"[{table_end}, {size}] of the file"
            )
        if off < prev:
            raise CircleFormatError(
                f"wof offsets must not decrease: buffer {k} starts at {off}, "
                f"before buffer {prev_k} at {prev}"
            )
        prev, prev_k = off, k
    first = min((off for off in offsets if off), default=size)
    checksum_seal.verify(buf, table_end, first, "wof file")

    data = np.frombuffer(buf, np.uint8)
    out: list[np.ndarray | None] = [None] * n
    nonzero = [(k, off) for k, off in enumerate(offsets) if off]
    for i, (k, off) in enumerate(nonzero):
        end = nonzero[i + 1][1] if i + 1 < len(nonzero) else size
        out[k] = data[off:end].copy()
    return out
