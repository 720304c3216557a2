"""Data-parallel step time and throughput against the number of devices.

    python benchmarks/bench_scale.py [--model example|mnist|PATH] [--devices 1,2,4]
                                     [--batch 64] [--epochs 9] [--processes 2]

For each device count N the same ``fit`` epoch (categorical crossentropy, SGD at 0.01) is
compiled for a 1-D data mesh of N devices (N = 1: the plain single-device program) at two
batch sizes: the global batch ``--batch`` split N ways (strong scaling) and ``--batch / 4``
per device (weak scaling, ``batch/4 * N`` in all). The compiled epochs then run in
alternating order, so that every variant meets the same machine state; the script prints
the median ms/step and samples/s of each. On CPU the devices are XLA's forced host devices
(``--xla_force_host_platform_device_count``, set here before JAX starts): they share the
machine's cores, so the figures measure what partitioning costs, not what more hardware
gains. ``--processes P`` also times P processes on 127.0.0.1 (one device each, gloo
collectives) at the global batch.

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="example")
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--processes", type=int, default=0)
    ap.add_argument("--worker", nargs=3, metavar=("ADDRESS", "N", "ID"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _data(name: str) -> tuple[Any, Any, Any]:
    """The model and data of ``bench_paired.py`` (imported once XLA_FLAGS is set)."""
    from bench_paired import data

    return data(name)


class Variant:
    """One compiled epoch: ``n`` devices at global batch ``batch``."""

    def __init__(self, model: Any, x: Any, y: Any, n: int | None, batch: int) -> None:
        import jax.numpy as jnp

        from circle_jax.distributed import DataParallel
        from circle_jax.train import Trainer, batched

        self.n, self.batch = n or 1, batch
        self.trainer = t = Trainer(model, batch_size=batch, loss="categorical_crossentropy",
                                   optimizer="sgd", learning_rate=0.01,
                                   placement=DataParallel.of(devices=n))
        self.steps = len(y) // batch
        state, frozen = t.placed(t.init())
        self.state, self.frozen = state, frozen
        self.data = t.placed(batched((jnp.asarray(x),), jnp.asarray(y), batch, self.steps),
                             batch_axis=1)
        self.run = t._compiled_epoch(state, frozen, *self.data)
        self.ms: list[float] = []

    def epoch(self) -> None:
        import jax

        t = time.perf_counter()
        self.state, m = self.run(self.state, self.frozen, *self.data)
        jax.block_until_ready(m.loss)
        self.ms.append((time.perf_counter() - t) * 1000 / self.steps)

    def row(self) -> str:
        ms = statistics.median(self.ms)
        return (f"{self.n:7d} {self.batch:6d} {self.batch // self.n:10d} {ms:9.3f} "
                f"{self.batch / ms * 1000:10.0f}")


def _worker(a: argparse.Namespace) -> None:
    from circle_jax.distributed import initialize, is_main_process

    initialize(a.worker[0], int(a.worker[1]), int(a.worker[2]))
    model, x, y = _data(a.model)
    v = Variant(model, x, y, int(a.worker[1]), a.batch)
    v.epoch()  # not timed
    v.ms.clear()
    for _ in range(a.epochs):
        v.epoch()
    if is_main_process():
        print(f"{v.row()}   ({a.worker[1]} processes, gloo)")


def _processes(a: argparse.Namespace) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    env = dict(os.environ, XLA_FLAGS="", PYTHONPATH=ROOT)
    cmd = [sys.executable, __file__, "--model", a.model, "--batch", str(a.batch),
           "--epochs", str(a.epochs), "--worker", address, str(a.processes)]
    procs = [subprocess.Popen([*cmd, str(k)], env=env) for k in range(a.processes)]
    for p in procs:
        p.wait(timeout=600)


def main() -> None:
    a = _args()
    if a.worker:
        return _worker(a)
    counts = [int(n) for n in a.devices.split(",")]
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={max(counts)}")
    import jax

    model, x, y = _data(a.model)
    variants = []
    for n in counts:
        for batch in dict.fromkeys((a.batch, a.batch // 4 * n)):  # strong, weak (distinct)
            variants.append(Variant(model, x, y, n if n > 1 else None, batch))
    for v in variants:  # a first epoch each, not timed
        v.epoch()
        v.ms.clear()
    for _ in range(a.epochs):  # alternating: every variant meets the same machine state
        for v in variants:
            v.epoch()
    print(f"{a.model}, {jax.default_backend()}, {os.cpu_count()} cores, median of "
          f"{a.epochs} epochs")
    print("devices  batch  per-device   ms/step  samples/s")
    for v in variants:
        print(v.row())
    if a.processes:
        _processes(a)


if __name__ == "__main__":
    main()
