"""Training data files as ``onert_train`` reads them (``--load_input:raw``), and .npy/.npz.

A raw file has no header: the model's dtype, little-endian, row-major (NHWC), samples
concatenated. With several inputs (or expected outputs) the file is planar: all N samples
of input 0, then all N samples of input 1, ... N = file size / bytes per sample, where a
sample is one element of every input: sum over inputs of prod(shape) * itemsize.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import BinaryIO

import numpy as np

from circle_jax.errors import DataError
from circle_jax.formats.atomic import atomic_write
from circle_jax.formats.reader import MAX_FILE_BYTES, check_regular_file, read_regular_file

Spec = tuple[tuple[int, ...], np.dtype]
"""One input of a model: its per-sample shape (no batch dimension) and its dtype."""


def _specs(specs: Sequence[tuple[Sequence[int], np.dtype | str | type]]) -> list[Spec]:
    out = []
    for i, (shape, dtype) in enumerate(specs):
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise DataError(f"input {i} has unknown dimensions {list(shape)}; give a fixed shape")
        out.append((shape, None if dtype is None else np.dtype(dtype)))
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


def _numpy_kind(data: bytes) -> str | None:
    """What ``data`` is when it is a .npy file (its magic and header) or a zip archive such
    as .npz (its magic and directory), else None: raw data is samples from its first byte."""
    if data.startswith(b"\x93NUMPY") and b"'descr'" in data[8:256]:
        return "a .npy array saved by numpy.save"
    if data.startswith(b"PK\x03\x04") and zipfile.is_zipfile(io.BytesIO(data)):
        return "a .npz archive (or another zip file)"
    return None


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
    if not data:
        raise DataError(f"{name} is empty; expected samples of {per} bytes ({_describe(sp)})")
    kind = _numpy_kind(data)
    if kind is not None:
        raise DataError(f"{name} is {kind}, not raw data (its header would be read as "
                        "samples); load it as such (--load_input FILE, not --load_input:raw)")
    if len(data) % per:
        raise DataError(
            f"{name} has {len(data)} bytes, not a multiple of the {per} bytes per sample "
            f"expected ({_describe(sp)})" + (f"; its {hint}" if (hint := size_hint(len(data), sp))
                                              else "")
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


#: the dtypes a raw file's bytes could be, by item size (for hints: raw files carry no dtype)
_RAW_GUESSES = {1: "uint8 or int8", 2: "float16 or int16", 4: "float32 or int32",
                8: "float64 or int64"}


def size_hint(nbytes: int, specs: Sequence[tuple[Sequence[int], np.dtype | str | type]],
              samples: int | None = None) -> str:
    """``"8192 bytes are 16 samples of float64 or int64: is it float64? ..."`` when
    ``nbytes`` is a whole number of samples (exactly ``samples`` of them, when given) of the
    specs' shapes in a dtype of another item size, else ``""``. Only for inputs of one
    dtype: raw files carry no dtype, so this is a guess from the size, and says so."""
    specs = _specs(specs)
    if len({d for _, d in specs}) != 1:
        return ""
    elements = sum(int(np.prod(s, dtype=np.int64)) for s, _ in specs)
    own = specs[0][1].itemsize
    for size, names in _RAW_GUESSES.items():
        if size == own or not elements or nbytes % (elements * size):
            continue
        n = nbytes // (elements * size)
        if samples is None or n == samples:
            return (f"{nbytes} bytes are {n} samples of {names}: is it {names.split()[0]}? "
                    f"(raw files carry no dtype; write it as {specs[0][1].name})")
    return ""


def _fit(arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, what: str,
         on_cast: Callable[[str], None] | None = None) -> np.ndarray:
    """Check ``arr`` is (N, *shape), and cast it to ``dtype`` (None: keep its own) where
    that loses nothing."""
    if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
        raise DataError(
            f"{what} has shape {list(arr.shape)}, expected [N, {', '.join(map(str, shape))}]"
            if shape
            else f"{what} has shape {list(arr.shape)}, expected [N]"
        )
    if arr.shape[0] == 0:
        raise DataError(f"{what} holds no samples (shape {list(arr.shape)}); expected "
                        f"[N, {', '.join(map(str, shape))}] with N >= 1" if shape else
                        f"{what} holds no samples; expected [N] with N >= 1")
    if dtype is None or arr.dtype == dtype:
        return arr
    return lossless_cast(arr, dtype, what, on_cast)


def lossless_cast(arr: np.ndarray, dtype: np.dtype | str | type, what: str,
                  on_cast: Callable[[str], None] | None = None, *,
                  round_floats: bool = False, remedy: str = "save it as") -> np.ndarray:
    """``arr`` as ``dtype`` when every value converts exactly (it converts back to itself):
    integers to integers or floats (to float32: |v| <= 2**24), floats to floats (float64
    values that are float32 numbers); ``on_cast`` hears of each such cast. Other casts
    (values that would round, wrap or overflow; floats to integers; bools, complex,
    strings) are refused with one line naming ``what``, the dtype found and the dtype
    expected, ending ``remedy`` and the dtype (bfloat16 and other numpy extension dtypes
    are accepted as targets). With ``round_floats`` (arrays in memory, numpy's float64 by
    default) floats round to a narrower float dtype, but one that would overflow a
    finite value to infinity is still refused."""
    dtype = np.dtype(dtype)
    found = arr.dtype
    refuse = f"{what} has dtype {found.name}, expected {dtype.name}"
    numeric = "iuf"
    if found.kind not in numeric or dtype.kind not in numeric + "V" or (
            found.kind == "f" and dtype.kind in "iu"):
        raise DataError(f"{refuse} (circle-jax casts only what converts exactly: integers "
                        f"to integers or floats, floats to floats); {remedy} {dtype.name}")
    with np.errstate(all="ignore"):
        cast = arr.astype(dtype)
        back = cast.astype(found)
    if round_floats and found.kind == "f":
        same = np.isfinite(back) | ~np.isfinite(arr)  # rounded; overflow alone refused
    else:
        same = back == arr
    if found.kind == "f":
        same |= np.isnan(arr) & np.isnan(back)
    if not same.all():
        bad = np.flatnonzero(~same.reshape(-1))
        first = arr.reshape(-1)[bad[0]]
        raise DataError(f"{refuse}: {bad.size} of its {arr.size} values change in the cast "
                        f"(e.g. {first} becomes {cast.reshape(-1)[bad[0]]}); {remedy} "
                        f"{dtype.name} to accept that, or fix the data")
    if on_cast is not None:
        on_cast(f"{what}: cast from {found.name} to {dtype.name} (every value converts "
                "exactly)")
    return cast


def load_array_file(
    path: str | os.PathLike,
    specs: Sequence[tuple[Sequence[int], np.dtype | str | type]],
    names: Sequence[str | Sequence[str]] | None = None,
    on_cast: Callable[[str], None] | None = None,
) -> list[np.ndarray]:
    """Load data for the inputs in ``specs`` from a raw, ``.npy`` or ``.npz`` file.

    ``.npy`` holds the single input as (N, *shape). ``.npz`` holds one array per input:
    under ``names`` (per input its name, or its names: a tensor name and a signature's
    name for it) when each key is one input's, else under ``arr_0``, ``arr_1``, ...
    (``np.savez`` positional order). An array of another dtype
    is cast only where every value converts exactly (`lossless_cast`; ``on_cast(line)``
    hears of it); a spec's dtype None keeps the array's own. Other files are read as raw
    data (their specs need a dtype).
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
        with _numpy_file(p, "a .npy array saved by numpy.save"), open(p, "rb") as f:
            _check_claim(f, os.fstat(f.fileno()).st_size, f"{p!r}")
            f.seek(0)
            arr = np.load(f, allow_pickle=False)
        return [_fit(arr, *sp[0], f"array in {p!r}", on_cast)]
    if ext == ".npz":
        with _numpy_file(p, "a .npz archive saved by numpy.savez"), \
                np.load(p, allow_pickle=False) as z:
            _check_claims(z.zip, p)
            keys = list(z.files)
            positional = [f"arr_{i}" for i in range(len(sp))]
            named = None if names is None else _named_order(keys, names, len(sp))
            if named is not None:
                order = named
            elif sorted(keys) == sorted(positional):
                order = positional
            elif len(keys) == 1 and len(sp) == 1:
                order = keys
            else:
                want = positional if names is None else [
                    " or ".join([n] if isinstance(n, str) else n) + "," for n in names
                ] + ["or", *positional]
                raise DataError(
                    f"{p!r} holds arrays {keys}; expected {len(sp)} arrays named {' '.join(want)}"
                )
            out = [_fit(z[k], *s, f"array {k!r} in {p!r}", on_cast)
                   for k, s in zip(order, sp, strict=True)]
        _count(out, f"arrays in {p!r}")
        return out
    return read_raw(p, sp)


