"""STRING tensors' buffer layout (TFLite's): decoded, encoded back, malformed refused."""

from __future__ import annotations

import numpy as np
import pytest

from circle_jax.errors import CircleFormatError
from circle_jax.formats.strings import decode_strings, encode_strings


def test_round_trip_and_layout() -> None:
    values = np.array([[b"w1", b""], [b"cnn/conv/kernel", "\u00e9".encode()]], object)
    raw = encode_strings(values).tobytes()
    # count 4, 5 offsets from the buffer's start (the first past the offsets), then bytes
    assert np.frombuffer(raw[:24], "<i4").tolist() == [4, 24, 26, 26, 41, 43]
    assert raw[24:] == b"w1cnn/conv/kernel\xc3\xa9"
    np.testing.assert_array_equal(decode_strings(raw, (2, 2), "t"), values)
    assert decode_strings(encode_strings(np.array("abc")).tobytes(), (), "t").item() == b"abc"


@pytest.mark.parametrize("raw, shape, match", [
    (b"\x01\x00", (), "cannot hold its count"),
    (np.array([2, 12, 13], "<i4").tobytes() + b"ab", (2,), "cannot hold its count"),
    (np.array([1, 12, 20], "<i4").tobytes() + b"ab", (), "do not run"),
    (np.array([1, 12, 14], "<i4").tobytes() + b"ab", (3,), "shape \\[3\\] has a buffer of 1"),
])
def test_malformed_buffers_are_one_line(raw: bytes, shape: tuple, match: str) -> None:
    with pytest.raises(CircleFormatError, match=match):
        decode_strings(raw, shape, "tensor 't'")
