"""onert's training checkpoint file (``onert_train --export_checkpoint`` / ``--checkpoint``).

Layout (little-endian, packed)::

    header (20 bytes): u16 magic = 429, u8 schema = 1, u8 reserved,
                       u32 opt1_offset, u32 opt2_offset, u32 other_offset, u32 length
    u32 offset[length]           absolute offsets of the tensor data, then the data
    at opt1_offset: u32 offset[length] + Adam m data   (Adam only)
    at opt2_offset: u32 offset[length] + Adam v data   (Adam only)
    at other_offset: u32 cur_step, u32 cur_epoch       (file size - other_offset == 8)

Sizes are not stored: entry i runs from its offset to the next entry's offset, the last
to the start of the next section. Tensors without optimizer state get zero-size m/v
entries. For SGD, onert writes ``opt2_offset = 0`` and ``opt1_offset = other_offset``
(formats.md says 0; both are read here, and :func:`encode_checkpoint` writes onert's form).

What onert 0.1.0 (the ``onert`` wheel, train backend) puts in a checkpoint, observed:

- One entry per *constant* tensor of subgraph 0, trainable or not, whatever
  ``num_of_trainable_ops`` is: for ``onert_micro_simple_mnist_model.circle`` that is the
  four float weights and also the int32 Reshape shape constant (5 entries). Entries of
  constants that get no gradient (the shape, or weights of frozen ops) have zero-size
  Adam m/v entries.
- The entry order is onert's internal (hash-map) order. It depends only on the *indices*
  of the constant tensors, not on the graph's structure: permuting a model's tensor list
  so that the same index set holds constants gives the same index order. It is neither
  ascending index order nor operator order: constant tensors {1, 2, 3, 4, 5} come out
  as 4, 5, 2, 1, 3; {6..10} ascending; {0, 2, 3, 4, 11} as 4, 11, 0, 3, 2. A reliable way
  to map entries to tensors is to ask onert: export a checkpoint from the same model with
  each constant's bytes replaced by a distinct marker, and match entries by content.
- ``cur_step`` counts weight updates (``train(update_weights=True)`` calls); ``cur_epoch``
  is always written as 0. Exporting needs at least one ``train()`` call first.
- ``train_import_checkpoint`` reads such a file back when its entry count and sizes match
  the session's: weights, Adam m/v and (Adam only) the step; with SGD the step stays 0.
  Files written by :func:`encode_checkpoint` import the same way (tested).
- The 0.1.0 Python binding garbles path arguments longer than 15 bytes in
  ``train_export_checkpoint``, ``train_import_checkpoint`` and ``train_export_circle``
  (it writes or looks for a file with a garbage name in the working directory): change
  into the target directory and pass a short relative name. It also keeps raw pointers
  to the arrays given to ``train_set_input/expected/output``; keep them alive until
  ``train()`` returns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from circle_jax.errors import CircleFormatError, DataError
from circle_jax.formats import checksum as checksum_seal

MAGIC = 429
SCHEMA = 1
HEADER_SIZE = 20
FOOTER_SIZE = 8
_HEADER = struct.Struct("<HBBIIII")
_FOOTER = struct.Struct("<II")

RawLike = np.ndarray | bytes | bytearray | memoryview


def _raw(a: RawLike) -> np.ndarray:
    """A read-only ``uint8`` array with the little-endian, row-major bytes of ``a``."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        out = np.frombuffer(bytes(a), np.uint8)
    else:
        arr = np.asarray(a)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        out = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8)
    out.flags.writeable = False
    return out


