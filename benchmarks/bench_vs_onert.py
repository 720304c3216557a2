"""Per-step training time and peak memory of circle-jax vs onert on the same model and data.

    python benchmarks/bench_vs_onert.py [--models example,mnist,resnet8,mobilenet,mlp,keras_mlp,
                                                  keras_cnn,keras_conv1d,depthwise]
                                        [--batches 1,16] [--epochs 5] [--rounds 1]
                                        [--json FILE]

Each (model, batch size, runtime) runs in its own fresh subprocess, so each peak-memory
figure belongs to one runtime alone. Both runtimes get the same model file (the bundled
example is written to a temporary .circle first) and the same float32 data, and train with
the same settings: categorical crossentropy, SGD (learning rate 0.01), all operators
trainable, sequential batches, trailing partial batch dropped.

- time: wall time of one epoch divided by its steps (ms/step). circle-jax: ``fit``'s
  ``History.ms_per_step``, the median of 5 further ``fit`` calls of ``--epochs`` epochs
  each on the first one's ``Trainer`` (compiled epochs kept; the first run pays
  compilation, reported apart, and first-execution costs): all epochs in one compiled
  call, as ``fit`` runs them without callbacks, timed from the call's arguments to the
  summaries on the host; the process runs CPU programs inline (``--dispatch``, as the
  command line does: `circle_jax.inline_cpu_dispatch`) and keeps freed host memory for the
  next call (``--host-memory``, as the command line does: `circle_jax.retain_host_memory`);
  in parentheses the same epoch by epoch (an ``on_epoch`` callback: one compiled scan and
  one host sync per epoch, the median epoch after the first). onert: the median
  over ``--epochs`` epochs of the epoch's Python loop of ``train_set_input`` /
  ``train_set_expected`` / ``train`` / ``train_get_loss`` per batch (tests/onert_peer.py);
  onert_train's own ms/step covers the same loop in C++; the time inside ``train()``
  alone is shown in parentheses, a lower bound for onert's per-step cost.
- library: circle-jax as a notebook runs it (runtime ``library``): a fresh process that
  calls neither `circle_jax.inline_cpu_dispatch` nor `circle_jax.retain_host_memory`
  (JAX's defaults), ``fit`` with an ``on_epoch`` callback, its ``History.ms_per_step``
  (the median epoch after the first of its first ``fit``; under asynchronous dispatch
  ``fit`` runs such epochs in queued calls of about 50 ms, each epoch's figure its call's
  share); its speed-up is onert's ms/step over this.
- paired: the library and onert in one process, in turns (runtime ``paired``):
  `PAIRED_BLOCKS` blocks of ``--epochs`` epochs each, a block of the library's ``fit`` with
  an ``on_epoch`` callback (as ``library``) then a block of onert's epochs on a session
  opened before, so that both
  runtimes meet the same speed of the development VM (which switches between two speeds
  from one second to the next; separate processes meet them at random; one onert epoch
  inside ``on_epoch`` would train alongside the queued epoch). Reported apart, below the
  main table: both runtimes' median ms/step (the first epoch of each library block and
  onert's first epoch left out) and the
  median and range of the per-block ratios of medians. No memory figures (one process
  holds both).
- calls: whole calls in one process, in turns (runtime ``calls``): `CALL_ROUNDS` rounds,
  each a ``fit(trainer=..., epochs=E)`` on device-array samples (``jax.device_put`` once, as
  onert's ``DataLoader`` is built once), the same on numpy samples (checked and moved every
  call), a ``fit`` of 0 epochs (its fixed cost alone) and onert's
  ``TrainSession.train(loader, epochs=E)`` (its experimental Python API; the session's
  first call, before the rounds, pays its warm-up: every timed one is a second call or
  later). Both sides in the notebook's process settings, after one untimed call each.
  Reported: median ms of each, the per-round ratios (onert / fit on device arrays).
- memory: the peak resident set (RSS high-water mark) of the worker process, ``VmHWM`` of
  ``/proc/self/status``. It covers the whole process, the runtime's own libraries included;
  "delta" subtracts the same figure read right after importing the runtime and numpy,
  before model and data are loaded (what the model, data, compilation and training added).
  Not ``resource.getrusage(RUSAGE_SELF).ru_maxrss``: on Linux a child's ru_maxrss starts at
  its parent's RSS at fork time (kept across exec), so every worker would report at least
  the benchmark driver's own size (measured: a 400 MiB parent gives a fresh child a
  426 MiB ru_maxrss, VmHWM 11 MiB). It is the fallback where /proc does not exist.
  tracemalloc is not used: it sees only Python-heap allocations, not XLA's or onert's
  native buffers.

- rounds: on a shared machine one run of each can be off by a third, so ``--rounds R`` runs
  every (model, batch) R times, onert and circle-jax alternating, and reports the median
  ms/step of each runtime, their ratio, and the range of the per-round ratios.

Not a test: numbers depend on the machine and its load. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED_MODELS = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))

# name -> (model file or "example", samples used, description)
MODELS = {
    "example": ("example", 1792, "bundled branching CNN (8 ch) on 8x8 digits"),
    "mnist": ("onert_micro_simple_mnist_model.circle", 1024,
              "onert-micro simple MNIST (conv 2x2, maxpool, 2 FC), 11x11x1"),
    "resnet8": ("mlperftiny_resnet8_cifar10_float.tflite", 256,
                "MLPerf Tiny ResNet-8 (3 residual blocks, 16-64 ch), 32x32x3"),
    "mobilenet": ("mobilenet_v1_0.25_128_float.tflite", 64,
                  "MobileNet v1 0.25/128 (depthwise), 128x128x3, 1001 classes"),
    "mlp": ("mlp", 1792, "MLP 64-64-10 (builder): FC 64 + ReLU, FC 10, softmax, on the "
                         "8x8 digits as 64 features"),
    # Converted by TF's own converter (tests/data/keras, scripts/make_keras_models.py): the
    # small models on-device training is about (issue 16's table).
    "keras_mlp": ("tests/data/keras/mlp_zero_bias.tflite", 320,
                  "Keras MLP (Dense biases dropped by the converter)"),
    "keras_cnn": ("tests/data/keras/branching_cnn.tflite", 320,
                  "Keras branching CNN, three Conv2Ds sharing one bias tensor"),
    "keras_conv1d": ("tests/data/keras/conv1d_stack.tflite", 320, "Keras Conv1D stack"),
    "depthwise": ("depthwise", 160, "depthwise CNN (builder): 3x3 depthwise + 1x1, 16x16x8"),
}
LEARNING_RATE = 0.01
#: how many times the fused run is timed (its median is reported, as onert's median epoch)
FUSED_REPEATS = 5


def _rss_mib() -> float:
    """Peak RSS of this process in MiB (VmHWM; see the module docstring)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 1024)  # bytes on macOS, else KiB


