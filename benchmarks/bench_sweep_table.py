"""Print issue 23's per-model table: every model the sweep tests know (`tests.model_zoo`:
../shared/models, the Keras conversions, the bundled example, the toy models).

Columns (each measured as `tests/test_sweep.py` checks it):

- path: how `Model.apply` runs a batch of 3 ("direct": one batched graph; "mapped": the
  batch-1 graph over the samples) or the one-line refusal;
- batch 3 vs singles: the largest |difference| between a batch of 3 and 3 single-sample
  runs (seeded random inputs of `model_zoo.inputs`), over the scale max(|output|, 1);
- last sample vs LiteRT: the same for the third sample against LiteRT on that sample
  ("-" where LiteRT cannot run the file or the declared batch is not 1);
- batch 8, float32: the mean loss of one epoch of 32 samples at batch 8 (4 steps; MSE
  against uniform targets, Adam, lr 1e-4), or its one-line refusal;
- float16: the same with ``p=f32,c=f16,o=f32`` and the default dynamic loss scale
  (skip), its relative difference from float32 and its skipped steps.

Run: ``nice python benchmarks/bench_sweep_table.py [--part 0/2] [--names ...]`` (tens of
minutes on the 2-core machine under load; ``--part i/k`` runs every k-th model from the
i-th, ``--names`` only those; needs the test extras)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import circle_jax as cj  # noqa: E402
from circle_jax.formats.reader import read_model  # noqa: E402
from circle_jax.formats.writer import export_model  # noqa: E402
from tests import model_zoo  # noqa: E402
from tests.conformance import run_litert  # noqa: E402
from tests.test_sweep import EAGER  # noqa: E402

TRAIN = dict(epochs=1, batch_size=8, loss="mse", optimizer="adam", learning_rate=1e-4)


def _one_line(e: BaseException) -> str:
    return f"refused: {str(e).splitlines()[0][:200]}"


def _deviation(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), 1.0)
               for g, w in zip(got, want))


def _litert(model: cj.Model, name: str) -> Callable[[list[np.ndarray]], list] | None:
    """LiteRT on one sample of the declared batch (CIR0 rewritten as TFL3), or None."""
    if name in model_zoo.LITERT_CANNOT_RUN or any(s.shape[:1] != (1,) for s in model.inputs):
        return None
    ir = read_model(model_zoo.file_bytes(name))
    tflite = export_model(ir, file_format="tflite") if ir.format == "circle" else ir.source
    return lambda feeds: run_litert(tflite, feeds)


def batch_of_3(model: cj.Model, name: str) -> tuple[str, str, str]:
    """(path, batch 3 vs singles, last sample vs LiteRT)."""
    if any(not s.shape for s in model.inputs):
        return "no batch axis", "-", "-"
    xs = model_zoo.inputs(model, name, 3)
    apply = model.apply if name in EAGER else jax.jit(model.apply)
    try:
        path = model._lowered.batching(xs)
        batch = [np.asarray(o, np.float64) for o in apply(model.params, *xs)]
        singles = [[np.asarray(o, np.float64) for o in apply(model.params,
                                                             *[x[i:i + 1] for x in xs])]
                   for i in range(3)]
    except cj.CircleJaxError as e:
        return _one_line(e), "-", "-"
    floats = [k for k, o in enumerate(batch) if o.dtype.kind == "f"]
    dev = _deviation([batch[k] for k in floats],
                     [np.concatenate([s[k] for s in singles]) for k in floats])
    litert = _litert(model, name)
    vs = "-"
    if litert is not None:
        want = [np.asarray(w, np.float64) for w in litert([x[-1:] for x in xs])]
        vs = f"{_deviation([singles[-1][k] for k in floats], [want[k] for k in floats]):.1e}"
    return path, f"{dev:.1e}", vs


def train(model: cj.Model, name: str, n: int, **kw: Any) -> Any:
    rng = np.random.default_rng(7)
    xs = model_zoo.inputs(model, name, n)
    y = rng.uniform(0, 1, (n, *model.outputs[0].shape[1:])).astype(np.float32)
    return cj.fit(model, xs if len(xs) > 1 else xs[0], y, **TRAIN, **kw).history


def trained(model: cj.Model, name: str, n: int, **kw: Any) -> Any:
    """`train`'s history, or its one-line refusal."""
    try:
        return train(model, name, n, **kw)
    except cj.CircleJaxError as e:
        return _one_line(e)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="0/1", help="I/K: every K-th model from the I-th")
    ap.add_argument("--names", nargs="+", help="these models (`tests.model_zoo` names)")
    args = ap.parse_args()
    i, k = map(int, args.part.split("/"))
    cj.inline_cpu_dispatch()
    warnings.simplefilter("ignore", cj.LossScaleWarning)
    print("| model | path at batch 3 | batch 3 vs singles | last sample vs LiteRT "
          "| batch 8, float32 | float16 | float16 / float32 - 1 | float16 skipped |")
    print("|---|---|---|---|---|---|---|---|")
    for name in (args.names or model_zoo.all_models())[i::k]:
        model = model_zoo.load(name)
        if isinstance(model, cj.CircleJaxError):
            print(f"| {name} | {_one_line(model)} | | | | | | |", flush=True)
            continue
        path, dev, vs = batch_of_3(model, name)
        f32 = trained(model, name, 32)
        if isinstance(f32, str):
            row = f"{f32} | | |"
        else:
            f16 = trained(model, name, 32, precision="p=f32,c=f16,o=f32",
                          loss_scale="dynamic")
            a = f32.loss[0]
            row = (f"{a:.4g} | {f16} | | |" if isinstance(f16, str) else
                   f"{a:.4g} | {f16.loss[0]:.4g} | {f16.loss[0] / a - 1:+.1e} | "
                   f"{f16.skipped[0]} / {f16.steps[0]}")
        print(f"| {name} | {path} | {dev} | {vs} | {row} |", flush=True)


if __name__ == "__main__":
    main()
