"""Quantization-aware training against float training of the same converter-made models.

For each fully quantized model of tests/data/quantized/ (TF's converter: int8 with int8 or
float I/O, 16x8), on the bundled 8x8 digits (the first 1,437 samples train, the last 360
test):

- ``file``: the integer file as converted, run by LiteRT on the test set;
- ``qat``: ``load(qat=True)`` trained with ``fit``, exported, and the exported integer
  model run by LiteRT (what a device runs);
- ``qat`` with moving ranges: the same with ``qat_ranges="ema"`` (TF's moving min/max,
  decay 0.999; the export carries the moved activation scales and zero points);
- ``float``: ``load(qat=False)`` (the dequantized float model) trained the same way, run
  by circle-jax in float32.

Loss is the categorical cross-entropy of the softmax output (probabilities clipped to
[1e-7, 1]), accuracy the argmax's. Run: ``python benchmarks/bench_qat.py [--epochs 10]``.

``--tfmot``: instead, circle-jax's QAT against TF's (tfmot's, recorded by
``scripts/qat_tfmot_reference.py`` in ``qat_reference.json``, same data split, order, batch,
optimizers and 10 epochs): per-epoch training losses and test accuracy (the simulation's
argmax on digits 1536-1796) of :data:`TFMOT_RUNS` on tfmot's start file
(``qat_cnn_tfmot.tflite``) and on the converter's PTQ file of the same model
(``qat_cnn_ptq.tflite``), beside tfmot's QAT and Keras's float training.

``--step_time``: instead, the time of a training step (batch 32, Adam) of each QAT forward
(``qat_forward="integer"`` and ``"fake_quant"``) and of float training, the median of
``--rounds`` compiled epochs of 44 steps after a first one that compiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from ai_edge_litert import interpreter as litert

import circle_jax as cj

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "quantized"


#: each trained run's name in the table -> its load options
RUNS = {"QAT, exported (LiteRT)": dict(qat=True),
        "QAT, moving ranges, exported (LiteRT)": dict(qat=True, qat_ranges="ema"),
        "float (circle-jax)": dict(qat=False)}


#: ``--tfmot``'s runs: (file, load options) by name
TFMOT_RUNS = {
    "float (qat=False)": ("qat_cnn_tfmot", dict(qat=False)),
    "QAT integer, file ranges": ("qat_cnn_tfmot", dict(qat=True)),
    "QAT fake_quant, ema 0.999": ("qat_cnn_tfmot", dict(qat=True, qat_ranges="ema")),
    "PTQ file: QAT integer, file ranges": ("qat_cnn_ptq", dict(qat=True)),
    "PTQ file: QAT fake_quant, ema 0.999": ("qat_cnn_ptq", dict(qat=True, qat_ranges="ema")),
    "PTQ file: QAT fake_quant, ema 0.9": ("qat_cnn_ptq", dict(qat=True, qat_ranges="ema",
                                                              qat_range_decay=0.9)),
}


def tfmot_table() -> None:
    """Per-epoch losses and test accuracy against tfmot's (see the module docstring)."""
    ref = json.loads((DATA / "qat_reference.json").read_text())
    x, y = digits()
    n = ref["train"]
    for opt, spec in ref["optimizers"].items():
        print(f"\n{spec['name']} lr {spec['learning_rate']}: loss per epoch (1-10), test "
              "accuracy\n\n| run | losses | test acc. |\n|---|---|---|")
        rows = {"tfmot QAT (TF)": ref[opt]["tfmot_qat"], "float (Keras)": ref[opt]["float"]}
        for name, row in rows.items():
            print(f"| {name} | {' '.join(f'{v:.4f}' for v in row['loss'])} | "
                  f"{row['test_accuracy']:.4f} |", flush=True)
        for name, (file, options) in TFMOT_RUNS.items():
            model = cj.load(DATA / f"{file}.tflite", **options)
            r = cj.fit(model, x[:n], y[:n], epochs=ref["epochs"], batch_size=ref["batch_size"],
                       loss="cce", optimizer=opt, learning_rate=spec["learning_rate"])
            acc = np.mean(np.asarray(model.apply(r.params, x[n:])).argmax(-1)
                          == y[n:].argmax(-1))
            print(f"| {name} | {' '.join(f'{v:.4f}' for v in r.history.loss)} | {acc:.4f} |",
                  flush=True)


