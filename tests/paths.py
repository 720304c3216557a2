"""Where the tests find the shared third-party models: ``<repo root>/../shared/models``."""

from __future__ import annotations

import os

SHARED_MODELS = os.path.normpath(
    os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models")
)


def shared_model(name: str) -> str:
    """The path of a shared model; fails (never skips) when it is missing."""
    path = os.path.join(SHARED_MODELS, name)
    assert os.path.exists(path), f"shared model {name} not found at {path}"
    return path
