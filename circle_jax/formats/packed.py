"""Sub-byte integer tensors (int4, uint4, int2) as files store them: packed, the first value
in the low bits of the first byte (LiteRT's order), the last byte padded with zero bits."""

from __future__ import annotations

import numpy as np

from ..graph.ir import PACKED_BITS, as_numpy_dtype


def packed_size(dtype: str, count: int) -> int:
    """The bytes ``count`` values of packed ``dtype`` take."""
    per_byte = 8 // PACKED_BITS[dtype]
    return -(-count // per_byte)


def unpack_values(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The values of packed ``dtype`` in ``raw`` as an array of ``shape`` (ml_dtypes' int4 /
    uint4 / int2); ``raw`` must hold exactly :func:`packed_size` bytes."""
    bits = PACKED_BITS[dtype]
    count = int(np.prod(shape, dtype=np.int64))
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    fields = (np.frombuffer(raw, np.uint8)[:, None] >> shifts) & np.uint8((1 << bits) - 1)
    values = fields.reshape(-1)[:count].astype(np.int8)
    if not dtype.startswith("u"):
        sign = np.int8(1 << (bits - 1))
        values = (values ^ sign) - sign
    return values.astype(as_numpy_dtype(dtype)).reshape(shape)


def pack_values(values: np.ndarray, dtype: str) -> np.ndarray:
    """The packed bytes (uint8) of ``values`` (any integer array inside ``dtype``'s range)."""
    bits = PACKED_BITS[dtype]
    per_byte = 8 // bits
    flat = np.asarray(values).astype(np.int8).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    flat = np.concatenate([flat, np.zeros(-len(flat) % per_byte, np.uint8)])
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    return np.bitwise_or.reduce(flat.reshape(-1, per_byte) << shifts, axis=1).astype(np.uint8)
