"""The README's Python snippets run as written: every ```python block, in order, in one
namespace (later blocks use what earlier ones defined), in a fresh directory that holds the
repository's ``tests`` folder (snippets read ``tests/data/...``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import matplotlib

from tests.paths import REPO_ROOT

ROOT = Path(REPO_ROOT)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_readme_has_snippets() -> None:
    assert len(blocks()) >= 4


def test_readme_snippets_run_as_written(tmp_path, monkeypatch) -> None:
    matplotlib.use("Agg")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for k, code in enumerate(blocks(), 1):
        try:
            exec(compile(code, f"README.md python block {k}", "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - name the block that failed
            raise AssertionError(f"README python block {k} fails: {type(e).__name__}: {e}\n"
                                 f"{code}") from e
    assert os.path.exists("model.circle")
