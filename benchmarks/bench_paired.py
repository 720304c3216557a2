"""Paired comparison of training-epoch variants, compiled side by side in one process.

    python benchmarks/bench_paired.py [--model example|mnist|mlp|PATH] [--batch 1] [--epochs 12]
                                      [--variants default,classic,mlir-emitters,conv-xla]

Each variant is the same ``fit`` epoch (categorical crossentropy, SGD or Adam at 0.01,
onert's settings; `Trainer.epochs_runner`'s program, one epoch a call and its summary read
on the host, as ``fit`` with an ``on_epoch`` callback runs it) compiled differently; the
compiled epochs then run in alternating order,
so that every variant meets the same machine state (the development VM switches between
two speeds from one second to the next: see README.md). Prints, per variant, the median ms/step and
the median of its per-epoch ratio to the first variant's epoch that ran just before it,
and the wall time of its compile (compiled first to last, so run it twice in the other
order before reading a difference in compile time).

Variants:
- ``default``: what ``fit`` compiles (``Trainer.compiler_options``, by the model's operators:
  ``train.cpu_compiler_options``; automatic lowerings);
- ``classic``: XLA's classic fusion emitters (``train.CLASSIC_EMITTERS``);
- ``mlir-emitters``: XLA's default (MLIR) fusion emitters;
- ``conv-xla`` / ``conv-im2col``: every convolution forced to that lowering;
- ``llvm-cheap``: classic with ``xla_llvm_disable_expensive_passes`` (XLA skips LLVM's
  costliest optimization passes), ``opt1`` / ``opt0``: classic at LLVM optimization level
  1 / 0 (``xla_backend_optimization_level``; XLA's default is 3), ``opt2``: the
  trainer's own options at level 2, ``no-slp``: classic
  without LLVM's SLP vectorizer: options that may cut compile time (and cost step time);
- ``ynn-eltwise``: classic, with elementwise fusions handed to YNNPACK too;
  ``ynn-conv-xla``: every convolution XLA's, handed to YNNPACK where it takes them;
- ``by-name``: the trainable weights carried by name between steps and calls, not as one
  `circle_jax.optim.flat.Packed` vector (`Trainer.packed` off).

Also prints each variant's number of fused kernels (XLA compiles each of its own with LLVM,
about 10 ms of CPU time apiece on this VM; library calls cost next to nothing to compile).

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax.numpy as jnp
import numpy as np

import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.lowering import LoweringOptions
from circle_jax.train import CLASSIC_EMITTERS, Trainer
from circle_jax.train.programs import LLVM_O2

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "models")
VARIANTS = {  # name -> (compiler options (None: the trainer's own), forced convolution lowering)
    "default": (None, None),
    "by-name": (None, None),
    "classic": (CLASSIC_EMITTERS, None),
    "mlir-emitters": ({}, None),
    "conv-xla": (None, "xla"),
    "conv-im2col": (None, "im2col"),
    "llvm-cheap": ({**CLASSIC_EMITTERS, "xla_llvm_disable_expensive_passes": True}, None),
    "opt1": ({**CLASSIC_EMITTERS, "xla_backend_optimization_level": 1}, None),
    "opt0": ({**CLASSIC_EMITTERS, "xla_backend_optimization_level": 0}, None),
    "opt2": (None, None),
    "no-slp": ({**CLASSIC_EMITTERS, "xla_cpu_disable_slp_vectorizer": True}, None),
    # YNNPACK library fusions (XLA's default: LIBRARY_FUSION_TYPE_DOT and _REDUCE) widened
    "ynn-eltwise": ({**CLASSIC_EMITTERS, "xla_cpu_experimental_ynn_fusion_type": ",".join(
        f"LIBRARY_FUSION_TYPE_{t}" for t in ("DOT", "ELTWISE", "REDUCE"))}, None),
    "ynn-conv-xla": ({**CLASSIC_EMITTERS, "xla_cpu_experimental_ynn_fusion_type": ",".join(
        f"LIBRARY_FUSION_TYPE_{t}" for t in ("DOT", "REDUCE", "INDIVIDUAL_CONVOLUTION"))}, "xla"),
}


def data(name: str) -> tuple[cj.Model, np.ndarray, np.ndarray]:
    if name in ("example", "mlp"):
        from bench_vs_onert import _mlp  # the small-model table's MLP 64-64-10

        x, y = digits()
        if name == "mlp":
            return cj.load(_mlp().to_bytes()), x[:1792].reshape(1792, 64), y[:1792]
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
    ap.add_argument("--variants", default="default,classic,mlir-emitters")
    ap.add_argument("--optimizer", type=int, default=1, help="onert's code: 1 SGD, 2 Adam")
    ap.add_argument("--samples", type=int, default=0, help="train on the first N (0: all)")
    args = ap.parse_args()
    model, x, y = data(args.model)
    if args.samples:
        x, y = x[:args.samples], y[:args.samples]
    steps = len(y) // args.batch
    x, y = jnp.asarray(x), jnp.asarray(y)
    runs = []
    for name in args.variants.split(","):
        options, lowering = VARIANTS[name]
        variant = cj.Model(model.ir, LoweringOptions(force=lowering) if lowering else None)
        trainer = Trainer(variant, loss=2, optimizer=args.optimizer, learning_rate=0.01,
                          batch_size=args.batch)
        if options is not None:
            trainer.compiler_options = options
        if name == "by-name":
            trainer.packed = lambda s: s
        if name == "opt2":
            trainer.compiler_options = {**trainer.compiler_options, **LLVM_O2}
        state, frozen = trainer.init()
        t = time.perf_counter()
        run = trainer.epochs_runner(state, frozen, (x,), y, 1)
        compile_ms = (time.perf_counter() - t) * 1000
        hlo = list(trainer._compiled.values())[-1].as_text()  # the epochs program
        print(f"  {name}: {hlo.count(' fusion(')} fused kernels "
              f"({hlo.count('kind=kCustom')} of them library calls)", flush=True)
        state, _ = run(state, 0, 1)  # first execution, not timed
        runs.append({"name": name, "run": run, "state": state, "ms": [],
                     "compile_ms": compile_ms})
    for epoch in range(args.epochs):
        for r in runs:
            t = time.perf_counter()
            r["state"], _ = r["run"](r["state"], epoch + 1, 1)
            r["ms"].append((time.perf_counter() - t) * 1000 / steps)
    base = runs[0]["ms"]
    print(f"{args.model}, batch {args.batch}, {steps} steps/epoch, {args.epochs} epochs each")
    for r in runs:
        ratio = statistics.median(a / b for a, b in zip(r["ms"], base))
        print(f"  {r['name']:14s} {statistics.median(r['ms']):.4f} ms/step   "
              f"x{ratio:.3f} of {runs[0]['name']}   compiled in {r['compile_ms']:.0f} ms")


if __name__ == "__main__":
    main()
