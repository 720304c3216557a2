"""A seeded mutator over real model files, and the worker that judges one mutated file.

``mutate(data, seed)`` makes one deterministic mutation of a model file's bytes: byte flips,
4-byte overwrites with extreme values (inside the FlatBuffer's tables and vectors, where
lengths, offsets, shape dimensions and option fields live), truncation, and duplicated or
removed chunks. ``judge(data)`` loads the bytes and runs one forward pass on zero inputs,
and classifies the outcome: ``ok``, ``refused`` (a documented error, one line: a
:class:`~circle_jax.errors.CircleJaxError`), or ``bad: <type>: <message>``
for anything else. ``run_cases`` judges cases in worker processes with an address-space
limit and a time limit, so a case that would exhaust memory or hang is reported, not fatal.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
MEMORY_LIMIT = 4 << 30
EXTREMES = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x01000000, 0x04000001, 0xFFFFFFFE)


def mutate(data: bytes, seed: int) -> bytes:
    """One deterministic mutation of ``data`` chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    buf = bytearray(data)
    n = len(buf)
    kind = int(rng.integers(6))
    # FlatBuffer tables and vectors sit mostly in the file's head and tail; weights between.
    def where() -> int:
        if rng.random() < 0.7:
            span = min(n, 4096)
            return int(rng.integers(n - span, n)) if rng.random() < 0.5 else int(
                rng.integers(0, span))
        return int(rng.integers(0, n))

    if kind == 0:  # flip a few bytes
        for _ in range(int(rng.integers(1, 5))):
            buf[where()] ^= int(rng.integers(1, 256))
    elif kind in (1, 2):  # a 4-byte little-endian overwrite with an extreme or random value
        pos = where() & ~3
        value = (int(rng.choice(EXTREMES)) if kind == 1
                 else int(rng.integers(0, 2**32)))
        buf[pos:pos + 4] = value.to_bytes(4, "little")[: max(0, n - pos)]
    elif kind == 3:  # truncate
        buf = buf[: int(rng.integers(0, n))]
    elif kind == 4:  # duplicate a chunk in place
        a = where()
        size = int(rng.integers(1, 64))
        buf[a:a] = buf[a:a + size]
    else:  # remove a chunk
        a = where()
        del buf[a:a + int(rng.integers(1, 64))]
    return bytes(buf)


def judge(data: bytes) -> str:
    """``ok``, ``refused`` or ``bad: <type>: <first line of the message>``."""
    import circle_jax as cj
    from circle_jax.errors import CircleJaxError

    try:
        model = cj.load(data)
        inputs = [np.zeros([max(d, 1) for d in s.shape], s.dtype) for s in model.inputs]
        outs = model.apply(model.params, *inputs)
        for o in outs:
            np.asarray(o)
    except CircleJaxError as e:  # every documented error (format, unsupported, variables)
        msg = str(e)
        if "\n" in msg or len(msg) > 1200:
            return f"bad: long message: {msg[:120]!r}"
        return "refused"
    except Exception as e:  # noqa: BLE001 - classifying every other outcome is the point
        return f"bad: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return "ok"


def _worker(conn) -> None:  # pragma: no cover - runs in the child
    """Judge the cases sent over ``conn`` one by one, under the memory limit."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    while True:
        case = conn.recv()
        if case is None:
            return
        data = mutate((MODELS / case.model).read_bytes(), case.seed)  # an absolute path stays
        try:
            conn.send(judge(data))
        except MemoryError:
            conn.send("bad: MemoryError")


@dataclass(frozen=True)
class Case:
    """One mutation: ``model`` a file name in :data:`MODELS`, or an absolute path."""

    model: str
    seed: int


def cases(models: Iterable[str], per_model: int, start: int = 0) -> Iterator[Case]:
    for m in models:
        for s in range(start, start + per_model):
            yield Case(m, s)


def run_cases(todo: Iterable[Case], timeout: float = 20.0) -> Iterator[tuple[Case, str]]:
    """Judge each case in a worker process (restarted after a crash or a time-out)."""
    ctx = mp.get_context("spawn")
    proc = conn = None
    try:
        for case in todo:
            if proc is None:
                conn, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child,), daemon=True)
                proc.start()
                child.close()
            conn.send(case)
            result = None
            if conn.poll(timeout + (30 if not getattr(proc, "_warm", False) else 0)):
                try:
                    result = conn.recv()
                    proc._warm = True
                except (EOFError, OSError):
                    pass
            else:
                result = "bad: timeout"
            if result is None or result == "bad: timeout":
                proc.kill()
                proc.join()
                result = result or f"bad: worker died (exit {proc.exitcode})"
                proc = None
            yield case, result
    finally:
        if proc is not None:
            try:
                conn.send(None)
                proc.join(10)
            except OSError:
                pass
            if proc.is_alive():
                proc.kill()
