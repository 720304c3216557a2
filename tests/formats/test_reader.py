"""The reader: real files load into the IR, malformed files give one clear line."""

from __future__ import annotations

import os

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model, read_regular_file
from circle_jax.formats.writer import export_model
from tests.paths import SHARED_MODELS, shared_model, shared_model_names

ALL_MODELS = [os.path.join(SHARED_MODELS, n) for n in shared_model_names()]


def test_shared_models_present() -> None:
    assert len(shared_model_names()) >= 20, f"expected the shared models at {SHARED_MODELS}"


@pytest.mark.parametrize("path", ALL_MODELS, ids=os.path.basename)
def test_reads_every_shared_model(path: str) -> None:
    m = read_model(path)
    assert m.file_identifier in ("CIR0", "TFL3")
    assert m.main.operators, "every shared model has operators"
    for sg in m.subgraphs:
        for op in sg.operators:
            assert all(-1 <= i < len(sg.tensors) for i in op.inputs)


def test_circle_negative_opcode_rule() -> None:
    b = cj.Builder()
    x = b.input("x", (1, 4, 4, 2))
    g = b.constant("gamma", np.ones(2, np.float32))
    be = b.constant("beta", np.zeros(2, np.float32))
    b.op("INSTANCE_NORM", [x, g, be], {"epsilon": 1e-5}, shapes=[(1, 4, 4, 2)])
    m = read_model(b.to_bytes("circle"))
    op = m.main.operators[0]
    assert (op.type, op.code) == ("INSTANCE_NORM", -2)


def test_export_without_changes_is_structurally_identical() -> None:
    path = shared_model("onert_micro_simple_mnist_model.circle")
    m = read_model(path)
    again = read_model(export_model(m))
    assert again.file_identifier == "CIR0" and again.description == m.description
    for a, b in zip(m.subgraphs, again.subgraphs):
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        assert [(o.key, o.inputs, o.outputs, dict(o.options)) for o in a.operators] == \
               [(o.key, o.inputs, o.outputs, dict(o.options)) for o in b.operators]
        for ta, tb in zip(a.tensors, b.tensors):
            assert (ta.data is None) == (tb.data is None)
            if ta.data is not None:
                assert ta.data.tobytes() == tb.data.tobytes()


def _valid_bytes() -> bytes:
    with open(shared_model("tflm_hello_world_sine_float.tflite"), "rb") as f:
        return f.read()


BAD_FILES = {
    "empty": (b"", "too short"),
    "tiny": (b"\x00\x01\x02", "too short"),
    "random": (bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
               "neither b'CIR0'"),
    "wrong identifier": (b"\x10\x00\x00\x00ONNX" + b"\x00" * 64, "neither b'CIR0'"),
    "truncated root": (b"\xff\xff\x00\x00TFL3" + b"\x00" * 16, "past the end"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_give_one_clear_line(name: str) -> None:
    data, expected = BAD_FILES[name]
    with pytest.raises(cj.CircleFormatError) as e:
        read_model(data)
    msg = str(e.value)
    assert expected in msg and "\n" not in msg


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9, 0.99])
def test_truncated_model_is_refused(keep: float) -> None:
    data = _valid_bytes()
    with pytest.raises(cj.CircleFormatError) as e:
        read_model(data[: int(len(data) * keep)])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cut", [300, 1000, 20000])
def test_a_truncated_real_model_says_where_its_offsets_lead(cut: int) -> None:
    """An offset past the end is named as the byte it reaches (before: struct's message cut
    at 80 characters, "... for unpacking 4 bytes at )")."""
    with open(shared_model("aeq_conv_fc_mnist.tflite"), "rb") as f:
        data = f.read(cut)
    with pytest.raises(cj.CircleFormatError) as e:
        read_model(data)
    msg = str(e.value)
    assert f"of the {cut}-byte file); the file is truncated or corrupted" in msg, msg
    assert " at )" not in msg and "\n" not in msg