def prepare(name: str, tmp: str) -> tuple[str, str, str]:
    """(model path, x .npy, y .npy) for a model, written by the parent process so that the
    workers import nothing but their runtime and numpy."""
    import numpy as np

    import circle_jax as cj

    source, n, _ = MODELS[name]
    if source in ("example", "mlp"):
        from circle_jax.examples import branching_cnn, digits

        path = os.path.join(tmp, f"{source}.circle")
        (branching_cnn() if source == "example" else _mlp()).save(path)
        x, y = digits()
        x, y = x[:n], y[:n]
        if source == "mlp":
            x = x.reshape(n, 64)
    else:
        if source == "depthwise":
            path = os.path.join(tmp, "depthwise.circle")
            _depthwise_cnn().save(path)
        elif source.startswith("tests/"):  # a .tflite: onert reads the CIR0 copy alike
            path = os.path.join(tmp, os.path.basename(source).replace(".tflite", ".circle"))
            with open(path, "wb") as f:
                f.write(cj.load(os.path.join(ROOT, source), tie_shared_weights=True)
                        .export(file_format="circle"))
        else:
            path = os.path.join(SHARED_MODELS, source)
        model = cj.load(path)
        in_shape, out_shape = model.inputs[0].shape, model.outputs[0].shape
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 1, (n, *in_shape[1:])).astype(np.float32)
        y = np.eye(out_shape[-1], dtype=np.float32)[rng.integers(0, out_shape[-1], n)]
        y = y.reshape((n, *out_shape[1:]))
    xf, yf = os.path.join(tmp, f"{name}_x.npy"), os.path.join(tmp, f"{name}_y.npy")
    np.save(xf, x)
    np.save(yf, y)
    return path, xf, yf


