"""Print the per-model table of benchmarks/README.md: load time and agreement with LiteRT.

Run: python benchmarks/models_table.py   (needs the test extras: ai-edge-litert)
Load time is the median of 5 ``circle_jax.load`` calls (read + validate + lower setup).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import circle_jax as cj  # noqa: E402
from tests.conformance import run_litert  # noqa: E402
from tests.model_zoo import LITERT_CANNOT_RUN, inputs  # noqa: E402
from tests.paths import SHARED_MODELS  # noqa: E402


def main() -> None:
    print("| model | size | operators | load ms | max abs diff vs LiteRT | max |output| |")
    print("|---|---|---|---|---|---|")
    for name in sorted(os.listdir(SHARED_MODELS)):
        if not name.endswith((".tflite", ".circle")):
            continue
        path = os.path.join(SHARED_MODELS, name)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            model = cj.load(path)
            times.append((time.perf_counter() - t) * 1000)
        n_ops = sum(len(sg.operators) for sg in model.ir.subgraphs)
        size = f"{os.path.getsize(path) / 1024:.0f} KB"
        if name in LITERT_CANNOT_RUN:
            diff, scale = "numpy loop (LiteRT lacks BatchMatMulV2)", ""
        else:
            feeds = inputs(model, name, None)  # the declared shapes
            data = model.export(file_format="tflite")
            want = run_litert(data, feeds)
            got = jax.jit(model.apply)(model.params, *feeds)
            diff = f"{max(float(np.max(np.abs(np.asarray(g) - w))) for g, w in zip(got, want)):.1e}"
            scale = f"{max(float(np.max(np.abs(w))) for w in want):.3g}"
        print(f"| {name} | {size} | {n_ops} | {statistics.median(times):.1f} | {diff} | {scale} |")


if __name__ == "__main__":
    main()
