"""Where a compiled training epoch spends its time, by the JAX operation that made each kernel.

    python benchmarks/profile_epoch.py MODEL [--batch 32] [--samples 64] [--epochs 5]
                                             [--repeats 5] [--top 25] [--kernels]

Trains MODEL (a .circle/.tflite; random inputs, one-hot labels; CCE, SGD) with ``fit`` on
inline CPU dispatch, times ``--repeats`` warm fused ``fit`` calls (ms/step: median and
each), then runs one more under JAX's profiler and maps every XLA kernel event of the trace
to the ``op_name`` of its HLO instruction in the compiled epoch: time per step, kernels per
step and one example kernel per JAX operation (``--kernels``: per kernel). Kernels run on
two threads at once, so the sum may exceed the wall time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import statistics
import tempfile

import numpy as np

INSTRUCTION = re.compile(r"^\s*%?([\w.\-]+) = (\S+) .*?op_name=\"([^\"]+)\"", re.M)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--kernels", action="store_true",
                    help="list the slowest kernels one by one instead of by JAX operation")
    args = ap.parse_args()

    import circle_jax as cj

    cj.inline_cpu_dispatch()
    import jax

    from circle_jax.train import fit

    model = cj.load(args.model)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (args.samples, *model.inputs[0].shape[1:])).astype(np.float32)
    classes = model.outputs[0].shape[-1]
    y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, args.samples)]

    def run(trainer):
        return fit(model, x, y, trainer=trainer, epochs=args.epochs)

    trainer = fit(model, x, y, epochs=args.epochs, batch_size=args.batch, learning_rate=0.01,
                  loss=2, optimizer=1).trainer
    ms = [statistics.fmean(run(trainer).history.ms_per_step) for _ in range(args.repeats)]
    print(f"ms/step: median {statistics.median(ms):.3f} of {[round(m, 3) for m in ms]}")

    ops: dict[str, str] = {}
    shapes: dict[str, str] = {}
    for compiled in trainer._compiled.values():
        for name, shape, op in INSTRUCTION.findall(compiled.as_text()):
            ops[name], shapes[name] = re.sub(r"^jit\([^)]*\)/(while/body/closed_call/)*", "",
                                             op), shape
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            steps = sum(run(trainer).history.steps)
        (path,) = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
        events = json.load(gzip.open(path))["traceEvents"]
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    example: dict[str, str] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name in ops and not name.startswith("while"):
            key = name if args.kernels else ops[name]
            total[key] += e["dur"]
            count[key] += 1
            example[key] = name
    print(f"kernels: {sum(total.values()) / 1e3 / steps:.2f} ms/step over {steps} steps")
    print("ms/step  kernels/step  JAX operation  (example kernel, its shape)")
    for key, us in total.most_common(args.top):
        k = example[key]
        print(f"{us / 1e3 / steps:7.2f} {count[key] / steps:8.1f}  {ops[k][:80]}  ({k}, "
              f"{shapes[k][:40]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
