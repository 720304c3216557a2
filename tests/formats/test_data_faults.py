"""Bad data files are refused with one line naming the file and what was expected: empty,
truncated, pickled and non-numeric .npy/.npz, devices and directories, non-finite samples."""

from __future__ import annotations

import io
import os
import pickle
import tracemalloc
import zipfile

import numpy as np
import pytest

from circle_jax.errors import CircleFormatError, DataError
from circle_jax.formats.rawdata import check_finite, first_non_finite, load_array_file, read_raw
from circle_jax.formats.reader import read_bytes

SPEC = [((3,), np.float32)]


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    assert "allow_pickle" not in msg, msg
    return msg


def test_empty_npy(tmp_path):
    p = tmp_path / "x.npy"
    p.write_bytes(b"")
    with pytest.raises(DataError) as e:
        load_array_file(p, SPEC)
    assert "is empty" in _one_line(e)


def test_truncated_npy(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.zeros((4, 3), np.float32))
    p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(DataError) as e:
        load_array_file(p, SPEC)
    assert "x.npy" in _one_line(e)


def test_pickled_npy_never_suggests_allow_pickle(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(DataError) as e:
        load_array_file(p, SPEC)
    assert "pickled" in _one_line(e)


def test_plain_pickle_as_npy(tmp_path):
    p = tmp_path / "x.npy"
    p.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(DataError) as e:
        load_array_file(p, SPEC)
    _one_line(e)


@pytest.mark.parametrize("cut", [10, 60, -20])
def test_truncated_npz(tmp_path, cut):
    p = tmp_path / "x.npz"
    np.savez(p, np.ones((4, 3), np.float32))
    p.write_bytes(p.read_bytes()[:cut])
    with pytest.raises(DataError) as e:
        load_array_file(p, SPEC)
    assert "x.npz" in _one_line(e)


def _claiming(rows: int) -> bytes:
    """A .npy file of 4 rows whose header declares ``rows`` rows."""
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 3), np.float32))
    raw = buf.getvalue()
    return raw.replace(b"(4, 3)", f"({rows}, 3)".encode().ljust(6))


@pytest.mark.parametrize("rows", [5_000_000, 10**12])
@pytest.mark.parametrize("kind", ["npy", "npz"])
def test_a_header_claiming_more_than_the_file_allocates_nothing(tmp_path, kind, rows):
    """numpy allocates what a .npy header declares before reading: a 200-byte file
    claiming 60 MB (or 12 TB: a MemoryError) is refused from its size, within 1 MB."""
    p = tmp_path / f"x.{kind}"
    if kind == "npy":
        p.write_bytes(_claiming(rows))
    else:
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("arr_0.npy", _claiming(rows))
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as e:
            load_array_file(p, SPEC)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"[{rows}, 3]" in _one_line(e) and "x." in str(e.value)
    assert peak < 1 << 20, peak


@pytest.mark.parametrize("kind", ["npy", "npz"])
def test_a_numpy_file_read_as_raw_data_is_refused(tmp_path, kind):
    """``--load_input:raw x.npy``: the header would be read as samples (values like 1e31,
    an infinite loss at the first step); refused naming the file and what it is."""
    p = tmp_path / f"x.{kind}"
    (np.save if kind == "npy" else np.savez)(p, np.zeros((4, 3), np.float32))
    with pytest.raises(DataError) as e:
        read_raw(p, SPEC)
    assert f"'{p}' is a .{kind}" in _one_line(e) and "not raw data" in str(e.value)
    # raw samples that merely begin with a magic's bytes are raw data
    raw = b"PK\x03\x04" + bytes(8)
    assert read_raw(raw, [((3,), np.float32)])[0].shape == (1, 3)


def test_garbage_npz(tmp_path):
    p = tmp_path / "x.npz"
    p.write_bytes(os.urandom(300))
    with pytest.raises(DataError) as e:
        load_array_file(p, SPEC)
    _one_line(e)


def test_devices_and_directories_are_refused(tmp_path):
    with pytest.raises(DataError) as e:
        read_raw("/dev/zero", SPEC)
    assert "not a regular file" in _one_line(e)
    with pytest.raises(CircleFormatError) as e:
        read_bytes("/dev/zero")
    assert "not a regular file" in _one_line(e)
    with pytest.raises(DataError) as e:
        load_array_file(tmp_path, SPEC)
    _one_line(e)


def test_first_non_finite_names_the_sample():
    x = np.zeros((5, 2, 2), np.float32)
    assert first_non_finite(x) is None
    x[3, 1, 0] = np.inf
    x[4, 0, 0] = np.nan
    assert first_non_finite(x) == 3
    assert first_non_finite(np.arange(4)) is None  # integers are always finite
    with pytest.raises(DataError, match="'in.npy' \\(array 1\\): sample 3 holds NaN"):
        check_finite([np.zeros((5, 1)), x], "'in.npy'")


