"""Peak memory of in-step gradient accumulation vs the full batch (a benchmark, not a test).

    python benchmarks/bench_accumulation_memory.py [--quick] [--steps N] [--budget-s S]
                                                   [--only TEXT] [--json PATH]

Every configuration runs in its own subprocess (so one run's memory cannot leak into the
next) and compiles ONE training step, ``jax.jit(Trainer.train_step)``, for its batch. Two
kinds of memory are reported, and they are different things:

- XLA's own analysis of the compiled step (``compiled.memory_analysis()``): ``temp`` is the
  scratch XLA's buffer assignment reserves for intermediates (activations kept for the
  backward pass, gradients, ...), ``args``/``out`` the parameter and result buffers. It is
  exact for the compiled program and independent of machine load, but it does not see memory
  a library call allocates for itself (Eigen's convolution packing buffers on CPU). On the
  CPU backend ``peak_memory_in_bytes`` is only arguments + outputs, so it is not shown.
- The process resident set, from ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` in the
  subprocess. ``step RSS``: before each step the peak is reset (``/proc/self/clear_refs``),
  and the step's peak minus the resident set just before it is how much memory that step
  touched; the largest over the timed steps is shown (the first, warm-up step is excluded).
  The subprocess runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed large blocks go
  back to the system and the resident set follows live memory. ``process peak``: the whole
  subprocess's ``ru_maxrss`` (Python, JAX, the model, XLA compilation and the steps; on CPU
  usually set by imports and the compiler rather than the step).

In-step accumulation (``accumulate=k, accumulate_mode="in_step"``) splits the step's batch
into k micro-batches inside a ``lax.scan``; the compiled HLO must keep that loop (the
``while`` column counts while loops in the optimized HLO) for only one micro-batch's
activations to be live. ``stream`` rows compile a step on one micro-batch (the update every
k-th step): the memory floor, at the price of k dispatches per update. ``conv`` counts the
``convolution`` instructions left in the optimized HLO (0 when every convolution is lowered
to matmuls). ``im2col convs`` rows force circle-jax's im2col lowering
(``circle_jax.lowering.LoweringOptions(force=...)``); ``scan unrolled`` rows patch the
in-step scan to
``unroll=True`` in their subprocess (an experiment, not a Trainer option).

Models: ``conv4`` is nntrainer's SimpleShot Conv-4 backbone
(/work/shared/models/nntrainer_simpleshot_conv4_60classes.tflite, 32x32x3 -> 64, 112k
weights; skipped if the file is absent); ``branching64`` is the bundled branching CNN with
64 channels on 8x8x1 inputs. Inputs and targets are random normal, the loss is MSE, the
optimizer SGD unless stated. ms/step is the median over the timed steps (at most
``--steps``, stopping after ``--budget-s`` seconds but timing at least 2) and depends on the
machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

CONV4 = "/work/shared/models/nntrainer_simpleshot_conv4_60classes.tflite"
MIB = 2.0**20


@dataclass(frozen=True)
class Config:
    model: str  # "conv4" or "branching64"
    batch: int  # samples per compiled step (per micro-batch for "stream")
    k: int = 1  # micro-batches per update
    mode: str = "in_step"
    precision: str | None = None
    loss_scale: str = "none"
    on_overflow: str = "skip"
    optimizer: str = "sgd"
    lowering: str | None = None  # force circle-jax's convolution lowering
    unroll: bool = False  # patch the in-step scan to unroll=True (an experiment)
    quick: bool = False

    def label(self) -> str:
        if self.k == 1:
            shape = f"batch {self.batch}"
        elif self.mode == "in_step":
            shape = f"in_step {self.k}x{self.batch // self.k}"
        else:
            shape = f"stream {self.k}x{self.batch}"
        extra = [self.optimizer] if self.optimizer != "sgd" else []
        if self.precision:
            extra.append(f"{self.precision} {self.loss_scale}")
        if self.on_overflow != "skip":
            extra.append(self.on_overflow)
        if self.lowering:
            extra.append(f"{self.lowering} convs")
        if self.unroll:
            extra.append("scan unrolled")
        return f"{self.model} {shape}" + (f" ({', '.join(extra)})" if extra else "")


F16 = dict(precision="p=f32,c=f16,o=f32", loss_scale="dynamic", optimizer="adam")
CONFIGS = [
    Config("conv4", 64, quick=True),
    Config("conv4", 64, 2),
    Config("conv4", 64, 4, quick=True),
    Config("conv4", 64, 8),
    Config("conv4", 16, quick=True),  # one micro-batch of 4x16 on its own
    Config("conv4", 16, 4, "stream"),
    Config("conv4", 64, 4, unroll=True),
    Config("conv4", 64, 4, lowering="im2col", unroll=True),
    Config("conv4", 64, lowering="im2col", quick=True),
    Config("conv4", 64, 4, lowering="im2col", quick=True),
    Config("conv4", 16, lowering="im2col"),
    Config("conv4", 256),
    Config("conv4", 256, 4),
    Config("conv4", 256, 16),
    Config("conv4", 256, lowering="im2col"),
    Config("conv4", 256, 4, lowering="im2col"),
    Config("conv4", 64, **F16),
    Config("conv4", 64, 4, **F16),
    Config("conv4", 64, 4, on_overflow="retry", **F16),
    Config("branching64", 256),
    Config("branching64", 256, 4),
]


# --------------------------------------------------------------------------- worker side

def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset the peak resident set (VmHWM, and so ru_maxrss) to the current one (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _unroll_in_step_scan() -> None:
    """Make `accumulate_in_step`'s ``lax.scan`` fully unrolled, in this process only."""
    import functools
    import importlib
    import types

    from jax import lax

    # the module (circle_jax.optim re-exports a function of the same name)
    acc_module = importlib.import_module("circle_jax.optim.accumulate")

    shim = types.SimpleNamespace(**{n: getattr(lax, n) for n in dir(lax) if not n.startswith("_")})
    shim.scan = functools.partial(lax.scan, unroll=True)
    acc_module.lax = shim