def _mlp():
    """The MLP 64-64-10 of the small-model table: FULLY_CONNECTED 64 -> 64 + ReLU,
    FULLY_CONNECTED 64 -> 10, SOFTMAX (He-initialized weights, zero biases)."""
    import numpy as np

    from circle_jax.build import Builder

    rng = np.random.default_rng(0)
    b = Builder("MLP 64-64-10")
    h = b.input("x", (1, 64))
    for i, (o, k) in enumerate([(64, 64), (10, 64)]):
        w = b.constant(f"fc{i}/w", (rng.standard_normal((o, k)) * np.sqrt(2 / k))
                       .astype(np.float32))
        h = b.op("FULLY_CONNECTED", [h, w, b.constant(f"fc{i}/b", np.zeros(o, np.float32))],
                 {"fused_activation_function": 1 if i == 0 else 0})
    b.output(b.op("SOFTMAX", [h], {"beta": 1.0}))
    return b


def _depthwise_cnn():
    """A small depthwise-separable CNN: DEPTHWISE_CONV_2D 3x3 (x8 channels) + ReLU, a 1x1
    CONV_2D to 16, mean pooling, FULLY_CONNECTED to 10 classes, SOFTMAX."""
    import numpy as np

    from circle_jax.build import Builder

    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (1, 16, 16, 8))
    dw = b.constant("dw/w", rng.normal(0, 0.3, (1, 3, 3, 8)).astype(np.float32))
    db = b.constant("dw/b", np.zeros(8, np.float32))
    h = b.op("DEPTHWISE_CONV_2D", [x, dw, db], {"padding": 0, "stride_h": 1, "stride_w": 1,
                                                "depth_multiplier": 1,
                                                "fused_activation_function": 1})
    pw = b.constant("pw/w", rng.normal(0, 0.3, (16, 1, 1, 8)).astype(np.float32))
    pb = b.constant("pw/b", np.zeros(16, np.float32))
    h = b.op("CONV_2D", [h, pw, pb], {"padding": 1, "stride_h": 1, "stride_w": 1,
                                      "fused_activation_function": 1})
    axes = b.constant("axes", np.array([1, 2], np.int32))
    h = b.op("MEAN", [h, axes], {"keep_dims": False})
    fw = b.constant("fc/w", rng.normal(0, 0.3, (10, 16)).astype(np.float32))
    fb = b.constant("fc/b", np.zeros(10, np.float32))
    h = b.op("FULLY_CONNECTED", [h, fw, fb], {})
    b.output(b.op("SOFTMAX", [h], {"beta": 1.0}))
    return b


