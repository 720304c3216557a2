"""The notebooks run top to bottom (executed in a fresh kernel), every plotting cell shows its
figure, and the committed files hold their outputs (figures included)."""

from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.paths import NOTEBOOKS


def _figures(cell: dict) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def _plot_cells(nb: nbformat.NotebookNode) -> list[dict]:
    return [c for c in nb.cells if c.cell_type == "code" and "plt.show()" in c.source]


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb")))
def test_notebook_sets_inline_dispatch_first(name: str) -> None:
    """As docs/training.md tells notebooks: ``inline_cpu_dispatch()`` in the first code cell,
    after the imports and before anything computes."""
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code").source.splitlines()
    call = next(i for i, line in enumerate(first) if line.startswith("cj.inline_cpu_dispatch()"))
    assert all(line.startswith(("import ", "from ", "    ")) or not line.strip()
               for line in first[:call]), first[:call]


@pytest.mark.slow  # a kernel per notebook, 15-25 s each on 2 cores
@pytest.mark.parametrize("name", sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb")))
def test_notebook_executes_and_shows_its_plots(name: str) -> None:
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    committed = _plot_cells(nb)
    assert committed, f"{name} plots nothing"
    assert all(_figures(c) for c in committed), f"{name} is committed without its figures"
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": NOTEBOOKS}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert all(_figures(c) == 1 for c in _plot_cells(nb))
