"""The integrity seal circle-jax puts in the onert checkpoints and ``.wof`` files it writes.

Both formats locate every tensor by an absolute offset, so bytes between the offset table and
the first tensor's data are skipped by their readers (onert's ``train_import_checkpoint``
reads such a file unchanged: tested). circle-jax writes 8 bytes there: the tag ``CJC1`` and
the CRC-32 of the whole file computed with those 4 CRC bytes set to zero. A reader that finds
the tag verifies the CRC; files without it (onert's and onert-micro's own) are read as they
are.
"""

from __future__ import annotations

import zlib

from circle_jax.errors import CircleFormatError

TAG = b"CJC1"
SIZE = 8
"""Bytes of the seal: the tag, then the little-endian CRC-32."""


def seal(buf: bytes, at: int) -> bytes:
    """``buf`` (holding :data:`SIZE` reserved bytes at ``at``) with the seal written there."""
    blank = buf[:at] + TAG + bytes(4) + buf[at + SIZE:]
    return blank[: at + 4] + zlib.crc32(blank).to_bytes(4, "little") + blank[at + SIZE:]


def verify(buf: bytes, at: int, first_data: int, what: str) -> bool:
    """Check the seal at ``at`` if there is one (the data starts at ``first_data``, after it);
    True when a seal was found and holds, False when the file has none."""
    if first_data < at + SIZE or buf[at:at + 4] != TAG:
        return False
    stored = int.from_bytes(buf[at + 4:at + SIZE], "little")
    blank = buf[: at + 4] + bytes(4) + buf[at + SIZE:]
    if zlib.crc32(blank) != stored:
        raise CircleFormatError(f"{what} fails its checksum (CRC-32): the file was changed "
                                "or corrupted after circle-jax wrote it")
    return True