def worker(runtime: str, name: str, batch: int, epochs: int, files: list[str],
           lowering: str = "auto", dispatch: str = "inline",
           host_memory: str = "retain") -> dict:
    """Runs in a fresh process: train one model with one runtime; returns the figures."""
    import numpy as np

    # no process settings: JAX's and glibc's defaults
    notebook = runtime in ("library", "paired", "calls")
    if runtime != "onert":
        import jax

        import circle_jax as cj
        from circle_jax.train import fit
        # as the command line runs (circle_jax.train.dispatch, circle_jax.train.memory)
        if not notebook and dispatch == "inline":
            assert cj.inline_cpu_dispatch()
        if not notebook and host_memory == "retain":
            assert cj.retain_host_memory()
        jax.numpy.zeros(1).block_until_ready()  # backend up: part of the baseline
    if runtime in ("onert", "paired"):
        sys.path.insert(0, ROOT)
        from onert.native import libnnfw_api_pybind  # noqa: F401  (part of the baseline)

        from tests.onert_peer import onert_fit  # numpy and onert only
    base = _rss_mib()
    extra: dict = {}
    path, xf, yf = files
    x, y = np.load(xf), np.load(yf)

    def library_fit(on_epoch):  # as a notebook calls it, timed between on_epoch callbacks
        return fit(cj.load(path), x, y, epochs=epochs + 1, batch_size=batch,
                   learning_rate=LEARNING_RATE, loss=2, optimizer=1, on_epoch=on_epoch)

    if runtime == "calls":
        return _calls(name, path, x, y, batch, epochs)
    if runtime == "paired":  # blocks of epochs, the library's and onert's in turn
        epoch = _onert_epochs(path, x, y, batch)
        first = library_fit(lambda i, h: None)  # compiled; its epochs as `library` times
        ours, theirs, ratios = first.history.ms_per_step[1:], [], []
        for block in range(PAIRED_BLOCKS):
            if block:
                ours += fit(first.model, x, y, trainer=first.trainer, epochs=epochs + 1,
                            on_epoch=lambda i, h: None).history.ms_per_step[1:]
            theirs += [epoch() for _ in range(epochs + (not block))][not block:]
            ratios.append(statistics.median(theirs[-epochs:]) / statistics.median(ours[-epochs:]))
        return {"runtime": runtime, "model": name, "batch": batch,
                "steps": first.history.steps[0], "ms_per_step": statistics.median(ours),
                "onert_ms_per_step": statistics.median(theirs), "ratios": ratios,
                "loss": first.history.loss, "onert_first_loss": epoch.first_loss}
    if notebook:  # one fit, timed between its on_epoch callbacks (epochs after the first)
        t = time.perf_counter()
        r = library_fit(lambda i, h: None)
        total = time.perf_counter() - t
        h = r.history
        ms, prepare, losses, steps = h.ms_per_step[1:], h.compile_ms, h.loss, h.steps[0]
        extra["first_step_loss"] = float("nan")
        peak = _rss_mib()
    elif runtime == "circle-jax":
        from circle_jax.lowering import LoweringOptions

        model = cj.load(path, lowering=None if lowering == "auto" else
                        LoweringOptions(force=lowering))
        t = time.perf_counter()
        r = fit(model, x, y, epochs=epochs, batch_size=batch,
                learning_rate=LEARNING_RATE, loss=2, optimizer=1)
        total = time.perf_counter() - t
        h = r.history
        prepare, losses, steps = h.compile_ms, h.loss, h.steps[0]
        # Timed again with the compiled epochs kept (the first run also paid first-execution
        # costs): fused, as fit runs them without callbacks, and epoch by epoch (on_epoch).
        # (fused: the first epoch alone, then the rest in calls of about half a second)
        ms = [statistics.fmean(fit(model, x, y, trainer=r.trainer, epochs=epochs)
                               .history.ms_per_step) for _ in range(FUSED_REPEATS)]
        looped = fit(model, x, y, trainer=r.trainer, epochs=epochs, on_epoch=lambda i, h: None)
        extra["per_epoch_loop_ms"] = statistics.median(looped.history.ms_per_step[1:])
        peak = _rss_mib()
        out = model.apply(model.params, x[:batch])[0]  # untrained weights: step 1's loss
        extra["first_step_loss"] = float(r.trainer.loss_fn(out, y[:batch]))
        extra["step_flops"] = _step_flops(r, x[:batch], y[:batch])
    else:
        t = time.perf_counter()
        run = onert_fit(path, x, y, epochs=epochs, batch_size=batch,
                        learning_rate=LEARNING_RATE, loss=2, optimizer=1)
        total = time.perf_counter() - t
        steps = len(run.step_loss[0])
        ms, prepare, losses = [e / steps for e in run.epoch_ms], run.prepare_ms, run.loss
        extra["train_only_ms"] = statistics.median(run.step_ms)
        extra["first_step_loss"] = run.step_loss[0][0]
        peak = _rss_mib()
    return {**extra, "runtime": runtime, "model": name, "batch": batch, "steps": steps,
            "ms_per_step": statistics.median(ms), "epoch_ms_per_step": ms,
            "prepare_ms": prepare, "total_s": total, "loss": losses,
            "rss_after_import_mib": base, "rss_peak_mib": peak,
            "finite": bool(np.all(np.isfinite(losses)))}


