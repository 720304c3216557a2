"""onert_train raw data files, .npy/.npz loading, and atomic writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from circle_jax.errors import DataError
from circle_jax.formats.atomic import atomic_write
from circle_jax.formats.rawdata import (
    check_same_count,
    load_array_file,
    read_raw,
    sample_size,
    size_hint,
    write_raw,
)

IMG = ((2, 2, 1), np.float32)
LABEL = ((3,), np.int32)


def test_single_input_layout() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2, 1)
    (got,) = read_raw(x.tobytes(), [IMG])
    assert got.shape == (3, 2, 2, 1) and got.dtype == np.float32
    assert np.array_equal(got, x)


def test_several_inputs_are_planar(tmp_path: Path) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 2, 2, 1)
    y = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    path = tmp_path / "in.bin"
    write_raw(path, [x, y])
    data = path.read_bytes()
    assert data == x.tobytes() + y.tobytes()  # all samples of input 0, then input 1
    assert len(data) == 2 * sample_size([IMG, LABEL])
    gx, gy = read_raw(path, [IMG, LABEL])
    assert np.array_equal(gx, x) and np.array_equal(gy, y) and gy.dtype == np.int32


def test_little_endian_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "be.bin"
    write_raw(path, [np.array([[1.0]], ">f4")])
    assert path.read_bytes() == np.float32(1.0).tobytes() == b"\x00\x00\x80\x3f"


def test_size_not_a_multiple_of_a_sample() -> None:
    with pytest.raises(
        DataError,
        match=r"raw data has 30 bytes, not a multiple of the 28 bytes per sample expected "
        r"\(float32\[2, 2, 1\] = 16 bytes \+ int32\[3\] = 12 bytes\)",
    ):
        read_raw(b"\0" * 30, [IMG, LABEL])


def test_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "short.bin"
    path.write_bytes(b"\0" * 5)
    with pytest.raises(DataError, match=r"raw data file '.*short.bin' has 5 bytes"):
        read_raw(path, [IMG])


def test_empty_file_is_refused_naming_what_was_expected(tmp_path: Path) -> None:
    path = tmp_path / "empty.raw"
    path.write_bytes(b"")
    with pytest.raises(DataError, match=r"raw data file '.*empty.raw' is empty; expected "
                       r"samples of 16 bytes \(float32\[2, 2, 1\] = 16 bytes\)"):
        read_raw(path, [IMG])
    with pytest.raises(DataError, match="raw data is empty"):
        read_raw(b"", [IMG])


@pytest.mark.parametrize("dtype, guess", [(np.float64, "float64"), (np.uint8, "uint8"),
                                          (np.float16, "float16")])
def test_size_hint_names_the_dtype_a_raw_file_fits(dtype, guess) -> None:
    """Raw files carry no dtype: the hint is what the size fits, and says it is a guess."""
    n = 5  # samples of 4 elements, written in the wrong dtype
    nbytes = n * 4 * np.dtype(dtype).itemsize
    hint = size_hint(nbytes, [IMG], samples=n)
    assert hint.startswith(f"{nbytes} bytes are 5 samples of {guess}") and \
        f"is it {guess}?" in hint and "raw files carry no dtype" in hint
    assert size_hint(nbytes, [IMG], samples=n + 1) == ""  # the count must match
    assert size_hint(n * 16, [IMG], samples=n) == ""  # float32 itself: nothing to guess


def test_a_size_that_fits_another_dtype_is_named() -> None:
    with pytest.raises(DataError, match=r"has 12 bytes, not a multiple of the 16 bytes per "
                       r"sample .*; its 12 bytes are 3 samples of uint8 or int8: is it uint8\?"):
        read_raw(b"\1" * 12, [IMG])


def test_bad_specs() -> None:
    with pytest.raises(DataError, match=r"input 0 has unknown dimensions \[-1, 4\]"):
        read_raw(b"", [((-1, 4), np.float32)])
    with pytest.raises(DataError, match="no inputs given"):
        read_raw(b"", [])
    with pytest.raises(DataError, match="take 0 bytes per sample"):
        read_raw(b"", [((0,), np.float32)])


def test_write_raw_checks_counts(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"different sample counts \[2, 3\]"):
        write_raw(tmp_path / "x.bin", [np.zeros((2, 1)), np.zeros((3, 1))])
    with pytest.raises(DataError, match="no arrays to write"):
        write_raw(tmp_path / "x.bin", [])
    assert not (tmp_path / "x.bin").exists()


def test_check_same_count() -> None:
    a = [np.zeros((5, 2)), np.zeros((5, 1))]
    assert check_same_count(a, [np.zeros((5, 3))]) == 5
    with pytest.raises(DataError, match="input file has 5 samples, expected file has 4"):
        check_same_count(a, [np.zeros((4, 3))])
    with pytest.raises(DataError, match=r"input arrays have different sample counts \[4, 5\]"):
        check_same_count([np.zeros((5, 2)), np.zeros((4, 1))], [np.zeros((4, 3))])


# ----------------------------------------------------------------------------- npy / npz


def test_npy(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((4, 2, 2, 1)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (got,) = load_array_file(tmp_path / "x.npy", [IMG])
    assert got.dtype == np.float32 and np.array_equal(got, x)


@pytest.mark.parametrize("array", [
    np.random.default_rng(0).random((4, 2, 2, 1)).astype(np.float32).astype(np.float64),
    np.arange(16, dtype=np.int32).reshape(4, 2, 2, 1),
    np.full((4, 2, 2, 1), 255, np.uint8),
    np.full((4, 2, 2, 1), -(2 ** 24), np.int64),  # float32 holds every integer to 2**24
], ids=["float64-exact", "int32", "uint8", "int64-2**24"])
def test_a_lossless_cast_is_made_and_told(tmp_path: Path, array: np.ndarray) -> None:
    np.save(tmp_path / "x.npy", array)
    told: list[str] = []
    (got,) = load_array_file(tmp_path / "x.npy", [IMG], on_cast=told.append)
    assert got.dtype == np.float32 and np.array_equal(got.astype(array.dtype), array)
    assert told == [f"array in '{tmp_path / 'x.npy'}': cast from {array.dtype.name} to "
                    "float32 (every value converts exactly)"]


@pytest.mark.parametrize("array, spec, message", [
    (np.full((4, 2, 2, 1), 0.1), IMG,
     r"has dtype float64, expected float32: 16 of its 16 values change in the cast "
     r"\(e.g. 0.1 becomes 0.1000000014901\d*\); save it as float32"),
    (np.full((4, 2, 2, 1), 2 ** 24 + 1, np.int64), IMG,
     r"has dtype int64, expected float32: 16 of its 16 values change"),
    (np.full((4, 3), 2 ** 31, np.int64), LABEL, r"has dtype int64, expected int32: 12 of"),
    (np.full((4, 3), 1.0), LABEL, r"has dtype float64, expected int32 \(circle-jax casts only "
     r"what converts exactly: integers to integers or floats, floats to floats\)"),
    (np.ones((4, 2, 2, 1), bool), IMG, r"has dtype bool, expected float32 \(circle-jax casts"),
], ids=["float64-rounds", "int64-rounds", "int64-wraps", "float-to-int", "bool"])
def test_a_lossy_or_unexpected_cast_is_refused(tmp_path: Path, array, spec, message) -> None:
    np.save(tmp_path / "x.npy", array)
    with pytest.raises(DataError, match=r"array in '.*x.npy' " + message):
        load_array_file(tmp_path / "x.npy", [spec])


@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((4, 2, 2)), r"has shape \[4, 2, 2\], expected \[N, 2, 2, 1\]"),
        (np.zeros((4, 2, 2, 1), np.complex64), r"has dtype complex64, expected float32"),
    ],
)
def test_npy_errors(tmp_path: Path, array: np.ndarray, message: str) -> None:
    np.save(tmp_path / "x.npy", array)
    with pytest.raises(DataError, match=message):
        load_array_file(tmp_path / "x.npy", [IMG])


def test_an_array_of_no_samples_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((0, 2, 2, 1), np.float32))
    with pytest.raises(DataError, match=r"array in '.*x.npy' holds no samples \(shape "
                       r"\[0, 2, 2, 1\]\); expected \[N, 2, 2, 1\] with N >= 1"):
        load_array_file(tmp_path / "x.npy", [IMG])


def test_npy_with_several_inputs(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((4, 2, 2, 1), np.float32))
    with pytest.raises(DataError, match="holding one array, but the model has 2 inputs"):
        load_array_file(tmp_path / "x.npy", [IMG, LABEL])


def test_npz_positional_and_named(tmp_path: Path) -> None:
    x = np.ones((3, 2, 2, 1), np.float32)
    y = np.arange(9, dtype=np.int64).reshape(3, 3)
    np.savez(tmp_path / "pos.npz", x, y)
    gx, gy = load_array_file(tmp_path / "pos.npz", [IMG, LABEL])
    assert np.array_equal(gx, x) and gy.dtype == np.int32 and np.array_equal(gy, y)
    np.savez(tmp_path / "named.npz", label=y, image=x)
    gx, gy = load_array_file(tmp_path / "named.npz", [IMG, LABEL], names=["image", "label"])
    assert np.array_equal(gx, x) and np.array_equal(gy, y)
    np.savez(tmp_path / "one.npz", whatever=x)
    (gx,) = load_array_file(tmp_path / "one.npz", [IMG])
    assert np.array_equal(gx, x)


def test_npz_errors(tmp_path: Path) -> None:
    x = np.ones((3, 2, 2, 1), np.float32)
    np.savez(tmp_path / "bad.npz", a=x, b=x)
    with pytest.raises(DataError, match=r"holds arrays \['a', 'b'\]; expected 2 arrays named"):
        load_array_file(tmp_path / "bad.npz", [IMG, LABEL], names=["image", "label"])
    np.savez(tmp_path / "count.npz", x, np.zeros((2, 3), np.int32))
    with pytest.raises(DataError, match=r"arrays in .* have different sample counts \[2, 3\]"):
        load_array_file(tmp_path / "count.npz", [IMG, LABEL])


def test_other_extensions_are_raw(tmp_path: Path) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 2, 2, 1)
    (tmp_path / "x.dat").write_bytes(x.tobytes())
    (got,) = load_array_file(tmp_path / "x.dat", [IMG])
    assert np.array_equal(got, x)


# ----------------------------------------------------------------------------- atomic


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_write_bytes_and_callable(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    atomic_write(target, b"abc")
    assert target.read_bytes() == b"abc"
    atomic_write(target, lambda f: f.write(b"xyz"))
    assert target.read_bytes() == b"xyz"
    assert _leftovers(tmp_path) == ["out.bin"]


def test_devices_fifos_and_links_are_written_through_not_replaced(tmp_path: Path) -> None:
    """``--export_circle /dev/null`` discards the export as a shell's ``>`` does (the device
    stays a device); a FIFO gets the bytes; a symbolic link keeps pointing at its target,
    whose contents are replaced."""
    import stat
    import threading

    from circle_jax.formats.atomic import check_writable

    check_writable(os.devnull)
    atomic_write(os.devnull, b"discarded")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, b"through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    target, link = tmp_path / "real.bin", tmp_path / "link.bin"
    target.write_bytes(b"old")
    link.symlink_to(target)
    check_writable(link)
    atomic_write(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    assert _leftovers(tmp_path) == ["link.bin", "pipe", "real.bin"]


def test_failure_mid_write_leaves_nothing(tmp_path: Path) -> None:
    def boom(f) -> None:
        f.write(b"partial data")
        raise RuntimeError("disk on fire")

    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, boom)
    assert _leftovers(tmp_path) == []


def test_a_full_disk_names_the_file_asked_for(tmp_path: Path) -> None:
    """An OSError of the temporary file (ENOSPC while writing) is raised naming the target,
    not the temporary file the caller never named; nothing is left behind."""
    def full(f) -> None:
        f.write(b"partial data")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "out.bin"
    with pytest.raises(OSError) as raised:
        atomic_write(target, full)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(target))
    assert str(raised.value) == f"[Errno 28] No space left on device: {str(target)!r}"
    assert _leftovers(tmp_path) == []


def test_failure_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, lambda f: (f.write(b"new"), (_ for _ in ()).throw(KeyboardInterrupt)))
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == ["out.bin"]


def test_refuses_to_overwrite_the_input(tmp_path: Path) -> None:
    model = tmp_path / "model.circle"
    model.write_bytes(b"model")
    link = tmp_path / "link.circle"
    os.symlink(model, link)
    for target in (model, link, tmp_path / "." / "model.circle"):
        with pytest.raises(DataError, match=r"refusing to write .*: it is the input file"):
            atomic_write(target, b"trained", protect=model)
    with pytest.raises(DataError, match="it is the input file"):
        write_raw(model, [np.zeros((1, 1))], protect=[tmp_path / "other", str(model)])
    assert model.read_bytes() == b"model"
    atomic_write(tmp_path / "trained.circle", b"trained", protect=model)
    assert (tmp_path / "trained.circle").read_bytes() == b"trained"


def test_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a directory"):
        atomic_write(tmp_path, b"x")


def test_keeps_the_mode_of_a_replaced_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    atomic_write(target, b"new")
    assert target.stat().st_mode & 0o777 == 0o640


def test_check_writable_before_any_work(tmp_path: Path) -> None:
    from circle_jax.formats.atomic import check_writable

    check_writable(tmp_path / "out.bin")
    assert os.listdir(tmp_path) == []  # the probe file is gone
    for path, message in ((tmp_path, "it is a directory"),
                          (tmp_path / "no" / "x.bin", "directory .* does not exist"),
                          ("/proc/x.circle", r"cannot create a file in '/proc' \(")):
        with pytest.raises(DataError, match=f"cannot write '{path}': {message}"):
            check_writable(path)