def test_checksum_seal_detects_changes_and_leaves_foreign_files_alone():
    from circle_jax.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
    from circle_jax.formats.wof import decode_wof, encode_wof

    w = np.arange(6, dtype=np.float32)
    for encode, decode in ((lambda c: encode_checkpoint(Checkpoint([w], step=3), checksum=c),
                            decode_checkpoint),
                           (lambda c: encode_wof([None, w], checksum=c), decode_wof)):
        sealed, plain = encode(True), encode(False)
        assert len(sealed) == len(plain) + 8 and b"CJC1" in sealed
        decode(sealed), decode(plain)  # both read
        for pos in (len(sealed) - 9, 2, sealed.index(b"CJC1") + 5):  # data, header, the CRC
            broken = bytearray(sealed)
            broken[pos] ^= 0x10
            with pytest.raises(CircleFormatError) as e:
                decode(bytes(broken))
            assert "checksum" in str(e.value) or "magic" in str(e.value) or \
                "schema" in str(e.value), str(e.value)


def test_no_file_is_written_from_or_read_with_non_finite_weights(tmp_path):
    import jax.numpy as jnp

    import circle_jax as cj
    from circle_jax.checkpoints import (
        load_checkpoint,
        load_wof,
        save_checkpoint,
        save_wof,
    )
    from circle_jax.examples import branching_cnn
    from circle_jax.formats.checkpoint import decode_checkpoint, encode_checkpoint
    from circle_jax.train import Trainer

    model = cj.load(branching_cnn().to_bytes("circle"))
    trainer = Trainer(model, loss="cce", optimizer="adam", batch_size=4)
    state, frozen = trainer.init(dict(model.params))
    good = tmp_path / "good.ckpt"
    save_checkpoint(good, model, trainer, state, frozen)
    save_wof(tmp_path / "w.wof", model)
    before = good.read_bytes()
    name = next(iter(state.params))
    bad_state = state._replace(params={**state.params,
                                       name: state.params[name].at[0].set(jnp.nan)})
    with pytest.raises(cj.TrainingError, match="NaN or infinite"):
        save_checkpoint(good, model, trainer, bad_state, frozen)
    assert good.read_bytes() == before  # the previous good file is kept
    bad_params = {**model.params, name: bad_state.params[name]}
    with pytest.raises(cj.TrainingError, match="NaN or infinite"):
        save_wof(tmp_path / "w.wof", model, bad_params)
    with pytest.raises(cj.TrainingError, match="NaN or infinity"):
        model.export(bad_params)
    # files holding NaN weights (a foreign writer, no seal) are refused on load
    ckpt = decode_checkpoint(before)
    tensors = [t.copy() for t in ckpt.tensors]
    for t in tensors:
        if t.size >= 4:
            t[:4] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
            break
    nan_file = tmp_path / "nan.ckpt"
    nan_file.write_bytes(encode_checkpoint(
        type(ckpt)(tensors, ckpt.adam_m, ckpt.adam_v, ckpt.step, ckpt.epoch), checksum=False,
        reserved=before[3]))
    with pytest.raises(cj.DataError, match="NaN or infinite"):
        load_checkpoint(nan_file, model, trainer)
    assert load_wof(tmp_path / "w.wof", model).keys() == model.params.keys()


def test_fit_refuses_non_finite_data_before_compiling():
    import circle_jax as cj
    from circle_jax.examples import branching_cnn, digits

    model = cj.load(branching_cnn().to_bytes("circle"))
    x, y = digits()
    x, y = x[:40].copy(), y[:40]
    x[-1] = np.nan  # only in the validation split (the last 20%)
    with pytest.raises(cj.DataError, match="the input data: sample 39 holds NaN"):
        cj.fit(model, x, y, epochs=1, batch_size=8, loss="cce", validation_split=0.2)


def test_fit_refuses_sparse_labels_out_of_range():
    import circle_jax as cj
    from circle_jax.examples import branching_cnn, digits

    model = cj.load(branching_cnn().to_bytes("circle"))
    x, y = digits()
    labels = np.argmax(y[:32], axis=1).astype(np.int32)
    labels[7] = 10  # 10 classes: 0..9
    with pytest.raises(cj.DataError, match=r"sample 7 has label\(s\) \[10\] outside the 10"):
        cj.fit(model, x[:32], labels, epochs=1, batch_size=8, loss="sparse_cce")
    labels[7] = 3
    assert cj.fit(model, x[:32], labels, epochs=1, batch_size=8, loss="sparse_cce").history.loss
