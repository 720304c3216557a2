"""Writes the notebooks from the cells below, executed, with their outputs (run: python
notebooks/make_notebooks.py).

Keeping the source here makes notebook diffs reviewable; the test suite executes the
generated .ipynb files again and checks that every plotting cell shows its figure.
"""

from __future__ import annotations

import hashlib
import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

QUICKSTART = [
    new_markdown_cell("# circle-jax quickstart\nLoad a Circle model, inspect it, train it, "
                      "plot the loss, evaluate and export it."),
    new_code_cell("""import matplotlib.pyplot as plt
import numpy as np
import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.train import fit

cj.inline_cpu_dispatch()  # before the first JAX computation: small steps run on this thread"""),
    new_markdown_cell("## Load\nThe bundled example is a small branching CNN written with "
                      "circle-jax's own builder; any `.circle` or `.tflite` path works the same."),
    new_code_cell("""model = cj.load(branching_cnn().to_bytes("circle"))
print(model.summary())"""),
    new_code_cell("""x, y = digits()
probs = model.apply(model.params, x[:4])[0]
probs.shape, float(probs.sum(axis=-1)[0])"""),
    new_markdown_cell("## Train\nOne compiled `lax.scan` per epoch; the last 20% of the data "
                      "validates (onert's convention)."),
    new_code_cell("""result = fit(model, x, y, epochs=10, batch_size=32, loss="cce",
             optimizer="adam", learning_rate=0.01, validation_split=0.2)
h = result.history
print(f"final loss {h.loss[-1]:.4f}, held-out accuracy {h.val_accuracy[-1]:.4f}")
assert h.loss[-1] < h.loss[0]"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(range(1, len(h.loss) + 1), h.loss, label="train loss")
ax.plot(range(1, len(h.val_loss) + 1), h.val_loss, label="validation loss")
ax.set_xlabel("epoch")
ax.set_yscale("log")
ax.legend()
fig.tight_layout()
plt.show()"""),
    new_markdown_cell("## Evaluate and export"),
    new_code_cell("""n_val = int(len(y) * 0.2)
loss, acc = result.trainer.evaluate(result.params, x[-n_val:], y[-n_val:])
print(f"held-out loss {loss:.4f}, accuracy {acc:.4f}")
data = model.export(result.params, "circle")
again = cj.load(data)
np.testing.assert_array_equal(again.apply(again.params, x[:8])[0],
                              model.apply(result.params, x[:8])[0])
len(data)"""),
    new_markdown_cell("## Checkpoint and resume\nAn onert checkpoint holds the weights, Adam's "
                      "moments and the step count; resuming continues exactly where the "
                      "run stopped (`circle-jax train --export_checkpoint` / `--checkpoint` "
                      "do the same from the shell)."),
    new_code_cell("""import os
import tempfile

from circle_jax import checkpoints

path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
trainer = result.trainer
checkpoints.save_checkpoint(path, model, trainer, result.state, epoch=len(h.loss))
state, frozen = checkpoints.load_checkpoint(path, model, trainer)
resumed = fit(model, x, y, trainer.config, params=trainer.merge(state, frozen), state=state,
              epochs=2)
print("resumed at update", int(state.opt_state.count), "->",
      [round(v, 4) for v in resumed.history.loss])"""),
]


