"""STRING tensors as files store them (TFLite's layout, which Circle shares): a little-endian
int32 count N, then N + 1 int32 offsets from the start of the buffer (the last one is the
buffer's length), then the strings' bytes back to back. In the IR a string constant is a numpy
object array of ``bytes`` (strings are bytes, as TensorFlow's are: a checkpoint's tensor
names, a file path)."""

from __future__ import annotations

import numpy as np

from ..errors import CircleFormatError


def decode_strings(raw: bytes, shape: tuple[int, ...], where: str) -> np.ndarray:
    """The strings of buffer ``raw`` as an object array of ``shape``; one-line
    `CircleFormatError` when the count, the offsets or the shape do not fit the buffer."""
    size = len(raw)
    count = int(np.frombuffer(raw[:4], "<i4")[0]) if size >= 4 else -1
    if count < 0 or 4 * (count + 2) > size:
        raise CircleFormatError(f"{where}: a string buffer of {size} bytes cannot hold its "
                                f"count and {max(count, 0) + 1} offsets (expected int32 count, "
                                "count + 1 int32 offsets, then the bytes)")
    offsets = np.frombuffer(raw[4:4 * (count + 2)], "<i4").astype(np.int64)
    if offsets[0] != 4 * (count + 2) or offsets[-1] != size or np.any(np.diff(offsets) < 0):
        raise CircleFormatError(f"{where}: string offsets {offsets[:4].tolist()}... do not run "
                                f"from the end of the offsets ({4 * (count + 2)}) to the end "
                                f"of the buffer ({size}) in order")
    if count != int(np.prod(shape, dtype=np.int64)):
        raise CircleFormatError(f"{where}: a string tensor of shape {list(shape)} has a buffer "
                                f"of {count} strings")
    values = np.empty(count, object)
    for j in range(count):
        values[j] = bytes(raw[offsets[j]:offsets[j + 1]])
    return values.reshape(shape)


def encode_strings(values: np.ndarray) -> np.ndarray:
    """The buffer (uint8) of an array of strings (``bytes`` or ``str``, UTF-8) in the layout
    above: :func:`decode_strings` reads it back."""
    items = [v if isinstance(v, bytes) else str(v).encode() for v in np.asarray(values).flat]
    head = 4 * (len(items) + 2)
    offsets = np.cumsum([head] + [len(v) for v in items])
    return np.frombuffer(np.asarray([len(items)], "<i4").tobytes()
                         + offsets.astype("<i4").tobytes() + b"".join(items), np.uint8)