def _check_claim(f: BinaryIO, size: int, what: str) -> None:
    """DataError unless the .npy header at ``f`` asks for at most the ``size`` bytes the
    file (or archive member) holds: numpy allocates the array its header declares before
    reading, so a header claiming terabytes would be an allocation no file backs."""
    version = np.lib.format.read_magic(f)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(f)
    if dtype.hasobject:
        return  # pickled objects: np.load refuses them (allow_pickle=False)
    if any(d < 0 for d in shape):
        raise DataError(f"{what} declares an array of shape {list(shape)}: corrupt; expected "
                        "an array saved by numpy")
    claimed = math.prod(shape) * dtype.itemsize
    held = size - f.tell()
    if claimed > held:
        raise DataError(f"{what} declares an array of shape {list(shape)} {dtype} "
                        f"({claimed} bytes) but holds {max(held, 0)} bytes of data: truncated "
                        "or corrupt; expected a complete array saved by numpy")


def _check_claims(archive: zipfile.ZipFile, path: str) -> None:
    """`_check_claim` for every member of a .npz archive, and their sum within the
    one-file limit (a compressed archive could declare more than any file holds)."""
    total = 0
    for info in archive.infolist():
        total += info.file_size
        if total > MAX_FILE_BYTES:
            raise DataError(f"{path!r} unpacks to over the {MAX_FILE_BYTES}-byte limit for "
                            "one file; expected a smaller .npz archive")
        with archive.open(info) as member:
            _check_claim(member, info.file_size, f"array {info.filename!r} in {path!r}")


