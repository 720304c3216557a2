"""Every Python snippet of the README and of the docs pages runs as written.

The rules, one page at a time: every ```python block of a page runs, in order, in one
namespace (later blocks use what earlier ones defined), in a fresh directory that holds the
repository's ``tests`` folder (snippets read ``tests/data/...``). Blocks in other languages
(```bash, plain ```) are shown, not run. A page's snippet is as much a promise as the
README's, so every page of ``docs/`` is here, and every page is in ``mkdocs.yml``'s nav."""

from __future__ import annotations

import os
import re
from pathlib import Path

import matplotlib
import pytest

from tests.paths import REPO_ROOT

ROOT = Path(REPO_ROOT)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))


def blocks(page: str) -> list[str]:
    return BLOCK.findall((ROOT / page).read_text())


def test_readme_has_snippets() -> None:
    assert len(blocks("README.md")) >= 2


def test_the_front_door_and_the_results_stay_short() -> None:
    """The README is the front door (at most 300 lines) and benchmarks/README.md holds today's
    figures, not a diary (at most 400 lines, no dated headings: history lives in git)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    results = (ROOT / "benchmarks" / "README.md").read_text().splitlines()
    assert len(results) <= 400
    dated = [h for h in results if h.startswith("#") and re.search(r"\b(19|20)\d\d\b", h)]
    assert not dated, dated


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w.-]+\.md)\s*$", nav, re.M))
    pages = {p.removeprefix("docs/") for p in PAGES if p.startswith("docs/")}
    assert pages == listed


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_snippets_run_as_written(page: str, tmp_path, monkeypatch) -> None:
    matplotlib.use("Agg")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for k, code in enumerate(blocks(page), 1):
        try:
            exec(compile(code, f"{page} python block {k}", "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - name the block that failed
            raise AssertionError(f"{page} python block {k} fails: {type(e).__name__}: {e}\n"
                                 f"{code}") from e
    if page == "README.md":
        assert os.path.exists("model.circle") and os.path.exists("trained.tflite")
