"""Paired comparison of training-epoch variants, compiled side by side in one process.

    python benchmarks/bench_paired.py [--model example|mnist|PATH] [--batch 1] [--epochs 12]
                                      [--variants default,mlir-emitters,conv-xla]

Each variant is the same ``fit`` epoch (categorical crossentropy, SGD at 0.01, onert's
settings) compiled differently; the compiled epochs then run in alternating order, so that
every variant meets the same machine state (the development VM switches between two speeds
from one second to the next: see README.md). Prints, per variant, the median ms/step and
the median of its per-epoch ratio to the first variant's epoch that ran just before it,
and the wall time of its compile (compiled first to last, so run it twice in the other
order before reading a difference in compile time).

Variants:
- ``default``: what ``fit`` compiles (``train.CPU_COMPILER_OPTIONS``, automatic lowerings);
- ``mlir-emitters``: XLA's default (MLIR) fusion emitters instead of the classic ones;
- ``conv-xla`` / ``conv-im2col``: every convolution forced to that lowering;
- ``llvm-cheap``: the default with ``xla_llvm_disable_expensive_passes`` (XLA skips LLVM's
  costliest optimization passes), ``opt1`` / ``opt0``: the default at LLVM optimization
  level 1 / 0 (``xla_backend_optimization_level``; XLA's default is 2), ``no-slp``: without
  LLVM's SLP vectorizer: options that may cut compile time (and cost step time).

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import circle_jax as cj
import circle_jax.train.trainer as train
from circle_jax.examples import branching_cnn, digits
from circle_jax.lowering import LoweringOptions
from circle_jax.train import Trainer, batched

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "models")
VARIANTS = {  # name -> (compiler options, forced convolution lowering)
    "default": (train.CPU_COMPILER_OPTIONS, None),
    "mlir-emitters": ({}, None),
    "conv-xla": (train.CPU_COMPILER_OPTIONS, "xla"),
    "conv-im2col": (train.CPU_COMPILER_OPTIONS, "im2col"),
    "llvm-cheap": ({**train.CPU_COMPILER_OPTIONS, "xla_llvm_disable_expensive_passes": True},
                   None),
    "opt1": ({**train.CPU_COMPILER_OPTIONS, "xla_backend_optimization_level": 1}, None),
    "opt0": ({**train.CPU_COMPILER_OPTIONS, "xla_backend_optimization_level": 0}, None),
    "no-slp": ({**train.CPU_COMPILER_OPTIONS, "xla_cpu_disable_slp_vectorizer": True}, None),
}


def data(name: str) -> tuple[cj.Model, np.ndarray, np.ndarray]:
    if name == "example":
        x, y = digits()
        return cj.load(branching_cnn().to_bytes()), x[:1792], y[:1792]
    path = os.path.join(SHARED, "onert_micro_simple_mnist_model.circle") if name == "mnist" \
        else name
    model, rng = cj.load(path), np.random.default_rng(0)
    x = rng.uniform(0, 1, (1024, *model.inputs[0].shape[1:])).astype(np.float32)
    classes = model.outputs[0].shape[-1]
    return model, x, np.eye(classes, dtype=np.float32)[rng.integers(0, classes, 1024)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="example")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--variants", default="default,mlir-emitters,conv-xla")
    ap.add_argument("--samples", type=int, default=0, help="train on the first N (0: all)")
    args = ap.parse_args()
    model, x, y = data(args.model)
    if args.samples:
        x, y = x[:args.samples], y[:args.samples]
    steps = len(y) // args.batch
    xs, ys = batched((jnp.asarray(x),), jnp.asarray(y), args.batch, steps)
    runs = []
    for name in args.variants.split(","):
        options, lowering = VARIANTS[name]
        train.CPU_COMPILER_OPTIONS = options
        variant = cj.Model(model.ir, LoweringOptions(force=lowering) if lowering else None)
        trainer = Trainer(variant, loss=2, optimizer=1, learning_rate=0.01,
                          batch_size=args.batch)
        state, frozen = trainer.init()
        t = time.perf_counter()
        epoch = trainer._compiled_epoch(state, frozen, xs, ys)
        compile_ms = (time.perf_counter() - t) * 1000
        state, m = epoch(state, frozen, xs, ys)  # first execution, not timed
        jax.block_until_ready(m)
        runs.append({"name": name, "epoch": epoch, "state": state, "frozen": frozen, "ms": [],
                     "compile_ms": compile_ms})
    for _ in range(args.epochs):
        for r in runs:
            t = time.perf_counter()
            r["state"], m = r["epoch"](r["state"], r["frozen"], xs, ys)
            jax.block_until_ready(m)
            r["ms"].append((time.perf_counter() - t) * 1000 / steps)
    base = runs[0]["ms"]
    print(f"{args.model}, batch {args.batch}, {steps} steps/epoch, {args.epochs} epochs each")
    for r in runs:
        ratio = statistics.median(a / b for a, b in zip(r["ms"], base))
        print(f"  {r['name']:14s} {statistics.median(r['ms']):.4f} ms/step   "
              f"x{ratio:.3f} of {runs[0]['name']}   compiled in {r['compile_ms']:.0f} ms")


if __name__ == "__main__":
    main()
