"""LevelDB's table file (an SSTable), as TensorFlow writes it for its V1 checkpoints.

Layout (little-endian fixed-width integers, LEB128 varints):

- data blocks, then a metaindex block (TF's is empty), then an index block, then a 48-byte
  footer: the metaindex's and the index's block handles (varint offset, varint size) padded
  with zeros to 40 bytes, then the magic 0xdb4775248b80fb57 as a fixed64;
- a block is its entries, then its restart offsets (fixed32 each) and their count (fixed32),
  then a 5-byte trailer: the compression type (0 none, 1 snappy) and the masked CRC-32C of
  the block's bytes and that type byte (mask: rotate right by 15 bits, add 0xa282ead8);
- an entry is varints ``shared``, ``non_shared``, ``value_length``, the key's bytes after the
  ``shared`` bytes it has in common with the previous key, then the value; every 16th entry
  (each one in the index block) is a restart point, where ``shared`` is 0;
- the index holds one entry per data block: a key >= the block's last key and < the next
  block's first (the shortest such, bytewise), its value the block's handle.

The writer makes what TF's table builder makes: blocks cut once they reach 256 KiB, restart
interval 16 (index: 1), no compression (TF's checkpoint writer compresses nothing; a snappy
block is refused when read). Keys must be given in strictly increasing bytewise order.
"""

from __future__ import annotations

from collections.abc import Iterable

import google_crc32c

from circle_jax.errors import CircleFormatError

MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_SIZE = 256 * 1024
RESTART_INTERVAL = 16
_TRAILER = 5
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """LevelDB's masked CRC-32C of ``data``."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _read_varint(buf: bytes, p: int, end: int, where: str) -> tuple[int, int]:
    """The varint at ``p`` (at most 10 bytes, before ``end``) and the offset after it."""
    v = shift = 0
    for q in range(p, min(end, p + 10)):
        b = buf[q]
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, q + 1
        shift += 7
    raise CircleFormatError(f"{where}: a varint runs past its block (the file is corrupted)")


class _Block:
    """A block being built: prefix-compressed entries and their restart points."""

    def __init__(self, restart_interval: int) -> None:
        self.interval = restart_interval
        self.buf = bytearray()
        self.restarts = [0]
        self.count = 0
        self.last = b""
        self.empty = True

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.count < self.interval:
            n = min(len(key), len(self.last))
            while shared < n and key[shared] == self.last[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.count = 0
        self.buf += (_varint(shared) + _varint(len(key) - shared) + _varint(len(value))
                     + key[shared:] + value)
        self.last, self.empty = key, False
        self.count += 1

    def size(self) -> int:
        """The block's size when finished (LevelDB's estimate, which is exact)."""
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        tail = b"".join(r.to_bytes(4, "little") for r in self.restarts)
        return bytes(self.buf) + tail + len(self.restarts).to_bytes(4, "little")


def _separator(start: bytes, limit: bytes) -> bytes:
    """The shortest key >= ``start`` and < ``limit`` that LevelDB's bytewise comparator finds:
    ``start`` cut after its first differing byte, that byte incremented, where that stays
    below ``limit``; else ``start``."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes([start[i] + 1])
    return start


