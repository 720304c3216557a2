"""The CPU kernels (`circle_jax.lowering.cpu_kernels`) on and off, in alternating fresh
processes: a training step through ``fit`` and the first compile of its epoch.

    python benchmarks/bench_cpu_kernels.py [--models mobilenet_v1_0.25_128_float.tflite]
                                           [--batch 32] [--epochs 8] [--rounds 4]
                                           [--against DIR]

Each process loads the model (one of ../shared/models), trains random data of 8 batches an
epoch with ``fit`` (SGD at 1e-3, categorical crossentropy on one-hot targets, an
``on_epoch`` callback, so each epoch is its own compiled call), its process set up as the
command line sets it up (`inline_cpu_dispatch`, `retain_host_memory`; no persistent compile
cache) and ``CIRCLE_JAX_CPU_KERNELS`` set to 1 or 0; the order of the two alternates every
round. Prints per model and setting the median over the processes of their steady ms/step
(the median of epochs 2 on), its range, the median per-round ratio on / off, and the
first epoch's compile (``History.compile_ms``) and PREPARE (``History.prepare_ms``).
``--against DIR``: this source tree against another checkout's (``PYTHONPATH=DIR``), the
kernels on in both, instead of on against off.

Not a test: numbers depend on the machine and its load (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "shared", "models")

CHILD = """
import json, os, sys
import jax
jax.config.update("jax_enable_compilation_cache", False)
import numpy as np
import circle_jax as cj
cj.inline_cpu_dispatch()
cj.retain_host_memory()
path, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = cj.load(path)
spec, out = model.inputs[0], model.outputs[0]
rng = np.random.default_rng(0)
n = 8 * batch
x = rng.standard_normal((n, *spec.shape[1:])).astype(spec.dtype)
y = np.eye(out.shape[-1], dtype=np.float32)[rng.integers(0, out.shape[-1], n)]
y = y.reshape(n, *out.shape[1:])
h = cj.fit(model, x, y, epochs=epochs, batch_size=batch, loss="cce", optimizer="sgd",
           learning_rate=1e-3, on_epoch=lambda *a: None).history
from circle_jax.lowering import cpu_kernels
print(json.dumps(dict(steady=float(np.median(h.ms_per_step[1:])), compile=h.compile_ms,
                      prepare=h.prepare_ms, kernels=cpu_kernels.status(),
                      loss=h.loss[-1])))
"""


def run(path: str, batch: int, epochs: int, on: bool, against: str | None) -> dict:
    """One process's figures: ``on`` is this tree with the kernels on; not ``on``, the
    kernels off, or ``against``'s tree with them on."""
    env = {**os.environ, "CIRCLE_JAX_CPU_KERNELS": "1" if on or against else "0",
           "CIRCLE_JAX_CACHE": "off",
           "PYTHONPATH": os.path.join(HERE, "..") if on or not against else against}
    p = subprocess.run([sys.executable, "-c", CHILD, path, str(batch), str(epochs)],
                       capture_output=True, text=True, env=env, cwd=HERE, timeout=1800)
    if p.returncode:
        raise SystemExit(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v1_0.25_128_float.tflite")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--against", help="another checkout's tree, instead of the kernels off")
    args = ap.parse_args()
    other = "against" if args.against else "off"
    print(f"| model | batch | kernels | ms/step median (range) | ratio on/{other} (range) | "
          "compile ms median | PREPARE ms median |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        path = os.path.join(SHARED, name)
        results: dict[bool, list[dict]] = {True: [], False: []}
        for r in range(args.rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                results[on].append(run(path, args.batch, args.epochs, on, args.against))
        assert all(d["kernels"].startswith("on") for d in results[True]), results[True]
        ratios = [a["steady"] / b["steady"] for a, b in zip(results[True], results[False])]
        for on in (True, False):
            rows = results[on]
            steady = [d["steady"] for d in rows]
            ratio = (f"{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if on
                     else "")
            print(f"| {name} | {args.batch} | {'on' if on else other} | "
                  f"{np.median(steady):.1f} ({min(steady):.1f}-{max(steady):.1f}) | {ratio} | "
                  f"{np.median([d['compile'] for d in rows]):.0f} | "
                  f"{np.median([d['prepare'] for d in rows]):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
