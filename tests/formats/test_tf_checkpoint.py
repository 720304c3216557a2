"""TF V1 checkpoints (circle_jax.formats.tf_checkpoint, leveldb_table) against TensorFlow's own
files: the ten written by tf.raw_ops.Save in scripts/make_ondevice_models.py (values = the
npz's init/ and final/) and the one of every type Save takes written by
scripts/check_tf_checkpoint.py, which also recorded that TF reads circle-jax's files."""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

from circle_jax.errors import CircleFormatError, DataError
from circle_jax.formats import tf_proto
from circle_jax.formats.leveldb_table import build_table, masked_crc32c, read_table
from circle_jax.formats.tf_checkpoint import (
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    restore,
    write_checkpoint,
)
from tests.paths import TESTS

DATA = os.path.join(TESTS, "data", "ondevice")
MODELS = ("mlp_sgd", "mlp_adam", "frozen_head", "tutorial_cnn", "tutorial_cnn_adam")


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and text
    return text


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kind, prefix", [("init", "init/"), ("trained", "final/")])
def test_tf_written_checkpoints_read_exactly_and_reencode_to_tf_bytes(model, kind, prefix):
    path = os.path.join(DATA, f"{model}.{kind}.ckpt")
    got = read_checkpoint(path)
    npz = np.load(os.path.join(DATA, f"{model}.npz"))
    want = {k[len(prefix):]: npz[k] for k in npz.files if k.startswith(prefix)}
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_array_equal(got[name], w)
    with open(path, "rb") as f:
        assert encode_checkpoint(got) == f.read()


def _tf_all_values() -> dict[str, np.ndarray]:
    npz = np.load(os.path.join(DATA, "tf_written_all.npz"))
    return {k: (npz[k].astype(object) if npz[k].dtype.kind == "S" else npz[k])
            for k in npz.files}


def test_every_type_tf_saves_reads_and_reencodes_to_tf_bytes():
    path = os.path.join(DATA, "tf_written_all.ckpt")
    got, want = read_checkpoint(path), _tf_all_values()
    assert sorted(got) == sorted(want) and len(want) >= 13
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        assert [bytes(x) if isinstance(x, bytes) else x for x in got[name].reshape(-1)] == list(
            w.reshape(-1)), name
    with open(path, "rb") as f:
        assert encode_checkpoint(got) == f.read()
    # the values TF wrote, given to circle-jax's writer, give TF's bytes too
    with open(path, "rb") as f:
        assert encode_checkpoint(want) == f.read()


def test_tf_read_circle_jax_checkpoints_by_hand():
    """What scripts/check_tf_checkpoint.py recorded with TF 2.21: every case TF's Save takes
    is byte-identical and TF's Restore returns each of circle-jax's tensors exactly."""
    with open(os.path.join(DATA, "tf_checkpoint_check.json")) as f:
        cases = json.load(f)["cases"]
    saved = [c for c in cases.values() if "tf_bytes" in c]
    assert len(saved) >= 16 and "blocks" in cases and cases["blocks"]["tf_bytes"] > 512 * 1024
    for c in saved:
        assert c["bytes_equal"] and c["circle_jax_reads_tf"]
        reads = c["tf_reads_circle_jax"]
        assert reads.pop("names_equal")
        assert all(r["restore_op"] is True for r in reads.values())
    assert "circle_jax_write_error" in cases["only_bfloat16"]


def test_round_trip_of_types_names_and_shapes(tmp_path):
    tensors = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "cnn/conv/kernel": np.ones((3, 3, 1, 4), np.float32),
        "step": np.asarray(7, np.int64),
        "café/β": np.asarray([1.5, -2.25]),
        "a\x00b": np.asarray([True, False]),
        "": np.zeros((0, 2), np.int32),
        "h": np.asarray([1.0, -0.5], np.float16),
        "c": np.asarray([1 + 2j], np.complex64),
        "s": np.asarray([b"x", b"\xff\x00"], object),
        "i8": np.asarray([-128, 127], np.int8),
        "u16": np.asarray([65535], np.uint16),
    }
    path = tmp_path / "x.ckpt"
    write_checkpoint(path, tensors)
    got = read_checkpoint(path)
    assert list(got) == sorted(tensors, key=str.encode)
    for name, a in tensors.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert list(got[name].reshape(-1)) == list(a.reshape(-1)), name


def test_table_with_many_blocks_round_trips():
    entries = [(b"k%05d" % i, bytes([i % 251]) * (i % 300)) for i in range(400)]
    buf = build_table(entries, block_size=1024)
    assert read_table(buf, "t") == entries
    with pytest.raises(ValueError, match="increase"):
        build_table([(b"b", b""), (b"a", b"")])


def test_restore_checks_names_shapes_and_types():
    path = os.path.join(DATA, "mlp_sgd.init.ckpt")
    got = restore(path, {"w1": ((8, 16), np.float32), "b2": ((4,), "float32")})
    assert sorted(got) == ["b2", "w1"]
    with pytest.raises(DataError) as e:
        restore(path, {"w1": ((16, 8), np.float32)})
    assert "'w1' is float32 [8, 16], expected float32 [16, 8]" in _one_line(e)
    with pytest.raises(DataError) as e:
        restore(path, {"b1": ((16,), np.int64)})
    assert "expected int64 [16]" in _one_line(e)
    with pytest.raises(DataError) as e:
        restore(path, {"nope": ((1,), np.float32)})
    assert "no tensor 'nope'" in _one_line(e) and "'w1'" in str(e.value)


