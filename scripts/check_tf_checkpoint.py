"""Check circle-jax's TF V1 checkpoints against TensorFlow's own Save and readers.

Run by hand, never by CI (it needs tensorflow-cpu; see scripts/make_ondevice_models.py for its
venv), with circle_jax and its format dependencies importable:

    PYTHONPATH=$PWD /work/tfenv/bin/python scripts/check_tf_checkpoint.py \
        [--out tests/data/ondevice]

For each case (a set of tensors: every element type TF's Save takes, one per case and all
together; names with '/' and non-ASCII; scalars and empty tensors; tensors large enough for
several 256 KiB table blocks) it writes the tensors with circle-jax's ``write_checkpoint`` and
with ``tf.raw_ops.Save``, then records: whether the two files are byte-identical; whether TF's
``NewCheckpointReader`` reads circle-jax's file with the same names, shapes, dtypes and values;
whether ``tf.raw_ops.Restore`` returns every tensor of it exactly; and whether circle-jax's
``read_checkpoint`` reads TF's file exactly. A type TF's Save refuses is recorded with TF's
message. Writes ``tf_checkpoint_check.json`` and TF's file of the case ``all``
(``tf_written_all.ckpt``) with its tensors' values (``tf_written_all.npz``, strings as bytes)
into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def _cases() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    singles = {
        "float32": rng.standard_normal((3, 4)).astype(np.float32),
        "float64": rng.standard_normal(5),
        "int32": rng.integers(-2**31, 2**31 - 1, (2, 2), dtype=np.int32),
        "int64": np.asarray(-(2**40) - 3, np.int64),
        "int16": rng.integers(-2**15, 2**15 - 1, 3, dtype=np.int16),
        "int8": np.asarray([-128, -1, 0, 127], np.int8),
        "uint8": np.asarray([0, 1, 128, 255], np.uint8),
        "uint16": np.asarray([0, 1, 65535], np.uint16),
        "bool": np.asarray([True, False, True]),
        "float16": np.asarray([0.5, -2.0, 65504.0], np.float16),
        "bfloat16": np.asarray([0.5, -3.0, 1e30], ml_dtypes.bfloat16),
        "complex64": (rng.standard_normal(2) + 1j * rng.standard_normal(2)).astype(np.complex64),
        "complex128": rng.standard_normal(2) + 1j * rng.standard_normal(2),
        "string": np.asarray([b"ab", b"", b"\x00\xff"], object),
        "empty": np.zeros((0, 3), np.float32),
    }
    cases = {f"only_{k}": {f"t/{k}": v} for k, v in singles.items()}
    cases["names"] = {"cnn/conv/kernel": singles["float32"], "café/β": singles["float64"],
                      "a": np.float32(1.5), "a\x00b": np.int64(3), "": np.float32(2)}
    big = rng.standard_normal((3, 70_000)).astype(np.float32)
    cases["blocks"] = {"big/a": big[0], "big/b": big[1], "big/c": big[2],
                       "small": np.arange(5, dtype=np.float32)}
    return cases, singles


def _tf_save(tf, path: str, tensors: dict[str, np.ndarray]) -> None:
    names = list(tensors)
    tf.raw_ops.Save(filename=path, tensor_names=names,
                    data=[tf.constant(tensors[n]) for n in names])


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "OS" or b.dtype.kind in "OS":
        return [bytes(x) for x in a.reshape(-1)] == [bytes(x) for x in b.reshape(-1)]
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def _tf_reads(tf, path: str, tensors: dict[str, np.ndarray]) -> dict:
    """Per tensor, whether TF's NewCheckpointReader (shape, value) and tf.raw_ops.Restore
    (value) read it from ``path`` exactly; "error: ..." with TF's words where TF fails."""
    out: dict = {}
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    shapes = reader.get_variable_to_shape_map()
    out["names_equal"] = set(shapes) == set(tensors)
    for k, v in tensors.items():
        r: dict = {}
        try:
            r["reader"] = (list(shapes[k]) == list(np.shape(v))
                           and _equal(reader.get_tensor(k), v))
        except Exception as e:  # noqa: BLE001  (record what TF says)
            r["reader"] = "error: " + str(e).splitlines()[0][:200]
        try:
            dt = tf.as_dtype(np.asarray(v).dtype if np.asarray(v).dtype.kind != "O"
                             else tf.string)
            r["restore_op"] = _equal(tf.raw_ops.Restore(file_pattern=path, tensor_name=k,
                                                        dt=dt).numpy(), v)
        except Exception as e:  # noqa: BLE001
            r["restore_op"] = "error: " + str(e).splitlines()[0][:200]
        out[k] = r
    return out


def _check(tf, name: str, tensors: dict[str, np.ndarray], tmp: str) -> dict:
    from circle_jax.formats.tf_checkpoint import read_checkpoint, write_checkpoint

    cj_path, tf_path = os.path.join(tmp, f"{name}.cj"), os.path.join(tmp, f"{name}.tf")
    rec: dict = {"tensors": {k: [np.asarray(v).dtype.name if np.asarray(v).dtype.kind != "O"
                                 else "string", list(np.shape(v))] for k, v in tensors.items()}}
    try:
        _tf_save(tf, tf_path, tensors)
    except Exception as e:  # noqa: BLE001  (record what TF says)
        rec["tf_save_error"] = str(e).splitlines()[0][:300]
        tf_path = None
    try:
        write_checkpoint(cj_path, tensors)
    except Exception as e:  # noqa: BLE001  (a type circle-jax refuses: record its message)
        rec["circle_jax_write_error"] = str(e)
        return rec
    cj = Path(cj_path).read_bytes()
    rec["circle_jax_bytes"] = len(cj)
    if tf_path:
        tfb = Path(tf_path).read_bytes()
        rec["tf_bytes"] = len(tfb)
        rec["bytes_equal"] = cj == tfb
        back = read_checkpoint(tf_path)
        rec["circle_jax_reads_tf"] = set(back) == set(tensors) and all(
            _equal(back[k], tensors[k]) for k in tensors)
    rec["tf_reads_circle_jax"] = _tf_reads(tf, cj_path, tensors)
    if tf_path:
        rec["tf_reads_tf"] = _tf_reads(tf, tf_path, tensors)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/ondevice")
    args = ap.parse_args()
    import tensorflow as tf

    cases, singles = _cases()
    report: dict = {"tensorflow": tf.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tensors in cases.items():
            report["cases"][name] = _check(tf, name, tensors, tmp)
        saved = {k for k, r in report["cases"].items()
                 if k.startswith("only_") and "tf_save_error" not in r}
        every = {f"t/{k[5:]}": singles[k[5:]] for k in sorted(saved)}
        report["cases"]["all"] = _check(tf, "all", every, tmp)
        out = Path(args.out)
        _tf_save(tf, str(out / "tf_written_all.ckpt"), every)
    np.savez(out / "tf_written_all.npz", **{
        k: (np.asarray([bytes(x) for x in v.reshape(-1)], "S").reshape(v.shape)
            if v.dtype.kind == "O" else v) for k, v in every.items()})
    (out / "tf_checkpoint_check.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, r in report["cases"].items():
        print(name, json.dumps({k: v for k, v in r.items() if k != "tensors"}))


if __name__ == "__main__":
    main()