def digits() -> tuple[np.ndarray, np.ndarray]:
    d = np.load(ROOT / "circle_jax" / "examples" / "digits.npz")
    x = d["images"].astype(np.float32).reshape(-1, 8, 8, 1) / 16.0
    return x, np.eye(10, dtype=np.float32)[d["labels"]]


def scores(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    p = p.reshape(len(y), -1)
    loss = -np.mean(np.sum(y * np.log(np.clip(p, 1e-7, 1.0)), axis=1))
    return float(loss), float(np.mean(p.argmax(1) == y.argmax(1)))


def run_litert(data: bytes, x: np.ndarray) -> np.ndarray:
    """LiteRT's outputs (real values) for real-valued ``x``, one sample at a time."""
    interp = litert.Interpreter(
        model_content=data,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    i, o = interp.get_input_details()[0], interp.get_output_details()[0]
    out = []
    for xi in x:
        v = xi[None]
        if i["dtype"] != np.float32:
            s, z = i["quantization"]
            v = np.clip(np.round(v / s) + z, -128, 127).astype(i["dtype"])
        interp.set_tensor(i["index"], v)
        interp.invoke()
        r = interp.get_tensor(o["index"]).astype(np.float32)
        if o["dtype"] != np.float32:
            s, z = o["quantization"]
            r = (r - z) * s
        out.append(r)
    return np.concatenate(out)


def step_times(models: list[str], rounds: int) -> None:
    """ms per training step of each forward (see the module docstring)."""
    x, y = digits()
    x, y = x[:1408], y[:1408]  # 44 batches of 32
    hyper = dict(batch_size=32, optimizer="adam", learning_rate=1e-3,
                 loss="categorical_crossentropy")
    print("| model | forward | ms/step |\n|---|---|---|")
    for name in models:
        data = (DATA / f"{name}.tflite").read_bytes()
        for run, load in (("QAT integer", dict(qat=True, qat_forward="integer")),
                          ("QAT fake_quant", dict(qat=True, qat_forward="fake_quant")),
                          ("float", dict(qat=False))):
            r = cj.fit(cj.load(data, **load), x, y, epochs=1, **hyper)  # compiles
            times = []
            for e in range(rounds):
                r = cj.fit(r.model, x, y, trainer=r.trainer, state=r.state, epochs=1,
                           initial_epoch=e + 1)
                times.append(r.history.ms_per_step[-1])
            print(f"| {name} | {run} | {statistics.median(times):.2f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--models", nargs="+", default=["full_int8", "full_int8_float_io",
                                                    "int16x8"])
    p.add_argument("--step_time", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tfmot", action="store_true")
    args = p.parse_args()
    if args.tfmot:
        tfmot_table()
        return
    if args.step_time:
        step_times(args.models, args.rounds)
        return
    x, y = digits()
    xt, yt, xv, yv = x[:1437], y[:1437], x[1437:], y[1437:]
    hyper = dict(epochs=args.epochs, batch_size=32, optimizer="adam", learning_rate=1e-3,
                 loss="categorical_crossentropy")
    print("| model | run | test loss | test accuracy | train s |\n|---|---|---|---|---|")
    for name in args.models:
        data = (DATA / f"{name}.tflite").read_bytes()
        loss, acc = scores(run_litert(data, xv), yv)
        print(f"| {name} | file (LiteRT) | {loss:.4f} | {acc:.4f} | |", flush=True)
        for run, options in RUNS.items():
            model = cj.load(data, **options)
            t = time.perf_counter()
            r = cj.fit(model, xt, yt, **hyper)
            took = time.perf_counter() - t
            if options["qat"]:
                pred = run_litert(model.export(r.params), xv)
            else:
                pred = np.asarray(model.apply(r.params, xv)[0])
            loss, acc = scores(pred, yv)
            print(f"| {name} | {run} | {loss:.4f} | {acc:.4f} | {took:.0f} |", flush=True)


if __name__ == "__main__":
    main()
