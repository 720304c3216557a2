"""Where the tests find things: the repository, the committed test data, the notebooks and
the shared third-party models (``<repo root>/../shared/models``).

The shared models are not in the repository. Where the folder is missing (a fresh clone), a
test that needs it skips with one line naming the folder; under ``CI=true`` it fails
instead. A test needs it when it calls :func:`shared_model` (or the ``shared_models``
fixture) or when one of its parameters is a path in it or :data:`MISSING`, the one name
:func:`shared_model_names` lists then; the conftest's autouse check skips those before they
start.
"""

from __future__ import annotations

import os
from collections.abc import Collection

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS)
KERAS_DATA = os.path.join(TESTS, "data", "keras")
NOTEBOOKS = os.path.join(REPO_ROOT, "notebooks")
SHARED_MODELS = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "models"))
#: the one model name :func:`shared_model_names` lists where the folder is missing
MISSING = "shared-models-missing"


def in_ci() -> bool:
    """Whether the tests run in CI (``$CI`` set, and not to 0 or false), where what a test
    needs must be there: a missing piece fails instead of skipping."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_shared_models() -> str:
    """The shared models' folder. Missing: inside a test, a skip with one line naming it
    (a failure under CI); while tests are collected, the path anyway (the test that gets it
    is skipped when it starts) unless under CI, where the collection fails."""
    if os.path.isdir(SHARED_MODELS):
        return SHARED_MODELS
    why = (f"the shared models are missing: expected them at {SHARED_MODELS} "
           "(../shared/models beside the repository)")
    if in_ci():
        pytest.fail(why, pytrace=False)
    if os.environ.get("PYTEST_CURRENT_TEST"):  # set while a test runs, not at collection
        pytest.skip(why)
    return SHARED_MODELS


def shared_model(name: str) -> str:
    """The path of a shared model (see :func:`require_shared_models` where the folder is
    missing); a model missing from a folder that is there fails, never skips."""
    path = os.path.join(require_shared_models(), name)
    if os.path.isdir(SHARED_MODELS):
        assert os.path.exists(path), f"shared model {name} not found at {path}"
    return path


def shared_model_names(among: Collection[str] | None = None) -> list[str]:
    """The sorted names of the shared models (.tflite and .circle files; only those
    ``among`` where given); ``[MISSING]`` where the folder is missing (its test skips with
    the one line, or fails under CI)."""
    folder = require_shared_models()
    if not os.path.isdir(folder):
        return [MISSING]
    return sorted(n for n in os.listdir(folder) if n.endswith((".tflite", ".circle"))
                  and (among is None or n in among))


def needs_shared_models(value: object) -> bool:
    """Whether a test parameter names the shared models: :data:`MISSING` or a path in
    the folder."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    return value == MISSING or os.path.abspath(value).startswith(SHARED_MODELS + os.sep)