def worker(cfg: Config, steps: int, budget_s: float) -> dict:
    import gc
    import resource
    import statistics
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    import circle_jax as cj
    from circle_jax.examples import branching_cnn
    from circle_jax.lowering import LoweringOptions
    from circle_jax.train import Trainer

    def maxrss_kib() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    if cfg.unroll:
        _unroll_in_step_scan()
    lowering = LoweringOptions(force=cfg.lowering) if cfg.lowering else None
    if cfg.model == "conv4":
        model = cj.load(CONV4, lowering=lowering)
    else:
        model = cj.load(branching_cnn(channels=64).to_bytes("circle"), lowering=lowering)
    rng = np.random.default_rng(0)
    x_shape = (cfg.batch,) + tuple(model.inputs[0].shape[1:])
    out_shape = jax.eval_shape(model.apply, model.params, jnp.zeros((1,) + x_shape[1:]))[0]
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    y = jnp.asarray(rng.standard_normal((cfg.batch,) + out_shape.shape[1:]), jnp.float32)
    trainer = Trainer(model, batch_size=cfg.batch, loss="mse", optimizer=cfg.optimizer,
                      learning_rate=1e-4, accumulate=cfg.k, accumulate_mode=cfg.mode,
                      precision=cfg.precision, loss_scale=cfg.loss_scale,
                      on_overflow=cfg.on_overflow)
    state, frozen = trainer.init()
    batch = ((x,), y)

    t = time.perf_counter()
    lowered = jax.jit(trainer.train_step).lower(state, frozen, batch)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    ma = compiled.memory_analysis()
    hlo = compiled.as_text().splitlines()
    n_while = sum(1 for line in hlo if " while(" in line)
    n_conv = sum(1 for line in hlo if " convolution(" in line)
    process_peak = maxrss_kib()  # imports, model, data, compilation

    times, step_rss = [], []
    t_start = time.perf_counter()
    for i in range(steps + 1):
        gc.collect()
        rss_before = _status_kib("VmRSS")
        reset = _reset_peak()
        t = time.perf_counter()
        state, metrics = compiled(state, frozen, batch)
        jax.block_until_ready((state, metrics))
        dt = time.perf_counter() - t
        peak = maxrss_kib()
        process_peak = max(process_peak, peak)
        if i:  # the first call is a warm-up (one-time allocations)
            times.append(dt)
            if reset:
                step_rss.append(peak - rss_before)
            if len(times) >= 2 and time.perf_counter() - t_start > budget_s:
                break
    return {
        **asdict(cfg),
        "label": cfg.label(),
        "temp": ma.temp_size_in_bytes,
        "args": ma.argument_size_in_bytes,
        "out": ma.output_size_in_bytes,
        "alias": ma.alias_size_in_bytes,
        "n_while": n_while,
        "n_conv": n_conv,
        "step_rss_kib": max(step_rss) if step_rss else None,
        "process_peak_kib": process_peak,
        "compile_s": compile_s,
        "ms_per_step": 1000 * statistics.median(times),
        "timed_steps": len(times),
        "finite": bool(np.isfinite(float(metrics.loss))),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
    }


# --------------------------------------------------------------------------- driver side

def run_config(cfg: Config, steps: int, budget_s: float) -> dict:
    # A fixed mmap threshold (which also turns off glibc's adaptive one) returns every large
    # block to the system when it is freed, so the resident set follows live memory instead
    # of what the allocator keeps cached from earlier steps.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(asdict(cfg)),
         "--steps", str(steps), "--budget-s", str(budget_s)],
        capture_output=True, text=True, check=False, env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{cfg.label()} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def table(rows: list[dict]) -> str:
    head = ("| configuration | XLA temp MiB | XLA args MiB | XLA out MiB | while | conv | "
            "step RSS MiB | process peak MiB | ms/step |")
    out = [head, "|---|" + "---:|" * 8]
    for r in rows:
        step_rss = "n/a" if r["step_rss_kib"] is None else f"{r['step_rss_kib'] / 1024:.0f}"
        out.append(
            f"| {r['label']} | {r['temp'] / MIB:.1f} | {r['args'] / MIB:.2f} | "
            f"{r['out'] / MIB:.2f} | {r['n_while']} | {r['n_conv']} | {step_rss} | "
            f"{r['process_peak_kib'] / 1024:.0f} | {r['ms_per_step']:.0f} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the configurations marked quick")
    ap.add_argument("--steps", type=int, default=10, help="most timed steps per configuration")
    ap.add_argument("--budget-s", type=float, default=20.0,
                    help="stop timing a configuration after this long (at least 2 steps)")
    ap.add_argument("--only", help="only configurations whose label contains this")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(Config(**json.loads(args.worker)), args.steps, args.budget_s)))
        return
    configs = [c for c in CONFIGS if (c.quick or not args.quick)
               and (args.only is None or args.only in c.label())]
    if not os.path.exists(CONV4):
        print(f"note: {CONV4} not found, skipping the conv4 configurations", file=sys.stderr)
        configs = [c for c in configs if c.model != "conv4"]
    rows = []
    for cfg in configs:
        rows.append(run_config(cfg, args.steps, args.budget_s))
        r = rows[-1]
        print(f"  {r['label']}: temp {r['temp'] / MIB:.1f} MiB, {r['ms_per_step']:.0f} ms/step",
              file=sys.stderr, flush=True)
    print(f"backend {rows[0]['backend']}, jax {rows[0]['jax']}, {os.cpu_count()} CPUs")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