def _successor(key: bytes) -> bytes:
    """The shortest key >= ``key``: cut after its first byte that is not 0xff, incremented."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


def build_table(entries: Iterable[tuple[bytes, bytes]], block_size: int = BLOCK_SIZE) -> bytes:
    """The table file holding ``entries`` (key, value), keys strictly increasing."""
    out = bytearray()

    def write(block: _Block) -> bytes:
        contents = block.finish()
        handle = _varint(len(out)) + _varint(len(contents))
        out.extend(contents + b"\x00"
                   + masked_crc32c(contents + b"\x00").to_bytes(4, "little"))
        return handle

    index, block = _Block(1), _Block(RESTART_INTERVAL)
    pending: bytes | None = None
    last: bytes | None = None
    for key, value in entries:
        if last is not None and key <= last:
            raise ValueError(f"table keys must increase: {key!r} after {last!r}")
        if pending is not None:
            index.add(_separator(last, key), pending)
            pending = None
        block.add(key, value)
        last = key
        if block.size() >= block_size:
            pending, block = write(block), _Block(RESTART_INTERVAL)
    if not block.empty:
        pending = write(block)
    metaindex = write(_Block(RESTART_INTERVAL))
    if pending is not None:
        index.add(_successor(last), pending)
    handles = metaindex + write(index)
    out += handles + bytes(FOOTER_SIZE - 8 - len(handles)) + MAGIC.to_bytes(8, "little")
    return bytes(out)


def _handle(buf: bytes, p: int, end: int, where: str) -> tuple[int, int, int]:
    offset, p = _read_varint(buf, p, end, where)
    size, p = _read_varint(buf, p, end, where)
    return offset, size, p


def _block(buf: bytes, offset: int, size: int, data_end: int, where: str) -> bytes:
    """A block's verified contents."""
    if offset + size + _TRAILER > data_end:
        raise CircleFormatError(
            f"{where} is truncated or corrupted: a block at offset {offset} of {size} bytes "
            f"runs past the table's data ({data_end} bytes)")
    contents = buf[offset:offset + size + 1]
    stored = int.from_bytes(buf[offset + size + 1:offset + size + _TRAILER], "little")
    if masked_crc32c(contents) != stored:
        raise CircleFormatError(f"{where}: the block at offset {offset} fails its CRC-32C "
                                "check (the file is corrupted)")
    kind = contents[-1]
    if kind != 0:
        name = "snappy-compressed" if kind == 1 else f"of compression type {kind}"
        raise CircleFormatError(
            f"{where}: the block at offset {offset} is {name}; circle-jax reads uncompressed "
            "tables, as TensorFlow's checkpoint writer makes them")
    return contents[:-1]


def _entries(block: bytes, where: str) -> list[tuple[bytes, bytes]]:
    """A block's entries, keys reassembled from their shared prefixes."""
    if len(block) < 4:
        raise CircleFormatError(f"{where}: a block of {len(block)} bytes has no restart count")
    restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 - 4 * restarts
    if restarts < 1 or end < 0:
        raise CircleFormatError(f"{where}: a block's restart count {restarts} does not fit "
                                f"its {len(block)} bytes")
    out: list[tuple[bytes, bytes]] = []
    key, p = b"", 0
    while p < end:
        shared, p = _read_varint(block, p, end, where)
        own, p = _read_varint(block, p, end, where)
        n, p = _read_varint(block, p, end, where)
        if shared > len(key) or p + own + n > end:
            raise CircleFormatError(f"{where}: a block entry does not fit its block "
                                    "(the file is corrupted)")
        key = key[:shared] + block[p:p + own]
        out.append((key, block[p + own:p + own + n]))
        p += own + n
    return out


def read_table(buf: bytes, where: str, what: str = "LevelDB table") -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the table in ``buf``, in order; ``what`` names the format
    expected in the message when the footer's magic is missing."""
    if len(buf) < FOOTER_SIZE or int.from_bytes(buf[-8:], "little") != MAGIC:
        raise CircleFormatError(
            f"{where} is not a {what} or is truncated: it does not end with the table magic "
            f"0x{MAGIC:016x} ({len(buf)} bytes)")
    data_end = len(buf) - FOOTER_SIZE
    _, _, p = _handle(buf, data_end, len(buf) - 8, where)  # the metaindex: nothing TF uses
    offset, size, _ = _handle(buf, p, len(buf) - 8, where)
    out: list[tuple[bytes, bytes]] = []
    for _, value in _entries(_block(buf, offset, size, data_end, where), where):
        block_offset, block_size, _ = _handle(value, 0, len(value), where)
        out.extend(_entries(_block(buf, block_offset, block_size, data_end, where), where))
    return out