PRECISION = [
    new_markdown_cell(
        "# Precision and gradient accumulation\n"
        "Train the bundled example in float32, float16 (with dynamic loss scaling) and "
        "bfloat16; watch the dynamic loss scale recover from a forced overflow; check that "
        "gradient accumulation gives the weights of the big batch. Small data slices and few "
        "epochs keep this quick: most of the time is XLA compiling each configuration."),
    new_code_cell("""import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.optim import DynamicLossScale
from circle_jax.train import fit

cj.inline_cpu_dispatch()  # before the first JAX computation: small steps run on this thread
model = cj.load(branching_cnn().to_bytes("circle"))
x, y = digits()
x_tr, y_tr = x[:768], y[:768]  # 24 batches of 32"""),
    new_markdown_cell(
        "## Three precisions\n"
        "A precision policy names four dtypes: params (stored weights), compute (forward and "
        "backward), grads and output (what the loss sees). Both half policies below keep the "
        "weights, gradients, optimizer state and loss in float32; only the forward and "
        "backward passes run in half precision.\n\n"
        "- `\"p=f32,c=f16,o=f32\"`: float16 compute. Float16's range is narrow (largest "
        "65504, smallest normal 6e-5), so small gradients underflow: the loss is multiplied "
        "by a loss scale before differentiating and the gradients divided by it after; "
        "`\"dynamic\"` halves the scale on overflow (skipping that step) and doubles it "
        "after 2000 finite steps.\n"
        "- `\"mixed_bfloat16\"`: bfloat16 compute. Bfloat16 has float32's exponent range, "
        "so no loss scaling is needed (only fewer mantissa bits)."),
    new_code_cell("""COMMON = dict(epochs=6, batch_size=32, loss="cce", optimizer="adam",
              learning_rate=0.01)
RUNS = {
    "float32": {},
    "float16 + dynamic loss scale": dict(precision="p=f32,c=f16,o=f32", loss_scale="dynamic"),
    "bfloat16 (mixed_bfloat16)": dict(precision="mixed_bfloat16"),
}
results = {name: fit(model, x_tr, y_tr, **COMMON, **kw) for name, kw in RUNS.items()}
for name, r in results.items():
    h = r.history
    print(f"{name:29s} policy {str(r.trainer.policy):22s} loss {h.loss[0]:.3f} -> "
          f"{h.loss[-1]:.4f}  train accuracy {h.accuracy[-1]:.3f}  skipped steps "
          f"{sum(h.skipped)}  final loss scale {h.loss_scale[-1]:g}")
    assert all(np.isfinite(h.loss)) and h.loss[-1] < 0.5 * h.loss[0]"""),
    new_markdown_cell(
        "The float32 and bfloat16 curves nearly coincide (bfloat16 keeps float32's exponent "
        "range): distinct line styles and markers keep both visible."),
    new_code_cell("""fig, ax = plt.subplots(figsize=(5.5, 3.2))
STYLES = [dict(linestyle="-", marker="o", markersize=8, linewidth=2.5),
          dict(linestyle="--", marker="s", markersize=5),
          dict(linestyle=":", marker="^", markersize=6, markerfacecolor="none", linewidth=2)]
for (name, r), style in zip(results.items(), STYLES):
    ax.plot(range(1, COMMON["epochs"] + 1), r.history.loss, label=name, **style)
ax.set_xlabel("epoch")
ax.set_ylabel("training loss (mean over the epoch)")
ax.set_yscale("log")
ax.legend()
fig.tight_layout()
plt.show()"""),
    new_markdown_cell(
        "## The loss scale under a forced overflow\n"
        "Start the float16 run at a loss scale of 2**40: the scaled gradients overflow "
        "float16 to inf, so each step is skipped (weights and optimizer state kept) and the "
        "scale halves, until the gradients fit. `Trainer.run_epoch` returns per-step "
        "`StepMetrics`; `scale` is the loss scale each step used and `skipped` marks the "
        "skipped ones.\n\n"
        "The loss scale is training state (an array leaf of `TrainState`), not a compile-time "
        "constant: the float16 trainer above runs this with its already-compiled epoch.\n\n"
        "Where the scale settles depends on the model: here the loss is cross-entropy on "
        "softmax probabilities, whose gradient -y/p is large where the true class gets a "
        "small probability, so even the default 2**15 overflowed for the first steps of the "
        "float16 run above."),
    new_code_cell("""trainer = results["float16 + dynamic loss scale"].trainer
state, frozen = trainer.init()
state = state._replace(loss_scale=DynamicLossScale(2.0**40))
X, Y = (jnp.asarray(x_tr),), jnp.asarray(y_tr)
scales, skipped = [], []
for epoch in range(2):
    state, m = trainer.run_epoch(state, frozen, X, Y, epoch)
    scales.append(np.asarray(m.scale))
    skipped.append(np.asarray(m.skipped))
scales, skipped = np.concatenate(scales), np.concatenate(skipped)
n_skip = int(skipped.sum())
print(f"{len(scales)} steps, {n_skip} skipped; scale 2**{np.log2(scales[0]):.0f} -> "
      f"2**{np.log2(scales[-1]):.0f}")
assert skipped[:n_skip].all() and not skipped[n_skip:].any()  # all skips come first
np.testing.assert_array_equal(scales[1:n_skip + 1], scales[:n_skip] / 2)  # halved per skip
assert np.all(scales[n_skip:] == scales[n_skip])  # then steady (growth after 2000 steps)"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(5.5, 3.2))
steps = np.arange(1, len(scales) + 1)
ax.step(steps, scales, where="post", label="loss scale used")
ax.plot(steps[skipped == 1], scales[skipped == 1], "rx", label="skipped (overflow)")
ax.set_yscale("log", base=2)
ax.set_xlabel("step")
ax.set_ylabel("loss scale")
ax.legend()
fig.tight_layout()
plt.show()"""),
    new_markdown_cell(
        "## Gradient accumulation\n"
        "`accumulate=k` makes one optimizer update from k micro-batches. "
        "`accumulate_mode=\"stream\"`: each step is one micro-batch of `batch_size`; the "
        "optimizer updates on every k-th step. `\"in_step\"`: each step's batch of "
        "`batch_size` is split into k micro-batches inside the compiled step (a `lax.scan`). "
        "Either way 4 micro-batches of 8 must give the weights of batches of 32 (the loss is "
        "a mean over the batch, so the gradients are averaged), up to float32 rounding: the "
        "sums run in a different order, and Adam's first steps, which divide by the "
        "gradient's magnitude, amplify that difference a little."),
    new_code_cell("""ACC = dict(epochs=2, loss="cce", optimizer="adam", learning_rate=0.01)
x_acc, y_acc = x[:256], y[:256]
big = fit(model, x_acc, y_acc, batch_size=32, **ACC).params
accumulated = {
    "stream, 4 x 8": fit(model, x_acc, y_acc, batch_size=8, accumulate=4,
                         accumulate_mode="stream", **ACC).params,
    "in_step, 32 = 4 x 8": fit(model, x_acc, y_acc, batch_size=32, accumulate=4,
                               accumulate_mode="in_step", **ACC).params,
}
moved = max(float(np.max(np.abs(np.asarray(big[k]) - np.asarray(model.params[k])))) for k in big)
print(f"largest weight change from training: {moved:.3g}")
for name, p in accumulated.items():
    diff = max(float(np.max(np.abs(np.asarray(p[k]) - np.asarray(big[k])))) for k in big)
    print(f"{name:20s} max |w - w_batch32| = {diff:.3g}")
    assert diff < 1e-6"""),
]


