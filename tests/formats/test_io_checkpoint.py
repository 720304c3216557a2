"""onert checkpoint files: layout, validation, and real checkpoints written by onert."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest

from circle_jax.errors import CircleFormatError, DataError
from circle_jax.formats.checkpoint import Checkpoint, as_array, decode_checkpoint, encode_checkpoint
from tests.onert_peer import open_session, train_batch
from tests.paths import shared_model

W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([0.5, -0.5], np.float32)
SHAPE = np.array([-1, 6], np.int32)


def _adam() -> Checkpoint:
    return Checkpoint(
        tensors=[W, B, SHAPE],
        adam_m=[W * 0.1, B * 0.1, b""],
        adam_v=[W * 0.01, B * 0.01, b""],
        step=12,
        epoch=3,
    )


def test_sgd_layout() -> None:
    buf = encode_checkpoint(Checkpoint([W, B], step=5), checksum=False)
    magic, schema, reserved, opt1, opt2, other, n = struct.unpack_from("<HBBIIII", buf)
    assert (magic, schema, reserved, n) == (429, 1, 0, 2)
    assert struct.unpack_from("<2I", buf, 20) == (28, 52)
    assert buf[28:52] == W.tobytes() and buf[52:60] == B.tobytes()
    # onert writes opt1_offset = other_offset and opt2_offset = 0 for SGD
    assert (opt1, opt2, other) == (60, 0, 60) and len(buf) == 68
    assert struct.unpack_from("<2I", buf, other) == (5, 0)


def test_adam_layout() -> None:
    buf = encode_checkpoint(_adam(), checksum=False)
    _, _, _, opt1, opt2, other, n = struct.unpack_from("<HBBIIII", buf)
    tensor_end = 20 + 12 + 24 + 8 + 8
    assert opt1 == tensor_end
    assert struct.unpack_from("<3I", buf, opt1) == (opt1 + 12, opt1 + 36, opt1 + 44)
    assert opt2 == opt1 + 44
    assert struct.unpack_from("<3I", buf, opt2) == (opt2 + 12, opt2 + 36, opt2 + 44)
    assert other == opt2 + 44 == len(buf) - 8
    assert struct.unpack_from("<2I", buf, other) == (12, 3)


@pytest.mark.parametrize(
    "ckpt",
    [_adam(), Checkpoint([W, B], step=1), Checkpoint([]), Checkpoint([b"", W])],
)
def test_round_trip_is_bit_exact(ckpt: Checkpoint) -> None:
    buf = encode_checkpoint(ckpt, checksum=False)
    got = decode_checkpoint(buf, expected_count=len(ckpt.tensors))
    assert got == ckpt
    assert encode_checkpoint(got, checksum=False) == buf


def test_entries_as_arrays() -> None:
    got = decode_checkpoint(encode_checkpoint(_adam(), checksum=False))
    assert np.array_equal(as_array(got.tensors[0], np.float32, (2, 3)), W)
    assert np.array_equal(as_array(got.adam_v[1], "float32", (2,)), B * 0.01)
    with pytest.raises(DataError, match=r"entry has 8 bytes, expected 12 for float32\[3\]"):
        as_array(got.tensors[2], np.float32, (3,))


def test_sgd_with_zero_opt1_offset_is_read() -> None:
    buf = bytearray(encode_checkpoint(Checkpoint([W], step=2), checksum=False))
    struct.pack_into("<I", buf, 4, 0)  # formats.md: "0 offsets for SGD"
    got = decode_checkpoint(bytes(buf))
    assert not got.is_adam and got.step == 2


def test_checkpoint_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="needs both adam_m and adam_v"):
        Checkpoint([W], adam_m=[W])
    with pytest.raises(ValueError, match=r"adam_m has 1 entries, expected 2"):
        Checkpoint([W, B], adam_m=[W], adam_v=[W])
    with pytest.raises(ValueError, match=r"m has 8 bytes and v 8, expected both 0 or both 24"):
        Checkpoint([W], adam_m=[B], adam_v=[B])


def _patched(offset: int, fmt: str, value: int, base: bytes | None = None) -> bytes:
    buf = bytearray(encode_checkpoint(_adam(), checksum=False) if base is None else base)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


GOOD = encode_checkpoint(_adam(), checksum=False)
_, _, _, OPT1, OPT2, OTHER, _ = struct.unpack_from("<HBBIIII", GOOD)


@pytest.mark.parametrize(
    "buf, count, message",
    [
        (GOOD[:10], None, r"checkpoint is truncated: 10 bytes, expected at least 28"),
        (_patched(0, "<H", 428), None, r"not an onert checkpoint: magic number is 428"),
        (_patched(2, "<B", 2), None, r"unsupported checkpoint schema version 2, expected 1"),
        (
            GOOD[:-3],
            None,
            rf"step/epoch at offset {OTHER} should be the last 8 bytes, but the file has "
            rf"{len(GOOD) - 3} bytes",
        ),
        (GOOD + b"\0", None, r"should be the last 8 bytes"),
        (GOOD, 4, r"checkpoint does not fit the model: it has 3 tensors, expected 4"),
        (
            _patched(4, "<I", OPT2 + 4),
            None,
            r"section offsets are out of order: opt1 \d+, opt2 \d+, other \d+",
        ),
        (
            _patched(4, "<I", 40, encode_checkpoint(Checkpoint([W]), checksum=False)),
            None,
            r"without Adam state \(opt2_offset 0\) has opt1_offset 40; expected 0 or 48",
        ),
        (_patched(20, "<I", 10), None, r"tensor entry 0: offset 10 is outside \[32, \d+\]"),
        (_patched(24, "<I", 20), None, r"tensor entry 1: offset 20 is outside \[\d+, \d+\]"),
        (_patched(OPT2 + 8, "<I", OTHER + 1), None, r"Adam v entry 2: offset \d+ is outside"),
        (
            _patched(16, "<I", 1000),
            None,
            r"tensor: 1000 offsets need bytes 20..4020, but the section ends at \d+",
        ),
        (
            _patched(OPT1 + 4, "<I", OPT1 + 16),
            None,
            r"checkpoint is inconsistent: Adam state of tensor 0: m has 4 bytes and v 24",
        ),
    ],
)
def test_bad_files(buf: bytes, count: int | None, message: str) -> None:
    with pytest.raises(CircleFormatError, match=message) as e:
        decode_checkpoint(buf, expected_count=count)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- onert


def _shared_model(name: str) -> Path:
    return Path(shared_model(name))


MNIST = "onert_micro_simple_mnist_model.circle"


def _session(model: Path, batch: int = 2):
    """onert training the model with Adam (code 2) on CCE, sum over batch size."""
    return open_session(model, batch_size=batch, learning_rate=0.01, loss=2, reduction=1,
                        optimizer=2)


def _step(s, update: bool = True, batch: int = 2) -> float:
    x = np.random.default_rng(0).random((batch, 11, 11, 1), dtype=np.float32)
    y = np.eye(2, dtype=np.float32)[np.arange(batch) % 2]
    loss = train_batch(s, [x], [y], update)[0]
    assert loss > 0
    return loss


def _constants(path: Path) -> dict[int, tuple[bytes, int]]:
    """tensor index -> (bytes, numpy dtype kind) for constant tensors of subgraph 0."""
    from circle_schema.v0_10.circle.Model import ModelT

    model = ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    out = {}
    for i, t in enumerate(model.subgraphs[0].tensors):
        data = model.buffers[t.buffer].data
        if data is not None and len(data):
            out[i] = (bytes(np.asarray(data, np.uint8)), "f" if t.type == 0 else "i")
    return out


def test_real_onert_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # onert 0.1.0 garbles paths over 15 bytes: use short names
    model = _shared_model(MNIST)
    constants = _constants(model)  # 4 float weights + the int32 Reshape shape
    s = _session(model)
    _step(s)
    path = tmp_path / "onert.ckpt"
    s.train_export_checkpoint(path.name)
    raw = path.read_bytes()
    ckpt = decode_checkpoint(raw, expected_count=len(constants))
    assert encode_checkpoint(ckpt, checksum=False) == raw  # laid out exactly as onert does
    assert ckpt.is_adam and ckpt.step == 1 and ckpt.epoch == 0

    # every constant appears once; the float ones (trained) have Adam state, the shape has none
    by_content = {v[0]: i for i, v in constants.items()}
    floats = sorted(len(b) for b, kind in constants.values() if kind == "f")
    stateful = [t for t, m in zip(ckpt.tensors, ckpt.adam_m, strict=True) if m.size]
    assert sorted(t.size for t in stateful) == floats
    assert sorted(t.size for t in ckpt.tensors) == sorted(len(b) for b, _ in constants.values())
    # trained weights changed; exactly the unchanged entries (the shape) have no Adam state
    assert [m.size == 0 for m in ckpt.adam_m] == [t.tobytes() in by_content for t in ckpt.tensors]
    assert all(np.any(v.view(np.float32) > 0) for v in ckpt.adam_v if v.size)


def test_onert_imports_our_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # onert 0.1.0 garbles paths over 15 bytes: use short names
    model = _shared_model(MNIST)
    a = _session(model)
    for _ in range(3):
        _step(a)
    exported = tmp_path / "a.ckpt"
    a.train_export_checkpoint(exported.name)
    ckpt = decode_checkpoint(exported.read_bytes())
    assert ckpt.step == 3
    loss_a = _step(a, update=False)

    ours = tmp_path / "ours.ckpt"
    ours.write_bytes(encode_checkpoint(dataclasses.replace(ckpt, step=41), checksum=False))
    b = _session(model)
    b.train_import_checkpoint(ours.name)
    assert _step(b, update=False) == loss_a  # same weights, bit for bit
    back = tmp_path / "b.ckpt"
    b.train_export_checkpoint(back.name)
    again = decode_checkpoint(back.read_bytes())
    assert again == dataclasses.replace(ckpt, step=41)  # tensors, m, v and step restored