#: how many blocks of epochs of each runtime ``paired`` runs in turn
PAIRED_BLOCKS = 5
#: how many rounds of whole calls ``calls`` times, the runtimes in turn
CALL_ROUNDS = 9


def _calls(name: str, path: str, x, y, batch: int, epochs: int) -> dict:
    """The ``calls`` runtime (see the module docstring): whole ``fit`` calls and onert's
    whole ``TrainSession.train`` calls in turns, in ms."""
    import contextlib
    import io

    import jax
    import numpy as np
    from onert.experimental.train import DataLoader, losses, optimizer, session

    import circle_jax as cj
    from circle_jax.train import fit

    model = cj.load(path)
    first = fit(model, x, y, epochs=epochs, batch_size=batch, learning_rate=LEARNING_RATE,
                loss=2, optimizer=1)
    trainer = first.trainer
    xd, yd = jax.device_put((x, y))
    fit(model, xd, yd, trainer=trainer, epochs=epochs)  # untimed: these arrays' first call
    sess = session(path)
    loader = DataLoader([np.ascontiguousarray(x, np.float32)],
                        [np.ascontiguousarray(y, np.float32)], batch)
    quiet = io.StringIO()  # onert prints a line an epoch
    with contextlib.redirect_stdout(quiet):
        sess.compile(optimizer=optimizer.SGD(LEARNING_RATE),
                     loss=losses.CategoricalCrossentropy(), batch_size=batch)
        sess.train(loader, epochs=epochs)  # its first call, untimed

    def ms(call) -> float:
        t = time.perf_counter()
        call()
        return (time.perf_counter() - t) * 1000

    device, host, fixed, theirs = [], [], [], []
    for _ in range(CALL_ROUNDS):
        device.append(ms(lambda: fit(model, xd, yd, trainer=trainer, epochs=epochs)))
        host.append(ms(lambda: fit(model, x, y, trainer=trainer, epochs=epochs)))
        fixed.append(ms(lambda: fit(model, xd, yd, trainer=trainer, epochs=0)))
        quiet.seek(0)
        quiet.truncate()
        with contextlib.redirect_stdout(quiet):
            theirs.append(ms(lambda: sess.train(loader, epochs=epochs)))
    steps = len(y) // batch
    return {"runtime": "calls", "model": name, "batch": batch, "epochs": epochs,
            "steps": steps, "fit_device_ms": device, "fit_host_ms": host,
            "fit_zero_epochs_ms": fixed, "onert_train_ms": theirs,
            "ms_per_step": statistics.median(device) / (epochs * steps),
            "onert_ms_per_step": statistics.median(theirs) / (epochs * steps),
            "loss": first.history.loss}


