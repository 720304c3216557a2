"""The wheel: every file the package reads at run time is inside it.

The package reads files beside its modules (the C++ kernels' libraries, which ``setup.py``
builds at install time beside their sources in ``circle_jax/lowering/cpu/``; the example's
digits, ``circle_jax/examples/digits.npz``); a wheel without them installs and runs,
silently without the kernels. The wheel is built as ``pip install`` builds it (setuptools,
``pyproject.toml`` and ``setup.py``), from a copy of the package's sources, so the build
writes nothing into the repository.
"""

from __future__ import annotations

import importlib.machinery
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

ROOT = Path(REPO_ROOT)
#: what the build reads besides the package (pyproject's ``readme``)
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md")
#: the setuptools that reads pyproject.toml's SPDX ``license`` (its build-system requirement)
SETUPTOOLS = (77,)


def _ignored(_: str, names: list[str]) -> set[str]:
    """Files a checkout may hold beside the sources (bytecode, the kernels an editable
    install built in place), never copied as sources."""
    return {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo", ".so"))}


def _package_files(root: Path) -> set[str]:
    """Every file of the package under ``root``, as a wheel names it."""
    return {p.relative_to(root).as_posix() for p in (root / "circle_jax").rglob("*")
            if p.is_file() and not _ignored("", [p.name]) and "__pycache__" not in p.parts}


def _kernel_libraries() -> set[str]:
    """The kernels' libraries ``setup.py`` builds on this machine, as a wheel names them."""
    from circle_jax.lowering.cpu_kernels import LEVELS

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    levels = [lv for lv in LEVELS if lv.startswith("x86_64") == x86 and (x86 or lv == "generic")]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return {f"circle_jax/lowering/cpu/kernels_{lv}{suffix}" for lv in levels}


def _backend_installed() -> bool:
    try:
        major = int(version("setuptools").split(".")[0])
    except Exception:  # not installed, or an unreadable version
        return False
    return (major,) >= SETUPTOOLS


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (without build isolation when this
    interpreter has the build backend, which then needs no network)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT / "circle_jax", src / "circle_jax", ignore=_ignored)
    for name in BUILD_INPUTS:
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    isolation = [] if not _backend_installed() else ["--no-build-isolation"]
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           *isolation, "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip wheel failed: {done.stderr[-2000:]}"
    (built,) = out.glob("circle_jax-*.whl")
    return built


@pytest.mark.slow  # the build compiles the kernels (a minute on 2 cores)
def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("circle_jax/")}
    want = _package_files(ROOT) | _kernel_libraries()
    assert {"circle_jax/lowering/cpu/common.h", "circle_jax/examples/digits.npz"} <= want
    assert not want - shipped, f"missing from the wheel: {sorted(want - shipped)}"
    assert not shipped - want, f"in the wheel but not the sources: {sorted(shipped - want)}"


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_kernels")
def test_the_installed_wheel_loads_its_kernels_and_reads_its_data(wheel: Path,
                                                                  tmp_path: Path) -> None:
    """Installed alone (the wheel unpacked, as pip installs it), the package loads the
    kernels' library it shipped, compiling nothing, and the example's digits."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    code = ("import circle_jax, circle_jax.examples as e; "
            "from circle_jax.lowering import cpu_kernels as k; "
            "assert k.available(), k.status(); "
            "print(circle_jax.__file__, k.status().split()[1], e.digits()[0].shape)")
    env = {**os.environ, "PYTHONPATH": str(site), "PATH": "/nonexistent"}  # no compiler
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    where, library, shape = done.stdout.split(maxsplit=2)
    assert Path(where).is_relative_to(site) and Path(library).is_relative_to(site)
    assert shape.strip() == "(1797, 8, 8, 1)"
