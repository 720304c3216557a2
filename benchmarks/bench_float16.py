"""float16 and bfloat16 training against float32 on real models (issue 23): per-epoch losses,
skipped steps, loss scale, PREPARE and ms/step.

Random data (uniform [0, 1) inputs, one-hot random labels, seed 0), Adam (lr 1e-3), CCE,
``--epochs`` epochs of ``--samples`` samples; each model at its batch size. Rows: float32;
``p=f32,c=f16,o=f32`` with the policy's float32 operators and a dynamic loss scale, skipping
(Keras, PyTorch) or retrying (nntrainer) an overflowed step; the same with every operator in
float16 (``float32_ops=()``, the behaviour before issue 23); ``mixed_bfloat16``. Prints one
markdown table (benchmarks/README.md keeps the numbers)::

    python benchmarks/bench_float16.py
    python benchmarks/bench_float16.py --models mlperftiny_resnet8_cifar10_float.tflite:16
"""

from __future__ import annotations

import argparse
import os
import warnings

import numpy as np

import circle_jax as cj
from circle_jax.optim import Policy
from circle_jax.train import fit

MODELS = ("mlperftiny_resnet8_cifar10_float.tflite:16", "mobilenet_v1_0.25_128_float.tflite:8")
ROWS = {
    "float32": dict(precision=None, loss_scale="none"),
    "f16 skip": dict(precision="p=f32,c=f16,o=f32", loss_scale="dynamic"),
    "f16 retry": dict(precision="p=f32,c=f16,o=f32", loss_scale="dynamic",
                      on_overflow="retry"),
    "f16 all-half skip": dict(precision=Policy(compute_dtype="f16", float32_ops=()),
                              loss_scale="dynamic"),
    "mixed_bfloat16": dict(precision="mixed_bfloat16", loss_scale="none"),
}


def data(model: cj.Model, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((n, *model.inputs[0].shape[1:]), np.float32)
    k = model.outputs[0].shape[-1]
    return x, np.eye(k, dtype=np.float32)[rng.integers(0, k, n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="FILE:BATCH")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                  "shared", "models"))
    args = ap.parse_args()
    cj.inline_cpu_dispatch()
    print("| model | run | loss per epoch | vs float32 | skipped / steps | final scale "
          "| PREPARE s | ms/step | warning |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.models:
        name, _, batch = spec.partition(":")
        model = cj.load(os.path.join(args.dir, name))
        x, y = data(model, args.samples)
        base = None
        for row in args.rows:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cj.LossScaleWarning)
                h = fit(model, x, y, epochs=args.epochs, batch_size=int(batch), loss="cce",
                        optimizer="adam", learning_rate=1e-3, **ROWS[row]).history
            base = h.loss if row == "float32" else base
            rel = "" if base is None or row == "float32" else ", ".join(
                f"{(a / b - 1) * 100:+.1f}%" for a, b in zip(h.loss, base))
            print(f"| {name.split('.tflite')[0]} | {row} | "
                  f"{', '.join(f'{v:.3f}' for v in h.loss)} | {rel} | "
                  f"{sum(h.skipped)} / {sum(h.steps)} | {h.loss_scale[-1]:g} | "
                  f"{h.prepare_ms / 1000:.1f} | {np.mean(h.ms_per_step):.0f} | "
                  f"{h.overflow or ''} |", flush=True)


if __name__ == "__main__":
    main()