def _calls_table(results: list[dict]) -> str:
    """The ``calls`` runs: median ms of each kind of whole call, the ratios of medians and
    the range of the per-round ratios (onert / fit on device arrays)."""
    rows = ["| model | batch | epochs | fit, device arrays (ms) | fit, numpy (ms) | "
            "fit, 0 epochs (ms) | onert train() (ms) | speed-up (per-round range) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        med = {k: statistics.median(r[k]) for k in
               ("fit_device_ms", "fit_host_ms", "fit_zero_epochs_ms", "onert_train_ms")}
        ratios = [o / d for o, d in zip(r["onert_train_ms"], r["fit_device_ms"])]
        rows.append(f"| {r['model']} | {r['batch']} | {r['epochs']} | "
                    f"{med['fit_device_ms']:.2f} | {med['fit_host_ms']:.2f} | "
                    f"{med['fit_zero_epochs_ms']:.3f} | {med['onert_train_ms']:.2f} | "
                    f"{med['onert_train_ms'] / med['fit_device_ms']:.2f}x "
                    f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join(rows)


def _onert_epochs(path: str, x, y, batch: int):
    """``epoch()``: one more onert epoch (tests/onert_peer.py) on one session, returning its
    ms/step; ``epoch.first_loss`` is its first epoch's loss."""
    import numpy as np

    from tests.onert_peer import io_dtypes, open_session, train_epoch

    session = open_session(path, batch_size=batch, learning_rate=LEARNING_RATE, loss=2,
                           reduction=1, optimizer=1, trainable_ops=-1)
    in_dt, out_dt = io_dtypes(session)
    xs, ys = [np.ascontiguousarray(x, in_dt[0])], [np.ascontiguousarray(y, out_dt[0])]
    steps = len(y) // batch

    def epoch() -> float:
        t = time.perf_counter()
        losses, _ = train_epoch(session, xs, ys, batch, steps)
        if not hasattr(epoch, "first_loss"):
            epoch.first_loss = float(np.mean(losses))
        return (time.perf_counter() - t) * 1000 / steps

    return epoch


def _paired_table(results: list[dict]) -> str:
    """The ``paired`` runs: medians over rounds of each runtime's ms/step, and the median
    and range of every per-block ratio of every round."""
    rows = ["| model | batch | onert ms/step | library ms/step | speed-up (per-block range) | "
            "epoch-1 loss onert / circle-jax |", "|---|---|---|---|---|---|"]
    grouped: dict[tuple, list[dict]] = {}
    for r in results:
        if r["runtime"] == "paired":
            grouped.setdefault((r["model"], r["batch"]), []).append(r)
    for (name, batch), runs in grouped.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            rows.append(f"| {name} | {batch} | | | {runs[0]['error']} | |")
            continue
        ratios = [q for r in ok for q in r["ratios"]]
        rows.append(f"| {name} | {batch} | "
                    f"{statistics.median(r['onert_ms_per_step'] for r in ok):.3f} | "
                    f"{statistics.median(r['ms_per_step'] for r in ok):.3f} | "
                    f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f}) | "
                    f"{ok[0]['onert_first_loss']:.4f} / {ok[0]['loss'][0]:.4f} |")
    return "\n".join(rows)


def _step_flops(result, x, y) -> float | None:
    """XLA's FLOP count of one compiled training step on one batch (cost analysis)."""
    import jax

    trainer = result.trainer
    state, frozen = trainer.init()
    try:
        cost = jax.jit(trainer.train_step).lower(state, frozen, ((x,), y)).compile()
        analysis = cost.cost_analysis()
        if isinstance(analysis, list):  # older JAX: one dict per computation
            analysis = analysis[0]
        return float(analysis.get("flops", 0.0)) or None
    except Exception:  # a backend without cost analysis
        return None


