"""onert_train raw data files, .npy/.npz loading, and atomic writes."""

from __future__ import annotations

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


def test_empty_file_has_no_samples() -> None:
    (got,) = read_raw(b"", [IMG])
    assert got.shape == (0, 2, 2, 1)


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
    x = np.random.default_rng(0).random((4, 2, 2, 1))  # float64 on disk
    np.save(tmp_path / "x.npy", x)
    (got,) = load_array_file(tmp_path / "x.npy", [IMG])
    assert got.dtype == np.float32 and np.allclose(got, x)


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


def test_failure_mid_write_leaves_nothing(tmp_path: Path) -> None:
    def boom(f) -> None:
        f.write(b"partial data")
        raise RuntimeError("disk on fire")

    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, boom)
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
