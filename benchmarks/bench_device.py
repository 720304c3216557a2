"""Training step time on whatever backend JAX runs on (CPU, GPU, TPU), by model, batch size
and precision policy.

    python benchmarks/bench_device.py [--models example,resnet8,mobilenet,vww]
                                      [--batches 32,128] [--precisions f32,f16,bf16]
                                      [--epochs 5] [--repeats 3] [--json FILE]

For each (model, batch, precision) the model is loaded once and trained with ``fit`` on
random float32 inputs and random one-hot targets (categorical crossentropy, Adam at 1e-3, every
operator trainable, sequential batches): a first ``fit`` of ``--epochs`` epochs pays
compilation (``compile s`` is its whole wall time), then ``--repeats`` further ``fit`` calls
of as many epochs run on the first one's ``Trainer`` (its compiled epochs): ms/step is the
median of their ``History.ms_per_step`` (all epochs in one compiled call, timed up to the
summary on the host). The loss column is the last repeat's final epoch loss; ``skipped``
counts the steps the dynamic loss scale skipped over the timed repeats (float16 only).

Precisions: ``f32`` (no policy), ``f16`` (``p=f32,c=f16,o=f32`` with a dynamic loss scale),
``bf16`` (``mixed_bfloat16``). The backend is JAX's default (``JAX_PLATFORMS`` picks it).

Not a test: numbers depend on the machine and its load. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import numpy as np

import circle_jax as cj
from circle_jax.examples import branching_cnn
from circle_jax.train import fit

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "models"))
MODELS = {
    "example": "example",
    "resnet8": "mlperftiny_resnet8_cifar10_float.tflite",
    "mobilenet": "mobilenet_v1_0.25_128_float.tflite",
    "vww": "mlperftiny_vww_96_mobilenet_float.tflite",
}
PRECISIONS = {
    "f32": {},
    "f16": {"precision": "p=f32,c=f16,o=f32", "loss_scale": "dynamic"},
    "bf16": {"precision": "mixed_bfloat16"},
}


def _load(name: str, shared: str) -> cj.Model:
    if MODELS[name] == "example":
        return cj.load(branching_cnn().to_bytes())
    return cj.load(os.path.join(shared, MODELS[name]))


def _data(model: cj.Model, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = tuple(model.inputs[0].shape[1:])
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    classes = int(np.prod(model.outputs[0].shape[1:]))
    y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]
    return x, y.reshape((n, *model.outputs[0].shape[1:]))


def measure(name: str, batch: int, precision: str, epochs: int, repeats: int,
            shared: str) -> dict:
    model = _load(name, shared)
    steps = 4
    x, y = _data(model, batch * steps)
    settings = dict(batch_size=batch, loss="cce", optimizer="adam", learning_rate=1e-3,
                    trainable="all", **PRECISIONS[precision])
    t0 = time.perf_counter()
    first = fit(model, x, y, epochs=epochs, **settings)  # the timed calls' program
    compile_s = time.perf_counter() - t0
    times, skipped, last = [], 0, first
    for _ in range(repeats):
        last = fit(model, x, y, trainer=first.trainer, state=last.state, epochs=epochs)
        times.append(statistics.median(last.history.ms_per_step))
        skipped += sum(last.history.skipped or [0])
    return {"model": name, "batch": batch, "precision": precision,
            "ms_per_step": statistics.median(times), "ms_range": (min(times), max(times)),
            "compile_s": compile_s, "loss": last.history.loss[-1], "skipped": skipped,
            "steps": repeats * epochs * steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="example,resnet8,mobilenet,vww")
    p.add_argument("--batches", default="32,128")
    p.add_argument("--precisions", default="f32,f16,bf16")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shared", default=SHARED, help="folder of the shared models")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args()
    dev = jax.devices()[0]
    print(f"backend {jax.default_backend()}, device {dev.device_kind}, JAX {jax.__version__}")
    print("| model | batch | precision | ms/step (range) | compile s | final loss | skipped |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name in a.models.split(","):
        for batch in (int(b) for b in a.batches.split(",")):
            for prec in a.precisions.split(","):
                try:
                    r = measure(name, batch, prec, a.epochs, a.repeats, a.shared)
                except Exception as e:  # a failing row is reported, the rest still run
                    print(f"| {name} | {batch} | {prec} | failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]} | | | |", flush=True)
                    continue
                rows.append(r)
                lo, hi = r["ms_range"]
                print(f"| {name} | {batch} | {prec} | {r['ms_per_step']:.3f} "
                      f"({lo:.3f}-{hi:.3f}) | {r['compile_s']:.1f} | {r['loss']:.4f} | "
                      f"{r['skipped']}/{r['steps']} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev.device_kind, "jax": jax.__version__, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