def matmul_peak_gflops(size: int = 1024, repeats: int = 20) -> float:
    """The measured float32 matmul rate of this machine through XLA (GFLOP/s): the best of
    ``repeats`` timed [size, size] x [size, size] products, 2 size^3 FLOPs each."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), jnp.float32)
    f = jax.jit(lambda m: m @ m)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best / 1e9


def _run_worker(runtime: str, name: str, batch: int, epochs: int, files: tuple,
                lowering: str, dispatch: str, host_memory: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", runtime, name, str(batch),
           str(epochs), *files, lowering, dispatch, host_memory]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        err = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"runtime": runtime, "model": name, "batch": batch, "error": err}
    return json.loads(lines[-1])


def _merge_rounds(runs: list[dict]) -> dict:
    """One runtime's rounds of one (model, batch): medians of the timings, the first round's
    losses (the same in every round: same data, same seed), the largest peak RSS."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    merged = dict(ok[0])
    for key in ("ms_per_step", "train_only_ms", "prepare_ms", "per_epoch_loop_ms"):
        if key in merged:
            merged[key] = statistics.median(r[key] for r in ok)
    merged["rss_peak_mib"] = max(r["rss_peak_mib"] for r in ok)
    merged["rounds"] = [r["ms_per_step"] for r in ok]
    return merged


def _speedup(o: dict, c: dict) -> str:
    """Ratio of the median ms/step; with several rounds, the range of the per-round ratios."""
    text = f"{o['ms_per_step'] / c['ms_per_step']:.1f}x"
    ratios = [a / b for a, b in zip(o["rounds"], c["rounds"])]
    if len(ratios) > 1:
        text += f" ({min(ratios):.1f}-{max(ratios):.1f})"
    return text


def _of_peak(r: dict, peak_gflops: float | None) -> str:
    if not (peak_gflops and r.get("step_flops")):
        return ""
    return f"{r['step_flops'] / (r['ms_per_step'] * 1e-3) / (peak_gflops * 1e9) * 100:.1f}"