ORACLE = [
    new_markdown_cell(
        "# circle-jax as a reference oracle\n"
        "For the engineer of another runtime: golden tensors of a real converted model "
        "(TF's converter made `branching_cnn.tflite`; its three convolutions share one "
        "deduplicated bias), forward and backward, in the HDF5 layout ONE's tools read; then "
        "onert's training compared with circle-jax's step by step."),
    new_code_cell("""import os
import tempfile

import h5py
import matplotlib.pyplot as plt
import numpy as np
import circle_jax as cj
from circle_jax.oracle import golden, write_golden
from circle_jax.oracle.compare import compare_with_onert

cj.inline_cpu_dispatch()  # before the first JAX computation: small steps run on this thread
MODEL = os.path.join("..", "tests", "data", "keras", "branching_cnn.tflite")
with np.load(os.path.join("..", "tests", "data", "keras", "data.npz")) as d:
    x, y = d["branching_cnn/x"], d["branching_cnn/y"]
model = cj.load(MODEL, lowering="reference")
print(model)"""),
    new_markdown_cell(
        "## Golden tensors\n"
        "`golden` runs one batch: every tensor forward, and with targets the loss, "
        "dLoss/dTensor for every float tensor and the weights after one optimizer step "
        "(`circle-jax golden MODEL --input X --expected Y -o DIR` from the shell)."),
    new_code_cell("""g = golden(model, [x[:4]], y[:4], cj.TrainConfig(loss="cce", optimizer="sgd",
                                                  learning_rate=0.1), dtype="float64")
out = tempfile.mkdtemp()
for path in write_golden(g, out):
    print(os.path.basename(path))
with h5py.File(os.path.join(out, "gradients.h5")) as f:
    print("loss", f.attrs["loss"])
    for key in list(f["value"])[:5]:
        print(f"  {key:>3} {f['name'].attrs[key][:40]:40} {f['value'][key].shape}")"""),
    new_markdown_cell(
        "## onert step by step\n"
        "Both runtimes train from the file's weights on the same batches; onert's weights are "
        "read back after every step. The onert profile (the default) trains one copy of the "
        "shared bias per convolution, as onert does: they agree. Trained as one tied weight "
        "(`tie_shared_weights=True`), the first step already differs, and the comparison "
        "names the tensor and the operator whose copy onert's value equals."),
    new_code_cell("""cfg = cj.TrainConfig(batch_size=8, learning_rate=0.05, loss="cce",
                     optimizer="sgd")
untied = compare_with_onert(MODEL, [x], y, cfg, steps=8, arbiter=True)
tied = compare_with_onert(MODEL, [x], y, cfg, steps=8, tie_shared_weights=True)
print(untied.table())
print()
print(tied.table())
assert untied.agree and not tied.agree
assert tied.first_divergence["tensor"] == "arith.constant1"
"""),
    new_code_cell("""fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for ax, (title, r) in zip(axes, [("untied (default)", untied), ("tied", tied)]):
    steps = [s["step"] for s in r.steps]
    ax.plot(steps, [s["loss"]["circle-jax"] for s in r.steps], "o-", label="circle-jax")
    ax.plot(steps, [s["loss"]["onert"] for s in r.steps], "x--", label="onert")
    ax.set_title(f"per-step loss, {title}")
    ax.set_xlabel("step")
    ax.legend()
fig.tight_layout()
plt.show()"""),
    new_code_cell("""names = list(tied.tensors)
diff = np.array([[tied.tensors[n][str(s)] for s in range(1, 9)] for n in names])
fig, ax = plt.subplots(figsize=(9, 2.8), layout="constrained")  # room for the whole names
im = ax.imshow(np.log10(diff + 1e-12), aspect="auto", cmap="magma")
ax.set_yticks(range(len(names)), names, fontsize=8)
ax.set_xticks(range(8), range(1, 9))
ax.set_xlabel("step")
ax.set_title("tied: log10 max |w_circle-jax - w_onert| per tensor")
fig.colorbar(im)
plt.show()"""),
]


