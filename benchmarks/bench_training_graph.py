"""The exported training step (`circle_jax.ondevice.export_training_graph`): its files'
sizes and LiteRT's and onert's step times against circle-jax's compiled step (a benchmark,
not a test).

    python benchmarks/bench_training_graph.py [--steps N] [--only TEXT]

For each model, trainable set and optimizer: the ``functional`` export's model file (the
graph, the frozen weights as constants; the state are inputs) and its ``.wof`` (the initial
state: trainable weights and optimizer slots), and the ``signatures`` file (one file: the
variables' initial values are constants of its initialiser). Step times, the median of
``--steps`` steps after one warm-up, alternating the four runners step by step (the
machine is shared and changes speed): LiteRT (ai-edge-litert, its default XNNPACK delegate
where it applies, one thread) running the functional step (set inputs, invoke, read the loss
and new state: what a device loop does) and the ``train`` signature's runner; onert's
inference session (the wheel's native ``nnfw_session(path, "cpu")``, its default threads)
running the functional step written as a .circle, the same loop; and circle-jax's
``jax.jit(Trainer.train_step)`` (one step of ``fit``, same configuration, compiled once).

Models: MobileNet v1 0.25/128 (shared/models, batch 8; every weight, or a new 5-class head
alone) and the torch MLP 64-64-10 (tests/data/torch/mlp.tflite, batch 16; every weight).
CCE on MobileNet's probabilities (the numerics profile's reading), MSE on the MLP.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np
from ai_edge_litert import interpreter as litert
from onert.native.libnnfw_api_pybind import infer, prepare_config

import circle_jax as cj
from circle_jax.ondevice import export_training_graph
from circle_jax.train import Trainer

try:
    from machine import describe
except ImportError:  # run from elsewhere
    from benchmarks.machine import describe

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MOBILENET = os.path.join(ROOT, "..", "shared", "models", "mobilenet_v1_0.25_128_float.tflite")
MLP = os.path.join(ROOT, "tests", "data", "torch", "mlp.tflite")
CASES = {  # name: (path, batch, loss, personalize options)
    "mobilenet_0.25_128 full": (MOBILENET, 8, "cce", {}),
    "mobilenet_0.25_128 head": (MOBILENET, 8, "cce", {"new_head": 5}),
    "mlp 64-64-10": (MLP, 16, "mse", {}),
}


def _data(model: cj.Model, batch: int, loss: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, *model.inputs[0].shape[1:])).astype(np.float32)
    k = model.outputs[0].shape[-1]
    y = (np.eye(k, dtype=np.float32)[rng.integers(0, k, batch)] if loss == "cce"
         else rng.standard_normal((batch, k)).astype(np.float32))
    return x, y


def onert_functional(step_model: bytes, feeds: list[np.ndarray], state: list[np.ndarray],
                     directory: str):
    """A step of the functional graph in onert's inference session: set the inputs, run,
    read the loss and the new state (fed to the next call)."""
    path = os.path.join(directory, "step.circle")
    with open(path, "wb") as f:
        f.write(step_model)
    session = infer.nnfw_session(path, "cpu")
    session.set_prepare_config(prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
    session.prepare()
    held = [list(state)]

    def step() -> None:
        inputs = [np.ascontiguousarray(a) for a in feeds + held[0]]  # onert keeps pointers
        for i, a in enumerate(inputs):
            session.set_input(i, a)
        session.run()
        outs = [np.array(session.get_output(i), copy=True)
                for i in range(session.output_size())]
        held[0] = outs[1:]

    return step


def measure(name: str, optimizer: str, steps: int, directory: str) -> dict:
    path, batch, loss, options = CASES[name]
    model = cj.load(path)
    if options:
        model = model.personalize(**options)
    x, y = _data(model, batch, loss)
    config = dict(loss=loss, optimizer=optimizer, learning_rate=1e-3, batch_size=batch)
    fn = export_training_graph(model, **config)
    sig = export_training_graph(model, packaging="signatures", **config)
    # LiteRT, functional: each step's state fed to the next
    interp = litert.Interpreter(model_content=fn.model, num_threads=1)
    interp.allocate_tensors()
    ins, outs = interp.get_input_details(), interp.get_output_details()
    state = list(fn.state.values())

    def functional() -> None:
        nonlocal state
        for d, v in zip(ins, [x, y, *state]):
            interp.set_tensor(d["index"], v)
        interp.invoke()
        state = [interp.get_tensor(d["index"]) for d in outs[1:]]

    # LiteRT, the train signature
    runner = litert.Interpreter(model_content=sig.model, num_threads=1)
    train = runner.get_signature_runner("train")
    feed = {model.inputs[0].name: x, "target": y}
    key = next(iter(train.get_input_details()))
    if key not in feed:  # the signature names its input by the tensor's name
        feed = dict(zip(train.get_input_details(), (x, y)))

    def signature() -> None:
        train(**feed)

    # circle-jax: fit's compiled step
    trainer = Trainer(model, **config)
    st, frozen = trainer.init()
    compiled = jax.jit(trainer.train_step).lower(st, frozen, ((x,), y)).compile()
    cj_state = [st]

    def circle_jax() -> None:
        cj_state[0], _ = compiled(cj_state[0], frozen, ((x,), y))
        jax.block_until_ready(cj_state[0])

    circle = export_training_graph(model, file_format="circle", **config)
    onert_step = onert_functional(circle.model, [x, y], list(circle.state.values()), directory)

    runs = {"functional": functional, "signature": signature, "onert": onert_step,
            "circle-jax": circle_jax}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():  # warm-up
        f()
    for _ in range(steps):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            times[k].append(1000 * (time.perf_counter() - t))
    return {"case": name, "optimizer": optimizer,
            "state": sum(v.size for v in fn.state.values()),
            "fn_kib": len(fn.model) / 1024, "wof_kib": len(fn.wof) / 1024,
            "sig_kib": len(sig.model) / 1024,
            **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", default="")
    args = p.parse_args()
    print(describe())
    print("| model | optimizer | state values | functional KiB | .wof KiB | signatures KiB "
          "| LiteRT functional ms | LiteRT train signature ms | onert functional ms "
          "| circle-jax ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in CASES:
        for optimizer in ("sgd", "adam"):
            if args.only and args.only not in f"{name} {optimizer}":
                continue
            with tempfile.TemporaryDirectory() as directory:
                r = measure(name, optimizer, args.steps, directory)
            print(f"| {r['case']} | {r['optimizer']} | {r['state']:,} | {r['fn_kib']:.1f} "
                  f"| {r['wof_kib']:.1f} | {r['sig_kib']:.1f} | {r['functional_ms']:.3g} "
                  f"| {r['signature_ms']:.3g} | {r['onert_ms']:.3g} "
                  f"| {r['circle-jax_ms']:.3g} |", flush=True)


if __name__ == "__main__":
    main()