def _table(results: list[dict], peak_gflops: float | None = None) -> str:
    """The Markdown table; ``peak_gflops`` (the measured matmul rate) adds the step's FLOP
    count and the fraction of that rate circle-jax's step reaches."""
    rows = ["| model | batch | steps/epoch | onert ms/step | (onert `train()` only) | "
            "circle-jax ms/step | (epoch by epoch) | speed-up | library ms/step | "
            "library speed-up | step MFLOP | "
            "circle-jax % of matmul peak | "
            "onert peak RSS MiB (delta) | circle-jax peak RSS "
            "MiB (delta) | circle-jax compile s | step-1 loss onert / circle-jax | epoch-1 "
            "loss onert / circle-jax |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    grouped: dict[tuple, list[dict]] = {}
    for r in results:
        grouped.setdefault((r["model"], r["batch"], r["runtime"]), []).append(r)
    by = {key: _merge_rounds(runs) for key, runs in grouped.items()}

    def cell(r: dict | None, fmt) -> str:
        return "" if not r or "error" in r else fmt(r)

    def rss(r: dict) -> str:
        return f"{r['rss_peak_mib']:.0f} ({r['rss_peak_mib'] - r['rss_after_import_mib']:+.0f})"

    for name in dict.fromkeys(r["model"] for r in results):
        for batch in sorted({r["batch"] for r in results if r["model"] == name}):
            o, c = by.get((name, batch, "onert")), by.get((name, batch, "circle-jax"))
            lib = by.get((name, batch, "library"))
            errs = "; ".join(f"{r['runtime']}: {r['error']}" for r in (o, c, lib)
                             if r and "error" in r)
            both = bool(o and c and not errs)
            steps = cell(c, lambda r: str(r["steps"])) or cell(o, lambda r: str(r["steps"]))
            rows.append(" | ".join([
                f"| {name}", str(batch), steps,
                cell(o, lambda r: f"{r['ms_per_step']:.3f}"),
                cell(o, lambda r: f"({r['train_only_ms']:.3f})"),
                cell(c, lambda r: f"{r['ms_per_step']:.3f}"),
                cell(c, lambda r: f"({r['per_epoch_loop_ms']:.3f})"),
                _speedup(o, c) if both else "",
                cell(lib, lambda r: f"{r['ms_per_step']:.3f}"),
                _speedup(o, lib) if o and lib and "error" not in o and "error" not in lib
                else "",
                cell(c, lambda r: f"{r['step_flops'] / 1e6:.2f}" if r.get("step_flops") else ""),
                cell(c, lambda r: _of_peak(r, peak_gflops)),
                cell(o, rss), cell(c, rss),
                cell(c, lambda r: f"{r['prepare_ms'] / 1000:.1f}"),
                " / ".join([cell(o, lambda r: f"{r['first_step_loss']:.4f}"),
                            cell(c, lambda r: f"{r['first_step_loss']:.4f}")]),
                " / ".join([cell(o, lambda r: f"{r['loss'][0]:.4f}"),
                            cell(c, lambda r: f"{r['loss'][0]:.4f}")])
                + (f" {errs}" if errs else ""),
            ]) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        runtime, name, batch, epochs = argv[1:5]
        print(json.dumps(worker(runtime, name, int(batch), int(epochs), argv[5:8], *argv[8:11])),
              flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="example,mnist,resnet8,mobilenet",
                    help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="also write the raw results here")
    ap.add_argument("--conv-lowering", default="auto", choices=["auto", "xla", "im2col"],
                    help="force circle-jax's convolution lowering (circle_jax.lowering."
                         "LoweringOptions(force=...)); auto: its own per-shape choice")
    ap.add_argument("--dispatch", default="inline", choices=["inline", "async"],
                    help="how circle-jax's process runs CPU programs: inline, on the calling "
                         "thread, as the command line does (circle_jax.inline_cpu_dispatch), "
                         "or JAX's default asynchronous dispatch")
    ap.add_argument("--host-memory", default="retain", choices=["retain", "default"],
                    help="circle-jax's process keeps freed host memory for the next call, as "
                         "the command line does (circle_jax.retain_host_memory), or leaves "
                         "glibc's malloc as it is")
    ap.add_argument("--runtimes", default="onert,circle-jax,library",
                    help="onert; circle-jax (with the command line's process settings); "
                         "library (fit with on_epoch in a process without them); paired "
                         "(the library and onert in one process, epoch for epoch); calls "
                         "(whole fit calls and onert's whole train calls, in turns)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every (model, batch) this many times, the runtimes "
                         "alternating; the table shows medians and the per-round ratios' range")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            files = prepare(name, tmp)
            for batch, _, runtime in itertools.product(
                    (int(b) for b in args.batches.split(",")), range(args.rounds),
                    args.runtimes.split(",")):
                r = _run_worker(runtime, name, batch, args.epochs, files, args.conv_lowering,
                                args.dispatch, args.host_memory)
                results.append(r)
                print(f"# {name} b{batch} {runtime}: "
                      + (r["error"] if "error" in r else f"{r['ms_per_step']:.3f} ms/step"
                         + (f", peak {r['rss_peak_mib']:.0f} MiB" if "rss_peak_mib" in r
                            else f", onert {r['onert_ms_per_step']:.3f}")),
                      file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    from machine import describe

    print(f"- machine: {describe()}")
    for name in names:
        print(f"- {name}: {MODELS[name][2]}, {MODELS[name][1]} samples")
    peak = matmul_peak_gflops() if "circle-jax" in args.runtimes.split(",") else None
    if peak:
        print(f"- float32 matmul peak through XLA on this machine: {peak:.1f} GFLOP/s "
              "(1024x1024 products, best of 20)")
    runtimes = args.runtimes.split(",")
    if set(runtimes) - {"paired", "calls"}:
        print()
        print(_table([r for r in results if r["runtime"] not in ("paired", "calls")], peak))
    if "calls" in runtimes:
        print()
        print(_calls_table([r for r in results if r["runtime"] == "calls"]))
    if "paired" in runtimes:
        print()
        print(_paired_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