PERSONALIZE = [
    new_markdown_cell(
        "# Personalizing MobileNet: a new head, then LoRA\n"
        "MobileNet v1 0.25/128 (ImageNet, 1001 classes) taken to 5 classes of synthetic "
        "images: first a fresh classifier head alone trains, then rank-4 LoRA adapters on the "
        "last two pointwise convolutions train with it (the base weights frozen). The merged "
        "export runs in LiteRT with 5 outputs."),
    new_code_cell("""import os

import jax
import matplotlib.pyplot as plt
import numpy as np
from ai_edge_litert.interpreter import Interpreter
import circle_jax as cj

cj.inline_cpu_dispatch()  # before the first JAX computation: small steps run on this thread
MODEL = os.path.join("..", "..", "shared", "models", "mobilenet_v1_0.25_128_float.tflite")
rng = np.random.default_rng(0)
tints = rng.uniform(-0.6, 0.6, (5, 1, 1, 3)).astype(np.float32)  # one colour cast per class
labels = rng.integers(0, 5, 80)
x = (rng.uniform(-1, 1, (80, 128, 128, 3)) * 0.5 + tints[labels]).astype(np.float32)
y = np.eye(5, dtype=np.float32)[labels]
train, test = slice(0, 64), slice(64, 80)"""),
    new_markdown_cell("## A new head\n`new_head=5` replaces the 1x1 convolution, RESHAPE and "
                      "SOFTMAX of the logits by a 5-way FULLY_CONNECTED (Glorot-uniform, "
                      "seeded) and the SOFTMAX; only the head trains."),
    new_code_cell("""head = cj.load(MODEL, new_head=5, seed=0)
print(head.passes[-1].describe())
cfg = dict(batch_size=16, loss="cce", optimizer="adam", learning_rate=0.01, epochs=4,
           validation_split=0.2)
r_head = cj.fit(head, x[train], y[train], **cfg)
print(sorted(r_head.trainer.trainable), r_head.history.loss)"""),
    new_markdown_cell("## LoRA beside the new head\nRank-4 adapters (A Kaiming-uniform, B "
                      "zero: the first step's loss is the base model's) on two convolutions; "
                      "the adapters and the head train."),
    new_code_cell("""lora = cj.load(MODEL, new_head=5, seed=0, lora=4,
               lora_targets="op24.weight,op26.weight")
print(sorted(lora.adapters.items()))
r_lora = cj.fit(lora, x[train], y[train], **cfg)
n = {name: sum(int(np.prod(r.params[k].shape)) for k in r.trainer.trainable)
     for name, r in (("head", r_head), ("head + LoRA", r_lora))}
print("trainable weights", n)"""),
    new_code_cell("""fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for name, r in (("head", r_head), ("head + LoRA", r_lora)):
    h = r.history
    epochs = range(1, len(h.loss) + 1)
    axes[0].plot(epochs, h.loss, "o-", label=name)
    axes[1].plot(epochs, h.val_accuracy, "o-", label=name)
axes[0].set_title("training loss")
axes[1].set_title("validation accuracy")
for ax in axes:
    ax.set_xlabel("epoch")
    ax.legend()
fig.tight_layout()
plt.show()"""),
    new_markdown_cell("## Export, checked in LiteRT\nThe adapters are merged into the "
                      "convolutions' weights (`W + (alpha/R) B A`): the original graph with "
                      "5 outputs."),
    new_code_cell("""data = lora.export(r_lora.params, "tflite")
interp = Interpreter(model_content=data)
inp = interp.get_input_details()[0]["index"]
interp.resize_tensor_input(inp, (16, 128, 128, 3))
interp.allocate_tensors()
interp.set_tensor(inp, x[test])
interp.invoke()
litert = interp.get_tensor(interp.get_output_details()[0]["index"])
ours = np.asarray(jax.jit(lora.apply)(r_lora.params, x[test])[0])
print("LiteRT output", litert.shape, "max |LiteRT - circle-jax|", np.abs(litert - ours).max())
np.testing.assert_allclose(litert, ours, rtol=1e-4, atol=1e-5)
print("test accuracy", float(np.mean(litert.argmax(-1) == labels[test])))"""),
]


NOTEBOOKS = {"quickstart.ipynb": QUICKSTART, "precision_and_accumulation.ipynb": PRECISION,
             "oracle.ipynb": ORACLE, "personalize.ipynb": PERSONALIZE}


def _stable_ids(name: str, cells: list) -> list:
    """Cell ids from the notebook name and cell source (nbformat's are random), so that
    regenerating an unchanged notebook gives an identical file."""
    seen: set[str] = set()
    for cell in cells:
        digest = hashlib.sha1(f"{name}\0{cell.source}".encode()).hexdigest()
        cid, n = digest[:8], 0
        while cid in seen:
            n += 1
            cid = f"{digest[:8]}-{n}"
        seen.add(cid)
        cell.id = cid
    return cells


def main(names: list[str]) -> None:
    """Write every notebook (or those ``names``), executed: committed with its outputs
    (figures included)."""
    from nbclient import NotebookClient

    for name, cells in NOTEBOOKS.items():
        if names and name not in names:
            continue
        nb = new_notebook(cells=_stable_ids(name, cells))
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": HERE}}).execute()
        nbformat.write(nb, os.path.join(HERE, name))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