def _raw_list(items: Sequence[RawLike] | None) -> tuple[np.ndarray, ...] | None:
    return None if items is None else tuple(_raw(a) for a in items)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """The contents of an onert checkpoint; every entry is raw bytes (a ``uint8`` array).

    ``adam_m``/``adam_v`` are None for SGD; otherwise one entry per tensor, empty for
    tensors without optimizer state. Use :func:`as_array` to view an entry as numbers.
    """

    tensors: tuple[np.ndarray, ...]
    adam_m: tuple[np.ndarray, ...] | None = None
    adam_v: tuple[np.ndarray, ...] | None = None
    step: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", _raw_list(self.tensors))
        object.__setattr__(self, "adam_m", _raw_list(self.adam_m))
        object.__setattr__(self, "adam_v", _raw_list(self.adam_v))
        if (self.adam_m is None) != (self.adam_v is None):
            raise ValueError("Adam state needs both adam_m and adam_v (or neither, for SGD)")
        n = len(self.tensors)
        for name in ("adam_m", "adam_v"):
            state = getattr(self, name)
            if state is not None and len(state) != n:
                raise ValueError(f"{name} has {len(state)} entries, expected {n} (one per tensor)")
        if self.adam_m is not None:
            for i, (t, m, v) in enumerate(zip(self.tensors, self.adam_m, self.adam_v, strict=True)):
                if m.size != v.size or m.size not in (0, t.size):
                    raise ValueError(
                        f"Adam state of tensor {i}: m has {m.size} bytes and v {v.size}, "
                        f"expected both 0 or both {t.size} (the tensor's size)"
                    )
        for name in ("step", "epoch"):
            v = int(getattr(self, name))
            if not 0 <= v <= 0xFFFFFFFF:
                raise ValueError(f"checkpoint {name} must fit in a u32, got {v}")
            object.__setattr__(self, name, v)

    @property
    def is_adam(self) -> bool:
        """True when the checkpoint carries Adam moments."""
        return self.adam_m is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented

        def same(a: tuple[np.ndarray, ...] | None, b: tuple[np.ndarray, ...] | None) -> bool:
            if a is None or b is None:
                return a is b
            if len(a) != len(b):
                return False
            return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))

        return (
            self.step == other.step
            and self.epoch == other.epoch
            and same(self.tensors, other.tensors)
            and same(self.adam_m, other.adam_m)
            and same(self.adam_v, other.adam_v)
        )

    __hash__ = None  # type: ignore[assignment]


def as_array(raw: np.ndarray, dtype: np.dtype | str, shape: Sequence[int]) -> np.ndarray:
    """View a raw entry as a little-endian array of ``dtype`` and ``shape`` (a copy)."""
    dt = np.dtype(dtype).newbyteorder("<")
    count = int(np.prod(shape, dtype=np.int64))
    if raw.size != count * dt.itemsize:
        raise DataError(
            f"checkpoint entry has {raw.size} bytes, expected {count * dt.itemsize} for "
            f"{dt.name}{list(shape)}"
        )
    return np.frombuffer(raw.tobytes(), dt).astype(dt.newbyteorder("=")).reshape(shape)


def _section(entries: Sequence[np.ndarray], start: int, gap: int = 0) -> tuple[bytes, int]:
    """An offset table (+ ``gap`` zero bytes) + data starting at absolute ``start``; returns
    (bytes, end)."""
    n = len(entries)
    pos = start + 4 * n + gap
    offsets = []
    for e in entries:
        offsets.append(pos)
        pos += e.size
    table = struct.pack(f"<{n}I", *offsets) + bytes(gap)
    return table + b"".join(e.tobytes() for e in entries), pos


def encode_checkpoint(ckpt: Checkpoint, checksum: bool = True, reserved: int = 0) -> bytes:
    """Serialize ``ckpt`` as onert lays a checkpoint out; ``checksum`` adds circle-jax's seal
    after the tensor offset table (:mod:`~circle_jax.formats.checksum`), which onert skips;
    ``reserved`` is the header's reserved byte (onert writes 0 and ignores it)."""
    gap = checksum_seal.SIZE if checksum else 0
    tensors, end = _section(ckpt.tensors, HEADER_SIZE, gap)
    body = [tensors]
    opt1 = end
    opt2 = 0
    if ckpt.is_adam:
        m, end = _section(ckpt.adam_m, opt1)
        opt2 = end
        v, end = _section(ckpt.adam_v, opt2)
        body += [m, v]
    if end + FOOTER_SIZE > 0xFFFFFFFF:
        raise ValueError(f"checkpoint needs {end + FOOTER_SIZE} bytes; u32 offsets allow 4 GiB")
    header = _HEADER.pack(MAGIC, SCHEMA, reserved, opt1, opt2, end, len(ckpt.tensors))
    out = b"".join([header, *body, _FOOTER.pack(ckpt.step, ckpt.epoch)])
    return checksum_seal.seal(out, HEADER_SIZE + 4 * len(ckpt.tensors)) if checksum else out


