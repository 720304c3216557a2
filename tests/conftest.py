"""Settings and fixtures shared by every test module.

- ``x64``: the test runs with ``jax.enable_x64`` (float64 references, finite differences).
- ``shared_models``: the directory of the shared third-party models
  (``<repo root>/../shared/models``); where it is missing (a fresh clone) the tests that
  need it skip with one line naming it, and fail under ``CI=true`` (``tests/paths.py``).
- ``keras_data``: the committed Keras-converted models and Keras's recorded numbers.
- JAX's persistent compilation cache, in a directory of the run's own (see below).
- ``onert``: the onert peer (``tests/onert_peer.py``, the ``onert`` wheel's train backend
  driven as ``onert_train`` drives it); the wheel is a test dependency, so it never skips.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from tests.paths import (
    KERAS_DATA,
    SHARED_MODELS,
    in_ci,
    needs_shared_models,
    require_shared_models,
)

# The CLI turns JAX's persistent compilation cache on by default in the user's cache
# directory; tests must not write there (tests of the cache give their own directory).
os.environ.setdefault("CIRCLE_JAX_CACHE", "off")

# One run's programs compiled once: JAX's persistent compilation cache in a directory of this
# run alone, made by the controller and shared by its xdist workers (the same executables,
# loaded instead of compiled again by a later test; benchmarks/README.md, "The test suite's
# time"). Set in the test processes only: the command-line processes that tests start keep
# their own cache settings.
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    config.run_cache = (workerinput["circle_jax_run_cache"] if workerinput is not None
                        else tempfile.mkdtemp(prefix="circle-jax-tests-xla-"))
    jax.config.update("jax_compilation_cache_dir", config.run_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist's, in the controller, per worker
    node.workerinput["circle_jax_run_cache"] = node.config.run_cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        shutil.rmtree(config.run_cache, ignore_errors=True)


#: JAX's persistent-cache settings that the command line sets for its run
CACHE_SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                  "jax_persistent_cache_min_entry_size_bytes")


@pytest.fixture(autouse=True)
def _run_cache_restored() -> Iterator[None]:
    """A test that runs the command line in-process points JAX's persistent cache at its own
    directory (a temporary one, or none), and the program cache has JAX read the setting
    again: the run's cache is set back after it, so that later tests share the run's
    compiled programs and write nothing elsewhere."""
    before = {name: getattr(jax.config, name) for name in CACHE_SETTINGS}
    yield
    if jax.config.jax_compilation_cache_dir != before["jax_compilation_cache_dir"]:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@pytest.fixture
def x64() -> Iterator[None]:
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="session")
def shared_models() -> Path:
    return Path(require_shared_models())


@pytest.fixture(autouse=True)
def _shared_models_for_parameters(request: pytest.FixtureRequest) -> None:
    """A test whose parameters name the shared models skips (fails under CI) before it
    starts where the folder is missing (`tests.paths.require_shared_models`)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and not os.path.isdir(SHARED_MODELS) \
            and any(map(needs_shared_models, callspec.params.values())):
        require_shared_models()


@pytest.fixture(scope="session")
def keras_data() -> Path:
    return Path(KERAS_DATA)


@pytest.fixture(scope="session")
def cpu_kernels() -> None:
    """The hand-written CPU kernels, which the install builds where a C++ compiler is
    (always in CI, where `.ci/run` runs: there their absence fails instead of skipping)."""
    from circle_jax.lowering import cpu_kernels

    if not cpu_kernels.available():
        assert not in_ci(), cpu_kernels.status()
        pytest.skip(f"no CPU kernels here ({cpu_kernels.status()})")


@pytest.fixture(scope="session")
def onert() -> ModuleType:
    from tests import onert_peer

    return onert_peer
