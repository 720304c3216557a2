"""Settings and fixtures shared by every test module.

- ``x64``: the test runs with ``jax.enable_x64`` (float64 references, finite differences).
- ``shared_models``: the directory of the shared third-party models
  (``<repo root>/../shared/models``); a missing directory fails, never skips.
- ``keras_data``: the committed Keras-converted models and Keras's recorded numbers.
- ``onert``: the onert peer (``tests/onert_peer.py``, the ``onert`` wheel's train backend
  driven as ``onert_train`` drives it); the wheel is a test dependency, so it never skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import jax
import pytest

from tests.paths import KERAS_DATA, SHARED_MODELS

# The CLI turns JAX's persistent compilation cache on by default in the user's cache
# directory; tests must not write there (tests of the cache give their own directory).
os.environ.setdefault("CIRCLE_JAX_CACHE", "off")

# XLA's compilation is most of the suite's time (the sweep compiles every model's forward,
# gradients and training step), and its LLVM backend's optimization most of that: the suite
# compiles at LLVM optimization level 0 (this process and the subprocesses it starts), which
# halves it (tests/test_sweep.py on three models: 192 s -> 101 s). XLA's own HLO passes run
# as always; float results can differ from the default level's in the last bits (the
# floating-point instructions LLVM emits), below every tolerance the tests state; integer
# kernels are bit-exact either way. CIRCLE_JAX_TEST_XLA=default runs the suite as users run.
TEST_XLA_FLAGS = "" if os.environ.get("CIRCLE_JAX_TEST_XLA") == "default" else \
    "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


@pytest.fixture
def x64() -> Iterator[None]:
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="session")
def shared_models() -> Path:
    path = Path(SHARED_MODELS)
    assert path.is_dir(), f"the shared models are missing: expected them at {path}"
    return path


@pytest.fixture(scope="session")
def keras_data() -> Path:
    return Path(KERAS_DATA)


@pytest.fixture(scope="session")
def onert() -> ModuleType:
    from tests import onert_peer

    return onert_peer
