"""Asking the installed onert wheel how it lays out a model's checkpoint.

onert stores one checkpoint entry per constant tensor of subgraph 0 in the order of its
internal hash maps (a function of the tensor indices and count, not of the weights), and
reads entries back by position without checks. The order is found by experiment: a copy
of the model whose float constants hold distinct marker values trains one step with no
trainable operator, and the exported checkpoint's entries are matched to tensors by
content. The onert session runs in a child process, in a temporary working directory
(onert 0.1.0 garbles model paths over 15 bytes, so it is given a short relative name), so
neither a crash of onert nor its working directory touches the caller's process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..formats.atomic import atomic_write
from ..formats.checkpoint import decode_checkpoint
from ..formats.reader import read_model
from ..formats.writer import export_model
from ..graph import ir

PROBE_TIMEOUT_S = 120
"""The longest the onert child process may take to train its one step."""


#: where `onert_checkpoint_order` keeps its answers across processes (None: this process
#: only); set by `answers_kept_in`
_answers: Path | None = None


@contextlib.contextmanager
def answers_kept_in(directory: str | os.PathLike | None) -> Iterator[None]:
    """Inside the block, keep `onert_checkpoint_order`'s answers, refusals included, in
    ``directory`` (created when first written; a JSON file per model bytes and onert
    version), so that a later process asks onert again only for another model or another
    onert; None: this process only. The command line keeps them beside its compiled
    programs."""
    global _answers
    before, _answers = _answers, None if directory is None else Path(directory)
    try:
        yield
    finally:
        _answers = before


def _answer_file(source: bytes) -> Path | None:
    """Where the answer for ``source`` is kept under `_answers` (None: not kept)."""
    if _answers is None:
        return None
    try:
        version = importlib.metadata.version("onert")
    except importlib.metadata.PackageNotFoundError:
        return None  # nothing to ask
    key = hashlib.sha256(source + f"\0onert {version}".encode()).hexdigest()
    return _answers / f"{key}.json"


class _TooSlow(DataError):
    """onert did not answer within `PROBE_TIMEOUT_S`: never kept, a later run asks again."""


@functools.lru_cache(maxsize=16)
def _cached_order(source: bytes) -> tuple[int, ...] | str:
    """The order for ``source``, or onert's refusal as its message: kept, or asked of
    onert (and kept, unless onert was too slow to answer)."""
    kept = _answer_file(source)
    if kept is not None:
        try:
            answer = json.loads(kept.read_text())
            if "refused" in answer:
                return str(answer["refused"])
            return tuple(int(i) for i in answer["order"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not kept, unreadable or damaged: ask
    try:
        found: tuple[int, ...] | str = _probe(source)
    except _TooSlow as e:
        return str(e)
    except DataError as e:
        found = str(e)
    if kept is not None:
        record = {"refused": found} if isinstance(found, str) else {"order": list(found)}
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(kept, json.dumps(record).encode())
        except OSError:
            pass  # a read-only or full cache: asked again next time
    return found


def onert_checkpoint_order(source: bytes) -> tuple[int, ...]:
    """The tensor index of each entry of the checkpoints onert writes for this model file.

    Raises :class:`DataError` (one line) when the onert wheel is missing or cannot train
    the model; answers are cached per model bytes, refusals too.
    """
    found = _cached_order(bytes(source))
    if isinstance(found, str):
        raise DataError(found)
    return found


def _probe(source: bytes) -> tuple[int, ...]:
    m = read_model(source)
    sg = m.main
    consts = [t for t in sg.tensors if t.is_constant]
    markers = {t.index: np.full(t.shape, j + 1, ir.as_numpy_dtype(t.dtype))
               for j, t in enumerate(c for c in consts if c.is_float)}
    marked = export_model(m, {(0, i): a for i, a in markers.items()}, file_format="circle")
    expected = {t.index: (markers[t.index] if t.index in markers else t.data).tobytes()
                for t in consts}
    io_specs = {
        role: [[list(sg.tensors[i].shape), str(ir.as_numpy_dtype(sg.tensors[i].dtype))]
               for i in idx]
        for role, idx in (("inputs", sg.inputs), ("outputs", sg.outputs))
    }
    with tempfile.TemporaryDirectory(prefix="cj-onert-") as tmp:
        with open(os.path.join(tmp, "m.circle"), "wb") as f:
            f.write(marked)
        with open(os.path.join(tmp, "io.json"), "w") as f:
            json.dump(io_specs, f)
        try:
            done = subprocess.run(
                [sys.executable, "-m", __name__], cwd=tmp, capture_output=True, text=True,
                timeout=PROBE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise _TooSlow(f"onert took over {PROBE_TIMEOUT_S} s to train one step of this "
                            "model to find its checkpoint order; use order='ascending'") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise DataError(f"onert could not train this model to find its checkpoint order "
                            f"({why}); use order='ascending'")
        with open(os.path.join(tmp, "c.ckpt"), "rb") as f:
            ckpt = decode_checkpoint(f.read())
    order = []
    free = dict(expected)
    for e, raw in enumerate(ckpt.tensors):
        hit = [i for i, b in free.items() if b == raw.tobytes()]
        if not hit:
            raise DataError(f"onert's checkpoint entry {e} matches no constant tensor; "
                            "use order='ascending'")
        order.append(hit[0])
        del free[hit[0]]
    return tuple(order)


def _train_one_frozen_step() -> None:
    """The child's work, in its working directory: train ``m.circle`` one step with no
    trainable operator (so the markers come back as written) and export ``c.ckpt``."""
    from .onert_session import open_session, train_batch

    try:
        s = open_session("m.circle", batch_size=1, learning_rate=0.001, loss=1, reduction=1,
                         optimizer=1, trainable_ops=0)
    except ImportError:
        sys.exit("the onert checkpoint order needs the onert wheel (pip install onert)")
    with open("io.json") as f:
        specs = json.load(f)
    xs, ys = ([np.zeros((1, *shape[1:]), dtype) for shape, dtype in specs[role]]
              for role in ("inputs", "outputs"))
    train_batch(s, xs, ys)
    s.train_export_checkpoint("c.ckpt")


if __name__ == "__main__":
    _train_one_frozen_step()
