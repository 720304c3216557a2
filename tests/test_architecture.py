"""The package's layering, read from the source: one direction of imports, no cycles.

Every ``import`` statement of every module counts, those inside functions too (a lazy import
is still a dependency). A module's dependency on a package is a dependency on the package's
``__init__`` and on the module named, except for the root ``circle_jax`` package, whose
``__init__`` only re-exports lazily (tested below: importing it imports no layer).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

ROOT = Path(REPO_ROOT)
PACKAGE = ROOT / "circle_jax"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The circle_jax modules ``name`` imports (absolute or relative, at any depth)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t != "circle_jax":
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among modules (a package's ``__init__`` re-exporting its own
    submodules is not a cycle of the layering, so edges from a package into itself are
    ignored), or None."""
    def edges(m: str) -> set[str]:
        return {d for d in graph[m] if not d.startswith(m + ".")}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges(m)):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# The data path, bottom up: files (formats) -> IR (graph) -> passes -> lowering (ops,
# lowering, lower) -> training -> files. "circle_jax.graph" alone is the package (its
# __init__ imports nothing), not every module of it; ops.registry is the operator catalogue
# the params policy reads (which inputs must be static), a table with no lowering in it.
GRAPH_PACKAGE = {"circle_jax.graph"}
IR = {"circle_jax.graph", "circle_jax.graph.ir", "circle_jax.graph.quantization",
      "circle_jax.errors"}
GRAPH = {*IR, "circle_jax.graph.checks", "circle_jax.graph.params_policy",
         "circle_jax.graph.aliases", "circle_jax.graph.variables"}


@pytest.mark.parametrize("layer, allowed", [
    ("circle_jax.formats", {"circle_jax.formats", *IR}),
    ("circle_jax.graph", {*GRAPH, "circle_jax.ops.registry"}),
    ("circle_jax.passes", {"circle_jax.passes", *GRAPH, "circle_jax.formats.schema"}),
    ("circle_jax.ops", {"circle_jax.ops", *IR, "circle_jax.lowering"}),
    ("circle_jax.lowering", {"circle_jax.lowering", "circle_jax.ops", *IR}),
])
def test_lower_layers_import_nothing_above_them(layer: str, allowed: set[str]) -> None:
    def ok(d: str) -> bool:
        return any(d == a or (d.startswith(a + ".") and a not in GRAPH_PACKAGE)
                   for a in allowed)

    bad = {(m, d) for m, deps in _graph().items() if m == layer or m.startswith(layer + ".")
           for d in deps if not ok(d)}
    assert not bad, f"{layer} imports above itself: {sorted(bad)}"


def test_formats_and_the_package_root_do_not_import_jax() -> None:
    code = ("import sys, circle_jax, circle_jax.formats; "
            "assert 'jax' not in sys.modules, 'jax was imported'; "
            "circle_jax.formats.read_model; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_public_names_resolve() -> None:
    import circle_jax

    for name in circle_jax.__all__:
        assert getattr(circle_jax, name) is not None, name
    assert callable(circle_jax.load) and callable(circle_jax.fit)


def test_no_module_is_too_long() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