def _named_order(keys: Sequence[str], names: Sequence[str | Sequence[str]], count: int
                 ) -> list[str] | None:
    """The keys in input order when each input has exactly one key among its names and
    every key is an input's, else None."""
    if len(names) != count or len(keys) != count:
        return None
    order = []
    for alternatives in names:
        found = [k for k in ([alternatives] if isinstance(alternatives, str) else alternatives)
                 if k in keys]
        if len(found) != 1:
            return None
        order.append(found[0])
    return order if sorted(order) == sorted(keys) else None


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
    if not np.issubdtype(a.dtype, np.inexact) or a.ndim == 0 or a.size == 0:
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
                        classes: int | None = None, ignore_index: int | None = None,
                        distributions: bool = False) -> None:
    """DataError (one line, naming the first bad sample) for inputs or targets holding NaN or
    infinity, and, with ``classes`` (sparse labels), for labels that are not whole numbers
    in ``[0, classes)`` (or ``ignore_index``, padding): the message names that sample's
    distinct bad labels (the first four) and, when one is negative and no ``ignore_index``
    is set, suggests ``ignore_index`` (padding such as -100); and for a sample whose labels
    are all ``ignore_index`` (it would count as right and add a loss of 0). With ``distributions``
    (categorical crossentropy's one-hot or probability targets), for negative targets."""
    check_finite(list(inputs), "the input data")
    check_finite([expected], "the expected data")
    if distributions:
        y = np.asarray(expected).reshape(np.shape(expected)[0], -1)
        negative = (y < 0).any(axis=1)
        if negative.any():
            i = int(np.argmax(negative))
            raise DataError(f"the expected data: sample {i} holds negative targets (e.g. "
                            f"{y[i][y[i] < 0][0]}); categorical crossentropy expects one-hot "
                            "or probability targets >= 0")
    if classes is not None:
        y = np.asarray(expected).reshape(np.shape(expected)[0], -1)
        ok = (y >= 0) & (y < classes) & (y == np.floor(y))
        if ignore_index is not None:
            ok |= y == ignore_index
        bad = ~ok.all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            wrong = list(dict.fromkeys(y[i][~ok[i]].tolist()))  # distinct, in order
            hint = ("; padding? set ignore_index to its label" if ignore_index is None
                    and min(wrong) < 0 else "")
            raise DataError(f"the expected data: sample {i} has label(s) {wrong[:4]}"
                            f"{' ...' if len(wrong) > 4 else ''} outside the {classes} classes "
                            f"[0, {classes}){hint}")
        padding = (y == ignore_index).all(axis=1) if ignore_index is not None else None
        if padding is not None and padding.any():
            i = int(np.argmax(padding))
            raise DataError(f"the expected data: sample {i} is padding only (every label "
                            f"{ignore_index}, the ignore_index): it has nothing to score or "
                            "train on; leave such samples out")


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
