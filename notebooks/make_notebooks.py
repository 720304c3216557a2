"""Writes the notebooks from the cells below (run: python notebooks/make_notebooks.py).

Keeping the source here makes notebook diffs reviewable; the test suite executes the
generated .ipynb files.
"""

from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

QUICKSTART = [
    new_markdown_cell("# circle-jax quickstart\nLoad a Circle model, inspect it, train it, "
                      "plot the loss, evaluate and export it."),
    new_code_cell("""import jax, numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.train import fit, Trainer"""),
    new_markdown_cell("## Load\nThe bundled example is a small branching CNN written with "
                      "circle-jax's own builder; any `.circle` or `.tflite` path works the same."),
    new_code_cell("""model = cj.load(branching_cnn().to_bytes("circle"))
print(model.summary())"""),
    new_code_cell("""x, y = digits()
probs = model.apply(model.params, x[:4])[0]
probs.shape, float(probs.sum(axis=-1)[0])"""),
    new_markdown_cell("## Train\nOne compiled `lax.scan` per epoch; the last 20% of the data "
                      "validates (onert's convention)."),
    new_code_cell("""result = fit(model, x, y, epochs=10, batch_size=32, loss="cce", optimizer="adam",
             learning_rate=0.01, validation_split=0.2)
h = result.history
print(f"final loss {h.loss[-1]:.4f}, held-out accuracy {h.val_accuracy[-1]:.4f}")
assert h.loss[-1] < h.loss[0]"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(range(1, len(h.loss) + 1), h.loss, label="train loss")
ax.plot(range(1, len(h.val_loss) + 1), h.val_loss, label="validation loss")
ax.set_xlabel("epoch"); ax.set_yscale("log"); ax.legend()
fig.tight_layout()"""),
    new_markdown_cell("## Evaluate and export"),
    new_code_cell("""n_val = int(len(y) * 0.2)
loss, acc = result.trainer.evaluate(result.params, x[-n_val:], y[-n_val:])
print(f"held-out loss {loss:.4f}, accuracy {acc:.4f}")
data = model.export(result.params, "circle")
again = cj.load(data)
np.testing.assert_array_equal(again.apply(again.params, x[:8])[0],
                              model.apply(result.params, x[:8])[0])
len(data)"""),
]


def main() -> None:
    nb = new_notebook(cells=QUICKSTART)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, os.path.join(HERE, "quickstart.ipynb"))


if __name__ == "__main__":
    main()
