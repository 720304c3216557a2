"""Where the shared models are missing (a fresh clone), the tests that need them skip with
one line naming the folder, and fail under ``CI=true`` (``tests/paths.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import paths


def test_missing_shared_models_skip_with_one_line_and_fail_under_ci(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = tmp_path / "shared" / "models"
    monkeypatch.setattr(paths, "SHARED_MODELS", str(folder))
    for ci in (None, "", "0", "false"):
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        for needs in (lambda: paths.shared_model("m.tflite"), paths.shared_model_names):
            with pytest.raises(pytest.skip.Exception) as e:
                needs()
            line = str(e.value)
            assert line.startswith("the shared models are missing: expected them at ")
            assert str(folder) in line and "\n" not in line
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the shared models are missing"):
        paths.shared_model("m.tflite")
    # while tests are collected (no test running): a path the autouse check knows, or the
    # one placeholder name; under CI the collection fails
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    with pytest.raises(pytest.fail.Exception, match="the shared models are missing"):
        paths.shared_model_names()
    monkeypatch.delenv("CI")
    assert paths.shared_model_names() == [paths.MISSING]
    assert paths.needs_shared_models(paths.shared_model("m.tflite"))
    assert paths.needs_shared_models(paths.MISSING)
    assert not paths.needs_shared_models(str(tmp_path / "m.tflite"))
    assert not paths.needs_shared_models("keras")
    folder.mkdir(parents=True)  # present: the folder's names, an absent model fails
    (folder / "b.circle").write_bytes(b"")
    (folder / "a.tflite").write_bytes(b"")
    (folder / "notes.txt").write_bytes(b"")
    assert paths.shared_model_names() == ["a.tflite", "b.circle"]
    assert paths.shared_model_names(among={"b.circle"}) == ["b.circle"]
    with pytest.raises(AssertionError, match="shared model c.tflite not found"):
        paths.shared_model("c.tflite")


def test_a_parameter_of_any_type_is_read_as_a_path_or_not() -> None:
    import numpy as np

    assert not paths.needs_shared_models(np.zeros((2, 2)))
    assert not paths.needs_shared_models(3) and not paths.needs_shared_models(None)
    assert paths.needs_shared_models(Path(paths.SHARED_MODELS) / "m.tflite")
