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
MAX_ROOT_MODULES = 8


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


# The data path, bottom up: files (formats) -> IR (graph) -> passes -> lowering (ops, then
# lowering: the fast implementations and the interpreter) -> training -> files. What each
# layer may import besides itself: a module name, or "PACKAGE.*" for the package and every
# module of it. The graph layer imports nothing above it: the params policy and the
# interpreter both read the static-input positions from graph.params_policy.STATIC_INPUTS.
# QAT's export (passes.qat) rounds with the simulation's own functions, ops.fake_quant (which
# imports only the IR's quantization).
ERRORS = "circle_jax.errors"
LAYERS: dict[str, set[str]] = {
    "circle_jax.graph": {ERRORS},
    "circle_jax.formats": {ERRORS, "circle_jax.graph", "circle_jax.graph.ir"},
    "circle_jax.passes": {ERRORS, "circle_jax.graph.*", "circle_jax.formats.schema",
                          "circle_jax.ops.fake_quant"},
    # the Flex kernels decode TF's NodeDefs and run TF's Save/Restore on its checkpoints
    "circle_jax.ops": {ERRORS, "circle_jax.graph", "circle_jax.graph.ir",
                       "circle_jax.graph.quantization", "circle_jax.formats.tf_proto",
                       "circle_jax.formats.tf_checkpoint"},
    "circle_jax.lowering": {ERRORS, "circle_jax.graph.*", "circle_jax.ops.*",
                            "circle_jax.passes.*"},
    "circle_jax.distributed": {ERRORS},
    "circle_jax.examples": {"circle_jax.build"},
}


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _allows(allowance: str, name: str) -> bool:
    if allowance.endswith(".*"):
        return _inside(name, allowance[:-2])
    return name == allowance


def _imports_of(layer: str) -> set[tuple[str, str]]:
    """(module, imported module) for every import of the layer's modules outside the layer."""
    return {(m, d) for m, deps in _graph().items() if _inside(m, layer)
            for d in deps if not _inside(d, layer)}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_lower_layers_import_nothing_above_them(layer: str) -> None:
    bad = {(m, d) for m, d in _imports_of(layer)
           if not any(_allows(a, d) for a in LAYERS[layer])}
    assert not bad, f"{layer} imports above itself: {sorted(bad)}"


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_every_allowance_is_used(layer: str) -> None:
    used = {d for _, d in _imports_of(layer)}
    unused = {a for a in LAYERS[layer] if not any(_allows(a, d) for d in used)}
    assert not unused, f"{layer} is allowed imports it does not make: {sorted(unused)}"


# The training step is defined below what drives it: `make_train_step`'s step and the
# composed step import no driver (the compiled epochs, ``fit``, the programs kept on disk,
# scoring, the checkpoint driver); the drivers import the step.
STEP = ("circle_jax.train.step", "circle_jax.train.compose", "circle_jax.train.config")
DRIVERS = ("circle_jax.train.trainer", "circle_jax.train.loop", "circle_jax.train.programs",
           "circle_jax.train.scoring", "circle_jax.checkpoints")


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for d in graph.get(m, ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


@pytest.mark.parametrize("module", STEP)
def test_the_training_step_imports_none_of_its_drivers(module: str) -> None:
    reached = _reachable(_graph(), module)
    bad = sorted(m for m in reached if any(_inside(m, d) for d in DRIVERS))
    assert not bad, f"{module} reaches the drivers {bad}"
    assert "circle_jax.train.step" in _graph()["circle_jax.train.trainer"]


def test_the_allowances_read_as_written() -> None:
    assert _allows("circle_jax.ops.*", "circle_jax.ops") \
        and _allows("circle_jax.ops.*", "circle_jax.ops.integer.params")
    assert not _allows("circle_jax.ops.*", "circle_jax.opsx")
    assert not _allows("circle_jax.graph", "circle_jax.graph.checks")


def test_the_package_root_holds_few_modules() -> None:
    """Layers live in packages: the root keeps the public entry points alone."""
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at circle_jax/: {root}"


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