def test_out_of_range_tensor_index_is_refused() -> None:
    b = cj.Builder()
    x = b.input("x", (1, 4))
    b.op("RELU", [x], shapes=[(1, 4)])
    obj = b.to_object()
    obj.subgraphs[0].operators[0].inputs = [7]
    from circle_jax.formats.writer import pack

    with pytest.raises(cj.CircleFormatError, match=r"input tensor index 7 is out of range"):
        read_model(pack(obj, "circle"))


def test_missing_file() -> None:
    with pytest.raises(cj.CircleFormatError, match="cannot read model file"):
        read_model("/nonexistent/model.circle")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX (CI runs Linux)")
def test_fifo_model_is_refused_without_blocking(tmp_path) -> None:
    # A FIFO with no writer would block open() forever; the reader refuses it from stat().
    fifo = tmp_path / "model.circle"
    os.mkfifo(fifo)
    with pytest.raises(cj.CircleFormatError, match="not a regular file") as e:
        read_model(fifo)
    assert "\n" not in str(e.value) and str(fifo) in str(e.value)


def test_file_over_the_size_limit_is_refused(tmp_path) -> None:
    # The limit is checked from the file's size before reading; a 64-byte file against a
    # 16-byte limit shows the rule (the default limit is MAX_FILE_BYTES).
    p = tmp_path / "big.circle"
    p.write_bytes(bytes(64))
    with pytest.raises(cj.CircleFormatError, match="64 bytes is over the 16-byte limit") as e:
        read_regular_file(str(p), "model", limit=16)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert read_regular_file(str(p), "model", limit=64) == bytes(64)


def test_unsupported_operators_listed_at_once() -> None:
    b = cj.Builder()
    x = b.input("x", (1, 4))
    y = b.op("HASHTABLE_SIZE", [x], shapes=[(1,)], dtypes=["int64"])
    z = b.op("NON_MAX_SUPPRESSION_V4", [x], shapes=[(1,)])
    b.output(y, z)
    with pytest.raises(cj.UnsupportedOperatorError) as e:
        cj.load(b.to_bytes("circle"))
    msg = str(e.value)
    assert "2 unsupported operator(s)" in msg
    assert "HASHTABLE_SIZE (code" in msg and "NON_MAX_SUPPRESSION_V4 (code" in msg
    assert "operator 0" in msg and "operator 1" in msg and "\n" not in msg


_UNDER_LIMIT = """
import resource, sys
limit = 4_000_000 << 10  # ulimit -v 4000000, as on shared servers and in fuzz workers
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import circle_jax as cj
from circle_jax.formats.reader import MAX_FILE_BYTES
try:
    bytearray(MAX_FILE_BYTES + 1)  # what a read of the whole limit would ask for
    sys.exit("the address-space limit did not bite")
except MemoryError:
    pass
model = cj.load(sys.argv[1])
print(len(model.operators), "operators")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="RLIMIT_AS is POSIX (CI runs Linux)")
def test_loading_under_an_address_space_limit(tmp_path) -> None:
    """``ulimit -v``: a bounded read allocates what the file holds, not its 8 GiB limit
    (before, a 4 KB model raised MemoryError under ``ulimit -v 4000000``). In a
    subprocess, the limit set before anything is imported."""
    import subprocess
    import sys

    from tests.toy_models import cnn

    path = tmp_path / "cnn.circle"
    cnn().save(path)
    run = subprocess.run([sys.executable, "-c", _UNDER_LIMIT, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == f"{len(cj.load(str(path)).operators)} operators"


def test_a_file_that_grows_while_read_is_refused(tmp_path, monkeypatch) -> None:
    p = tmp_path / "m.circle"
    p.write_bytes(bytes(8))
    import circle_jax.formats.reader as reader

    monkeypatch.setattr(reader, "check_regular_file", lambda *a, **k: 4)  # stat said 4
    with pytest.raises(cj.CircleFormatError, match="grew while being read"):
        read_regular_file(str(p), "model")
