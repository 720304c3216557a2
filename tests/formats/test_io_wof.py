"""onert-micro .wof weight files: layout, round trip, and every malformed-file message."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from circle_jax.errors import CircleFormatError
from circle_jax.formats.wof import decode_wof, encode_wof

W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([-1.5, 2.25], np.float32)
SHAPE = np.array([-1, 6], np.int32)


def test_layout() -> None:
    buf = encode_wof([None, W, None, B], checksum=False)
    magic, schema, unused, n = struct.unpack_from("<HBBI", buf)
    assert (magic, schema, unused, n) == (429, 1, 0, 4)
    offsets = struct.unpack_from("<4I", buf, 8)
    assert offsets == (0, 24, 0, 48)
    assert buf[24:48] == W.tobytes() and buf[48:] == B.tobytes()
    assert len(buf) == 56


def test_round_trip_is_bit_exact() -> None:
    buffers = [None, W, SHAPE, None, B, np.float16([1, 2, 3]), None]
    buf = encode_wof(buffers, checksum=False)
    got = decode_wof(buf, num_tensors=7)
    assert [g is None for g in got] == [b is None for b in buffers]
    for g, b in zip(got, buffers, strict=True):
        if b is not None:
            assert g.dtype == np.uint8 and g.tobytes() == b.tobytes()
    assert np.array_equal(got[1].view(np.float32).reshape(2, 3), W)
    assert encode_wof(got, checksum=False) == buf  # raw bytes in, same file out


def test_empty_arrays_and_bytes() -> None:
    buf = encode_wof([np.zeros(0, np.float32), b"\x01\x02", None], checksum=False)
    assert struct.unpack_from("<3I", buf, 8) == (0, 20, 0)
    got = decode_wof(buf)
    assert got[0] is None and got[1].tobytes() == b"\x01\x02" and got[2] is None
    assert decode_wof(encode_wof([], checksum=False)) == []


def test_big_endian_arrays_are_written_little_endian() -> None:
    buf = encode_wof([B.astype(">f4")], checksum=False)
    assert decode_wof(buf)[0].tobytes() == B.tobytes()


def test_repeated_offset_means_zero_size() -> None:
    data = b"\xaa\xbb\xcc\xdd"
    buf = struct.pack("<HBBI3I", 429, 1, 0, 3, 20, 20, 24) + data
    got = decode_wof(buf)
    assert got[0].size == 0 and got[1].tobytes() == data and got[2].size == 0


def _file(offsets: list[int], data: bytes = b"\x00" * 8, n: int | None = None) -> bytes:
    n = len(offsets) if n is None else n
    return struct.pack(f"<HBBI{len(offsets)}I", 429, 1, 0, n, *offsets) + data


@pytest.mark.parametrize(
    "buf, num_tensors, message",
    [
        (b"\xad\x01\x01", None, r"wof file is truncated: 3 bytes, the header alone needs 8"),
        (
            struct.pack("<HBBI", 428, 1, 0, 0),
            None,
            r"not a wof file: magic number is 428, expected 429",
        ),
        (
            struct.pack("<HBBI", 429, 2, 0, 0),
            None,
            r"unsupported wof schema version 2, expected 1",
        ),
        (
            _file([16, 0]),
            3,
            r"expected 3 tensors \(the model's subgraph 0\), file has 2",
        ),
        (
            _file([16, 0], data=b"", n=5),
            None,
            r"wof file is truncated: 5 offsets need 28 bytes of header, file has 16",
        ),
        (_file([8, 0]), None, r"wof buffer 0 offset 8 is outside the data area \[16, 24\]"),
        (_file([0, 25]), None, r"wof buffer 1 offset 25 is outside the data area \[16, 24\]"),
        (
            _file([24, 0, 20]),
            None,
            r"wof offsets must not decrease: buffer 2 starts at 20, before buffer 0 at 24",
        ),
    ],
)
def test_bad_files(buf: bytes, num_tensors: int | None, message: str) -> None:
    with pytest.raises(CircleFormatError, match=message):
        decode_wof(buf, num_tensors)


def test_errors_are_one_line() -> None:
    with pytest.raises(CircleFormatError) as e:
        decode_wof(_file([24, 0, 20]))
    assert "\n" not in str(e.value)
