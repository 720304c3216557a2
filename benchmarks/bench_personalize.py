"""Trainable params, XLA's step memory and step time of full fine-tuning, a new head and LoRA
(a benchmark, not a test).

    python benchmarks/bench_personalize.py [--steps N] [--only TEXT]

For each model and mode, one ``jax.jit(Trainer.train_step)`` is compiled for one batch
(Adam, categorical cross-entropy on the model's output, random normal inputs) and:
``trainable`` counts the weights that train; ``temp`` / ``args`` are XLA's memory analysis
of the compiled step (``.lower(...).compile().memory_analysis()``: ``temp_size_in_bytes``,
the scratch for intermediates such as activations kept for the backward pass and the
gradients; ``argument_size_in_bytes``, params, optimizer state and batch); ms/step is the
median of ``--steps`` steps after one warm-up (machine- and load-dependent).

Models: MobileNet v1 0.25/128 (shared/models, batch 8, head -> 5 classes) and the toy
transformer (shared/models/aeq_toy_transformer_kv_cache_2sig.tflite, its 400-way logits
output, batch 1). Modes: ``full`` (every weight), ``head`` (``new_head``; the transformer's
head is its last FULLY_CONNECTED), ``lora R`` (R in 4, 16, adapters on every target, the
base frozen; on MobileNet with the new head, which trains too). LoRA targets every such
layer whose rank ``min(out, fan_in)`` is at least R (MobileNet's first pointwise
convolutions have 8 or 16 outputs: R = 16 skips the ones below it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import circle_jax as cj
from circle_jax.train import Trainer

MODELS = {
    "mobilenet_0.25_128": ("/work/shared/models/mobilenet_v1_0.25_128_float.tflite", 8, 5),
    "toy_transformer": ("/work/shared/models/aeq_toy_transformer_kv_cache_2sig.tflite", 1,
                        None),
}
MODES = {"full": {}, "head": {"new_head": 5}, "lora 4": {"lora": 4}, "lora 16": {"lora": 16}}


def measure(name: str, mode: str, steps: int) -> dict:
    path, batch, classes = MODELS[name]
    options = dict(MODES[mode])
    output = 0
    if name == "toy_transformer":
        base = cj.load(path)
        output = [o.name for o in base.outputs].index("StatefulPartitionedCall:0")
        if "new_head" in options:
            options["new_head"] = base.outputs[output].shape[-1]
    elif "lora" in options:
        options["new_head"] = classes
    model = cj.load(path)
    if "new_head" in options:
        model = model.personalize(output=output, new_head=options["new_head"])
    if "lora" in options:
        model = model.personalize(lora=options["lora"],
                                  lora_targets=_targets(model, options["lora"]))
    trainer = Trainer(model, batch_size=batch, loss="cce", optimizer="adam",
                      learning_rate=1e-3, loss_output=output,
                      trainable="all" if mode == "full" else None)
    rng = np.random.default_rng(0)
    xs = tuple(rng.normal(size=(batch, *s.shape[1:])).astype(s.dtype)
               if np.issubdtype(np.dtype(s.dtype), np.floating)
               else rng.integers(0, 8, (batch, *s.shape[1:])).astype(s.dtype)
               for s in model.inputs)
    out = model.outputs[output].shape
    y = jax.nn.one_hot(rng.integers(0, out[-1], (batch, *out[1:-1])), out[-1])
    state, frozen = trainer.init()
    step = jax.jit(trainer.train_step)
    compiled = step.lower(state, frozen, (xs, y)).compile()
    mem = compiled.memory_analysis()
    state, _ = compiled(state, frozen, (xs, y))
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, m = compiled(state, frozen, (xs, y))
        jax.block_until_ready(state)
        times.append(1000 * (time.perf_counter() - t))
    n = sum(int(np.prod(model.params[k].shape)) for k in trainer.trainable)
    return {"model": name, "mode": mode, "trainable": n,
            "temp_mib": mem.temp_size_in_bytes / 2**20,
            "args_mib": mem.argument_size_in_bytes / 2**20,
            "ms_step": statistics.median(times)}


def _targets(model: cj.Model, rank: int) -> list[str]:
    """The weights of every FULLY_CONNECTED / CONV_2D / BATCH_MATMUL whose rank
    (``min(out, fan_in)``) is at least ``rank`` (a smaller layer refuses the rank)."""
    sg, out = model.ir.main, []
    for op in sg.operators:
        if op.type in ("FULLY_CONNECTED", "CONV_2D", "BATCH_MATMUL") and len(op.inputs) > 1:
            w = sg.tensors[op.inputs[1]]
            if w.is_constant and w.is_float and min(w.shape[0] if op.type != "BATCH_MATMUL"
                                                    else w.shape[-1],
                                                    int(np.prod(w.shape[1:]))
                                                    if op.type != "BATCH_MATMUL"
                                                    else w.shape[-2]) >= rank:
                out.append(f"op{op.index}.weight" if op.type != "BATCH_MATMUL"
                           else f"op{op.index}.in1")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", default="")
    args = p.parse_args()
    print("| model | mode | trainable weights | XLA temp MiB | XLA args MiB | ms/step |")
    print("|---|---|---:|---:|---:|---:|")
    for name in MODELS:
        for mode in MODES:
            if args.only not in f"{name} {mode}":
                continue
            r = measure(name, mode, args.steps)
            print(f"| {r['model']} | {r['mode']} | {r['trainable']:,} | {r['temp_mib']:.1f} | "
                  f"{r['args_mib']:.1f} | {r['ms_step']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
