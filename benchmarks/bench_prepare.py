"""PREPARE of a first and a repeated ``circle-jax train`` run of every shared model.

    python benchmarks/bench_prepare.py [--models NAME,...] [--runs 3] [--batch B]
                                       [--settings mse-sgd,cce-adam-val-metric,...|all]
                                       [--learning_rate LR] [--against CHECKOUT]

Per model and setting: one fresh cache directory (``--compile_cache DIR``: JAX's persistent
compilation cache and circle-jax's traced programs), then ``--runs`` runs of ``circle-jax
train MODEL --epoch 1 --batch_size B --learning_rate LR`` with the setting's flags in new
processes on 4 x B random samples (B: ``--batch``, default the model's declared batch; LR:
``--learning_rate``, default 1e-5, smaller for models whose MSE diverges on random targets;
``--batch 32 --settings mse-sgd`` is the command line's defaults; integer inputs are zeros;
one-hot targets for cce), each run's PREPARE (reading the data, tracing and compiling the
epoch) read from its timing summary, the run's whole-process wall time (from starting
the process to its exit: a repeated run loads its programs from its start, beside the
imports and MODEL_LOAD, so PREPARE alone no longer holds the whole load) and its
whole-process CPU time (user + system: loading, PREPARE and the epoch; on a loaded
machine a steadier figure than wall time).
A setting is its loss (``mse``: ``--loss 1``, ``cce``:
``--loss 2``), optimizer (``sgd``: ``--optimizer 1``, ``adam``: ``--optimizer 2``), and
optionally ``val`` (``--validation_split 0.25``) and ``metric`` (``--metric 0``);
``all`` is the 16 combinations. Default: ``mse-sgd``.
With ``--against CHECKOUT`` (another commit's working tree, e.g. from ``git worktree add``)
each row is measured for both trees in alternating rounds, each tree with its own cache
(its circle_jax imported from the tree by ``PYTHONPATH``): both first runs, then ``--runs``
- 1 rounds of one repeated run each, the order swapped every round; two rows per cell.
Models this random data does not fit (inputs or outputs without a batch axis, dynamic
shapes) are listed with the command line's or the script's reason.

Not a test: numbers depend on the machine and its load. Prints a Markdown table; its last
column is the 1-minute load average when the row's runs ended.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_MODELS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "models"))
INPUT_SHAPES = {"oww_melspectrogram.tflite": [(1, 1760)]}  # dynamic input: a concrete size


#: a setting's word -> its command-line flags
FLAGS = {"mse": ["--loss", "1"], "cce": ["--loss", "2"], "sgd": ["--optimizer", "1"],
         "adam": ["--optimizer", "2"], "val": ["--validation_split", "0.25"],
         "metric": ["--metric", "0"]}
ALL = [f"{loss}-{opt}{val}{metric}" for loss in ("mse", "cce") for opt in ("sgd", "adam")
       for val in ("", "-val") for metric in ("", "-metric")]


def _data(path: str, name: str, tmp: str, onehot: bool, batch: int = 0
          ) -> tuple[str, str, int]:
    """(inputs .npz, expected .npy, batch) of random data for the model at ``path``
    (``batch`` 0: the model's declared batch)."""
    import circle_jax as cj

    model = cj.load(path)
    shapes = INPUT_SHAPES.get(name, [s.shape for s in model.inputs])
    scalar = [s.name for s, shape in zip(model.inputs, shapes, strict=True) if not shape]
    if scalar:
        raise ValueError(f"scalar input {scalar[0]!r}: no batch axis to fill")
    batch = batch or max(1, shapes[0][0])
    n = 4 * batch  # with validation: 3 x B train, B validate
    rng = np.random.default_rng(0)
    xs = {s.name: (rng.standard_normal((n, *shape[1:])) if "float" in s.dtype
                   else np.zeros((n, *shape[1:]))).astype(s.dtype)
          for s, shape in zip(model.inputs, shapes, strict=True)}
    out = model.outputs[0]
    if onehot:  # a distribution over the last axis, as categorical crossentropy expects
        y = np.eye(out.shape[-1])[rng.integers(0, out.shape[-1], (n, *out.shape[1:-1]))]
    else:
        y = rng.standard_normal((n, *out.shape[1:]))
    y = y.astype(out.dtype)
    xf, yf = os.path.join(tmp, f"{name}.x.npz"), os.path.join(tmp, f"{name}.{onehot}.y.npy")
    np.savez(xf, **xs)
    np.save(yf, y)
    return xf, yf, batch


def measure(name: str, setting: str, runs: int, tmp: str, batch: int = 0,
            trees: Sequence[str | None] = (None,), learning_rate: float = 1e-5
            ) -> list[tuple[list[float], list[float], list[float]]] | str:
    """Per tree (None: the installed circle_jax; else a checkout put first on
    ``PYTHONPATH``), in alternating rounds: (each run's PREPARE in ms, its whole-process
    wall time in s, its whole-process CPU time in s); or why not."""
    path = os.path.join(SHARED_MODELS, name)
    words = setting.split("-")
    try:
        xf, yf, batch = _data(path, name, tmp, "cce" in words, batch)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return f"{type(e).__name__}: {e}"[:120]
    argv = [sys.executable, "-m", "circle_jax.cli", "train", path, "--load_input", xf,
            "--load_expected", yf, "--epoch", "1", "--batch_size", str(batch),
            "--learning_rate", str(learning_rate), *(f for w in words for f in FLAGS[w])]
    caches = [tempfile.mkdtemp(dir=tmp) for _ in trees]
    results: list[tuple[list[float], list[float], list[float]]] = [([], [], []) for _ in trees]
    for r in range(runs):
        order = list(range(len(trees)))
        for i in order[::-1] if r % 2 else order:
            env = dict(os.environ)
            if trees[i] is not None:
                env["PYTHONPATH"] = os.pathsep.join(
                    [trees[i], *filter(None, [env.get("PYTHONPATH")])])
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            # cwd: ``python -m`` puts the working directory first on sys.path, ahead of
            # PYTHONPATH, so a run from inside a checkout would import that checkout's package
            p = subprocess.run([*argv, "--compile_cache", caches[i]], capture_output=True,
                               text=True, env=env, cwd=tmp)
            wall = time.perf_counter() - start
            found = re.search(r"^PREPARE +takes (\S+) ms$", p.stdout, re.M)
            if p.returncode or not found:
                return (p.stderr.strip().splitlines() or ["?"])[-1][:120]
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times, walls, cpu = results[i]
            times.append(float(found[1]))
            walls.append(wall)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated (default: all shared)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=0,
                    help="batch size (default: the model's declared batch)")
    ap.add_argument("--settings", default="mse-sgd",
                    help="comma-separated (e.g. cce-adam-val-metric), or all")
    ap.add_argument("--learning_rate", type=float, default=1e-5)
    ap.add_argument("--against", default=None, metavar="CHECKOUT",
                    help="another commit's tree, measured in alternating rounds")
    args = ap.parse_args()
    settings = ALL if args.settings == "all" else args.settings.split(",")
    unknown = [w for s in settings for w in s.split("-") if w not in FLAGS]
    if unknown:
        ap.error(f"unknown setting word(s) {unknown}; choose from {list(FLAGS)}")
    names = [n for n in args.models.split(",") if n] or sorted(
        f for f in os.listdir(SHARED_MODELS) if f.endswith((".tflite", ".circle")))
    trees: list[str | None] = [None]
    if args.against:
        if not os.path.isdir(os.path.join(args.against, "circle_jax")):
            ap.error(f"--against {args.against!r}: no circle_jax package in that directory")
        trees.append(os.path.abspath(args.against))
    from machine import describe

    print(f"Machine: {describe()}\n")
    print("| model | setting |" + (" tree |" if args.against else "") +
          " PREPARE first run (ms) | repeated runs (ms) | process wall s, first / repeated | "
          "process CPU s, first / repeated | load |")
    print("|---|---|" + ("---|" if args.against else "") + "---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for setting in settings:
                r = measure(name, setting, args.runs, tmp, args.batch, trees,
                            args.learning_rate)
                if isinstance(r, str):
                    print(f"| {name} | {setting} | not trained: {r} |" +
                          " |" * (5 if args.against else 4), flush=True)
                    continue
                for tree, ((first, *later), wall, cpu) in zip(trees, r, strict=True):
                    seconds = " | ".join(
                        f"{t[0]:.1f} / {', '.join(f'{u:.1f}' for u in t[1:])}"
                        for t in (wall, cpu))
                    label = f" {tree or 'installed'} |" if args.against else ""
                    print(f"| {name} | {setting} |{label} {first:.0f} | "
                          f"{', '.join(f'{t:.0f}' for t in later)} | {seconds} | "
                          f"{os.getloadavg()[0]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
