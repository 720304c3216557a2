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
