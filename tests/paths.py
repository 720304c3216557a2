"""Where the tests find things: the repository, the committed test data, the notebooks and
the shared third-party models (``<repo root>/../shared/models``)."""

from __future__ import annotations

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS)
KERAS_DATA = os.path.join(TESTS, "data", "keras")
NOTEBOOKS = os.path.join(REPO_ROOT, "notebooks")
SHARED_MODELS = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "models"))


def shared_model(name: str) -> str:
    """The path of a shared model; fails (never skips) when it is missing."""
    path = os.path.join(SHARED_MODELS, name)
    assert os.path.exists(path), f"shared model {name} not found at {path}"
    return path