def _ckpt_bytes() -> bytes:
    with open(os.path.join(DATA, "mlp_sgd.init.ckpt"), "rb") as f:
        return f.read()


def test_not_a_checkpoint_and_truncated_files(tmp_path):
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(b"hello world" * 10, "x.ckpt")
    assert "not a TensorFlow V1 checkpoint or is truncated" in _one_line(e)
    with open(os.path.join(DATA, "mlp_sgd.tflite"), "rb") as f:
        with pytest.raises(CircleFormatError, match="table magic"):
            decode_checkpoint(f.read())
    buf = _ckpt_bytes()
    for cut in (1, 8, len(buf) // 2, len(buf) - 10):
        with pytest.raises(CircleFormatError) as e:
            decode_checkpoint(buf[:cut], "x.ckpt")
        _one_line(e)
    # a truncated data region under an intact footer: handles run past the data
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(buf[:100] + buf[-48:], "x.ckpt")
    assert "truncated or corrupted" in _one_line(e)
    missing = tmp_path / "missing.ckpt"
    with pytest.raises(CircleFormatError) as e:
        read_checkpoint(missing)
    _one_line(e)


def test_bad_crc_and_snappy_blocks():
    buf = bytearray(_ckpt_bytes())
    buf[200] ^= 0x01
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(bytes(buf), "x.ckpt")
    assert "CRC-32C" in _one_line(e)
    # the data block re-sealed as snappy-compressed (type 1, its CRC recomputed)
    buf = bytearray(_ckpt_bytes())
    size = 0x428  # the data block's size (its handle in the index: offset 0, size 1064)
    buf[size] = 1
    buf[size + 1:size + 5] = masked_crc32c(bytes(buf[:size + 1])).to_bytes(4, "little")
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(bytes(buf), "x.ckpt")
    assert "snappy-compressed" in _one_line(e)


def test_v2_index_and_foreign_tables_are_told_apart():
    v2 = build_table([(b"", b"\x08\x01"), (b"w1", b"\x08\x01")])
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(v2, "model.index")
    assert "V2 checkpoint" in _one_line(e)
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(build_table([(b"a", b"b")]), "t")
    assert "without the SavedTensorSlices metadata" in _one_line(e)
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(build_table([(b"", b"\xff\xff\xff")]), "t")
    assert "not a SavedTensorSlices" in _one_line(e)


def _meta(name: str, shape: tuple[int, ...], code: int = 1) -> bytes:
    m = tf_proto.SavedTensorSlices()
    t = m.meta.tensor.add(name=name, type=code)
    t.shape.SetInParent()
    for d in shape:
        t.shape.dim.add(size=d)
    return m.SerializeToString()


def _slice(name: str, extents: list[tuple[int, int]], values: list[float]) -> bytes:
    m = tf_proto.SavedTensorSlices()
    m.data.name = name
    m.data.slice.SetInParent()
    for start, length in extents:
        m.data.slice.extent.add(start=start, length=length)
    m.data.data.float_val.extend(values)
    return m.SerializeToString()


def test_slices_of_a_partitioned_tensor_are_assembled():
    meta = _meta("p", (4, 2))
    top = _slice("p", [(0, 2), (0, 2)], [0, 1, 2, 3])
    bottom = _slice("p", [(2, 2), (0, 2)], [4, 5, 6, 7])
    got = decode_checkpoint(build_table([(b"", meta), (b"\x00a", top), (b"\x00b", bottom)]))
    np.testing.assert_array_equal(got["p"], np.arange(8, dtype=np.float32).reshape(4, 2))
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(build_table([(b"", meta), (b"\x00a", top)]), "t")
    assert "values for 4 of its 8 elements" in _one_line(e)
    outside = _slice("p", [(3, 2), (0, 2)], [0, 0, 0, 0])
    with pytest.raises(CircleFormatError, match="outside its dimension"):
        decode_checkpoint(build_table([(b"", meta), (b"\x00a", outside)]), "t")


def test_allocation_is_bounded_by_the_file():
    huge = build_table([(b"", _meta("big", (1 << 20, 1 << 20)))])
    with pytest.raises(CircleFormatError) as e:
        decode_checkpoint(huge, "t")
    assert "more than the file's" in _one_line(e)
    with pytest.raises(CircleFormatError, match="values for 0 of"):
        decode_checkpoint(build_table([(b"", _meta("x", (3,)))]), "t")


def test_writer_refuses_what_tf_cannot_read():
    with pytest.raises(DataError) as e:
        encode_checkpoint({"b": np.zeros(2, ml_dtypes.bfloat16)})
    assert "bfloat16" in _one_line(e)
    with pytest.raises(DataError) as e:
        encode_checkpoint({"o": np.asarray([1, None], object)})
    assert "bytes or str" in _one_line(e)