def _read_section(buf: bytes, start: int, end: int, n: int, what: str) -> tuple[np.ndarray, ...]:
    """Read ``n`` entries whose offset table starts at ``start``; data ends at ``end``."""
    table_end = start + 4 * n
    if table_end > end:
        raise CircleFormatError(
            f"checkpoint {what}: {n} offsets need bytes {start}..{table_end}, "
            f"but the section ends at {end}"
        )
    offsets = struct.unpack_from(f"<{n}I", buf, start)
    prev = table_end
    for i, off in enumerate(offsets):
        if not prev <= off <= end:
            raise CircleFormatError(
                f"checkpoint {what} entry {i}: offset {off} is outside [{prev}, {end}] "
                "(offsets must lie in their section and not decrease)"
            )
        prev = off
    data = np.frombuffer(buf, np.uint8)
    out = []
    for i, off in enumerate(offsets):
        stop = offsets[i + 1] if i + 1 < n else end
        entry = data[off:stop].copy()
        entry.flags.writeable = False
        out.append(entry)
    return tuple(out)


def decode_checkpoint(
    buf: bytes | bytearray | memoryview, expected_count: int | None = None
) -> Checkpoint:
    """Parse an onert checkpoint. ``expected_count``: the number of entries the model needs."""
    buf = bytes(buf)
    size = len(buf)
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise CircleFormatError(
            f"checkpoint is truncated: {size} bytes, expected at least "
            f"{HEADER_SIZE + FOOTER_SIZE} (header and step/epoch)"
        )
    magic, schema, _, opt1, opt2, other, n = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CircleFormatError(
            f"not an onert checkpoint: magic number is {magic}, expected {MAGIC}"
        )
    if schema != SCHEMA:
        raise CircleFormatError(
            f"unsupported checkpoint schema version {schema}, expected {SCHEMA}"
        )
    if size - other != FOOTER_SIZE:
        raise CircleFormatError(
            f"checkpoint is truncated or corrupt: step/epoch at offset {other} should be the "
            f"last {FOOTER_SIZE} bytes, but the file has {size} bytes"
        )
    if expected_count is not None and n != expected_count:
        raise CircleFormatError(
            f"checkpoint does not fit the model: it has {n} tensors, expected {expected_count}"
        )
    adam = opt2 != 0
    if adam:
        if not HEADER_SIZE <= opt1 <= opt2 <= other:
            raise CircleFormatError(
                f"checkpoint section offsets are out of order: opt1 {opt1}, opt2 {opt2}, "
                f"other {other}; expected {HEADER_SIZE} <= opt1 <= opt2 <= other"
            )
        tensors_end = opt1
    else:
        if opt1 not in (0, other):
            raise CircleFormatError(
                f"checkpoint without Adam state (opt2_offset 0) has opt1_offset {opt1}; "
                f"expected 0 or {other} (the step/epoch offset)"
            )
        tensors_end = other
    if tensors_end < HEADER_SIZE:
        raise CircleFormatError(
            f"checkpoint tensor data ends at {tensors_end}, inside the {HEADER_SIZE}-byte header"
        )
    tensors = _read_section(buf, HEADER_SIZE, tensors_end, n, "tensor")
    first = min(struct.unpack_from(f"<{n}I", buf, HEADER_SIZE), default=tensors_end)
    checksum_seal.verify(buf, HEADER_SIZE + 4 * n, first, "checkpoint")
    m = v = None
    if adam:
        m = _read_section(buf, opt1, opt2, n, "Adam m")
        v = _read_section(buf, opt2, other, n, "Adam v")
    step, epoch = _FOOTER.unpack_from(buf, other)
    try:
        return Checkpoint(tensors, m, v, step, epoch)
    except ValueError as e:
        raise CircleFormatError(f"checkpoint is inconsistent: {e}") from None
