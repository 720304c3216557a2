"""Training data files as ``onert_train`` reads them (``--load_input:raw``), and .npy/.npz.

A raw file has no header: the model's dtype, little-endian, row-major (NHWC), samples
concatenated. With several inputs (or expected outputs) the file is planar: all N samples
of input 0, then all N samples of input 1, ... N = file size / bytes per sample, where a
sample is one element of every input: sum over inputs of prod(shape) * itemsize.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from circle_jax.errors import DataError
from circle_jax.formats.atomic import atomic_write
from circle_jax.formats.reader import check_regular_file, read_regular_file

Spec = tuple[tuple[int, ...], np.dtype]
"""One input of a model: its per-sample shape (no batch dimension) and its dtype."""


def _specs(specs: Sequence[tuple[Sequence[int], np.dtype | str | type]]) -> list[Spec]:
    out = []
    for i, (shape, dtype) in enumerate(specs):
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise DataError(f"input {i} has unknown dimensions {list(shape)}; give a fixed shape")
        out.append((shape, np.dtype(dtype)))
    if not out:
        raise DataError("no inputs given: expected at least one (shape, dtype)")
    return out


def _describe(specs: list[Spec]) -> str:
    return " + ".join(
        f"{dt.name}{list(shape)} = {_sample_bytes(shape, dt)} bytes" for shape, dt in specs
    )


def _sample_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def sample_size(specs: Sequence[tuple[Sequence[int], np.dtype | str | type]]) -> int:
    """Bytes per sample: sum over inputs of prod(shape) * itemsize."""
    return sum(_sample_bytes(s, d) for s, d in _specs(specs))


def read_raw(
    source: str | os.PathLike | bytes | bytearray | memoryview,
    specs: Sequence[tuple[Sequence[int], np.dtype | str | type]],
) -> list[np.ndarray]:
    """Read a raw data file (or its bytes) into one array of shape (N, *shape) per spec."""
    sp = _specs(specs)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), "raw data"
    else:
        name = f"raw data file {os.fspath(source)!r}"
        data = read_regular_file(os.fspath(source), "raw data", DataError)
    per = sum(_sample_bytes(s, d) for s, d in sp)
    if per == 0:
        raise DataError(f"inputs {_describe(sp)} take 0 bytes per sample; cannot count samples")
    if len(data) % per:
        raise DataError(
            f"{name} has {len(data)} bytes, not a multiple of the {per} bytes per sample "
            f"expected ({_describe(sp)})"
        )
    n = len(data) // per
    out, pos = [], 0
    for shape, dt in sp:
        count = n * int(np.prod(shape, dtype=np.int64))
        arr = np.frombuffer(data, dt.newbyteorder("<"), count, pos)
        out.append(arr.astype(dt.newbyteorder("=")).reshape((n, *shape)))
        pos += count * dt.itemsize
    return out


def write_raw(
    path: str | os.PathLike,
    arrays: Sequence[np.ndarray],
    *,
    protect: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
) -> None:
    """Write arrays of shape (N, ...) as one planar raw file, atomically, in their dtypes."""
    if not arrays:
        raise DataError("no arrays to write: expected at least one of shape (N, ...)")
    arrs = [np.asarray(a) for a in arrays]
    counts = [a.shape[0] if a.ndim else None for a in arrs]
    if None in counts:
        raise DataError("arrays to write must have a leading sample dimension, got a scalar")
    if len(set(counts)) > 1:
        raise DataError(f"arrays to write have different sample counts {counts}; expected one N")
    blob = b"".join(
        np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False)).tobytes()
        for a in arrs
    )
    atomic_write(path, blob, protect=protect)


def _fit(arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """Check ``arr`` is (N, *shape) and castable to ``dtype`` (same kind), and cast it."""
    if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
        raise DataError(
            f"{what} has shape {list(arr.shape)}, expected [N, {', '.join(map(str, shape))}]"
            if shape
            else f"{what} has shape {list(arr.shape)}, expected [N]"
        )
    if arr.dtype != dtype and not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise DataError(
            f"{what} has dtype {arr.dtype.name}, expected {dtype.name} "
            "(only casts within a kind, such as float64 to float32, are made)"
        )
    return arr.astype(dtype, copy=False)


def load_array_file(
    path: str | os.PathLike,
    specs: Sequence[tuple[Sequence[int], np.dtype | str | type]],
    names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """Load data for the inputs in ``specs`` from a raw, ``.npy`` or ``.npz`` file.

    ``.npy`` holds the single input as (N, *shape). ``.npz`` holds one array per input:
    under ``names`` (the model's input names) when its keys are exactly those, else under
    ``arr_0``, ``arr_1``, ... (``np.savez`` positional order). Arrays may be cast within
    a kind (float64 → float32, int64 → int32); other files are read as raw data.
    """
    sp = _specs(specs)
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    if ext == ".npy":
        if len(sp) != 1:
            raise DataError(
                f"{p!r} is a .npy file holding one array, but the model has {len(sp)} inputs; "
                "use a .npz file with one array per input"
            )
        with _numpy_file(p, "a .npy array saved by numpy.save"):
            arr = np.load(p, allow_pickle=False)
        return [_fit(arr, *sp[0], f"array in {p!r}")]
    if ext == ".npz":
        with _numpy_file(p, "a .npz archive saved by numpy.savez"), \
                np.load(p, allow_pickle=False) as z:
            keys = list(z.files)
            positional = [f"arr_{i}" for i in range(len(sp))]
            if names is not None and sorted(keys) == sorted(names) and len(names) == len(sp):
                order = list(names)
            elif sorted(keys) == sorted(positional):
                order = positional
            elif len(keys) == 1 and len(sp) == 1:
                order = keys
            else:
                want = positional if names is None else [*names, "or", *positional]
                raise DataError(
                    f"{p!r} holds arrays {keys}; expected {len(sp)} arrays named {' '.join(want)}"
                )
            out = [_fit(z[k], *s, f"array {k!r} in {p!r}") for k, s in zip(order, sp, strict=True)]
        _count(out, f"arrays in {p!r}")
        return out
    return read_raw(p, sp)


@contextmanager
def _numpy_file(path: str, expected: str) -> Iterator[None]:
    """Turn numpy's errors for an unreadable, empty, truncated or pickled file into one
    DataError line naming the file and what was expected."""
    if check_regular_file(path, "data", DataError) == 0:
        raise DataError(f"{path!r} is empty; expected {expected}")
    try:
        yield
    except DataError:
        raise
    except ValueError as e:
        if "pickle" in str(e):
            raise DataError(f"{path!r} holds Python objects (pickled data), which circle-jax "
                            f"never loads; expected {expected} of numbers") from None
        raise DataError(f"{path!r} is not {expected}: {e}") from None
    except (EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
        raise DataError(f"{path!r} is truncated or corrupt ({type(e).__name__}: {e}); "
                        f"expected {expected}") from None
    except OSError as e:
        raise DataError(f"cannot read {path!r}: {e.strerror or e}") from None


def first_non_finite(array: np.ndarray) -> int | None:
    """The index of the first sample (along axis 0) holding a NaN or infinity, or None."""
    a = np.asarray(array)
    if not np.issubdtype(a.dtype, np.inexact) or a.ndim == 0:
        return None
    bad = ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)
    return int(np.argmax(bad)) if bad.any() else None


def check_finite(arrays: Sequence[np.ndarray], what: str) -> None:
    """DataError naming ``what`` and the first sample with a NaN or infinity, if any."""
    for k, a in enumerate(arrays):
        i = first_non_finite(a)
        if i is not None:
            part = f" (array {k})" if len(arrays) > 1 else ""
            raise DataError(f"{what}{part}: sample {i} holds NaN or infinity; "
                            "expected finite numbers")


def check_training_data(inputs: Sequence[np.ndarray], expected: np.ndarray,
                        classes: int | None = None) -> None:
    """DataError (one line, naming the first bad sample) for inputs or targets holding NaN or
    infinity, and, with ``classes`` (sparse labels), for labels that are not whole numbers
    in ``[0, classes)``."""
    check_finite(list(inputs), "the input data")
    check_finite([expected], "the expected data")
    if classes is not None:
        y = np.asarray(expected).reshape(np.shape(expected)[0], -1)
        bad = ~((y >= 0) & (y < classes) & (y == np.floor(y))).all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise DataError(f"the expected data: sample {i} has label(s) "
                            f"{y[i][:4].tolist()} outside the {classes} classes [0, {classes})")


def _count(arrays: Sequence[np.ndarray], what: str) -> int:
    if not arrays:
        raise DataError(f"no {what}: expected at least one array of shape (N, ...)")
    counts = {int(np.shape(a)[0]) for a in arrays}
    if len(counts) != 1:
        raise DataError(f"{what} have different sample counts {sorted(counts)}; expected one N")
    return counts.pop()


def check_same_count(
    inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray], what: str | None = None
) -> int:
    """Return N, the common sample count; DataError if the input and expected data differ."""
    n_in = _count(inputs, what or "input arrays")
    n_exp = _count(expected, what or "expected arrays")
    if n_in != n_exp:
        raise DataError(f"input file has {n_in} samples, expected file has {n_exp}")
    return n_in
