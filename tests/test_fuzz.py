"""Mutated copies of the real models (tests/fuzz.py's seeded mutator) are either loaded and
run, or refused with a documented one-line error; never another exception, a crash, more
than 4 GiB of memory or more than the time limit. A bounded sample runs in the slow tier
(``pytest -m slow``); the long mode is ``benchmarks/fuzz_long.py`` (its counts are in
benchmarks/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import fuzz
from tests.aeq_files import quantized_path
from tests.paths import TESTS

# Small models, so that each case takes well under a second once the worker is warm.
SMALL = sorted(p.name for p in fuzz.MODELS.glob("*")
               if p.suffix in (".tflite", ".circle") and p.stat().st_size < 100_000)
PER_MODEL = 15


def test_shared_models_are_there() -> None:
    assert len(SMALL) >= 8, SMALL


def test_mutations_are_deterministic_and_change_the_file() -> None:
    data = (fuzz.MODELS / SMALL[0]).read_bytes()
    assert fuzz.mutate(data, 3) == fuzz.mutate(data, 3)
    assert sum(fuzz.mutate(data, s) != data for s in range(20)) >= 18


@pytest.mark.slow
def test_mutated_models_load_or_are_refused_in_one_line() -> None:
    bad = [(case, result) for case, result in
           fuzz.run_cases(fuzz.cases(SMALL, PER_MODEL, start=1000), timeout=30)
           if result.startswith("bad")]
    assert not bad, bad


def _extra_corpus() -> list[str]:
    """Files the shared models lack: on-device training files (resource variables, Flex
    ops, no initialisers) and ai-edge-quantizer's int4, int2 and blockwise files."""
    ondevice = sorted(str(p) for p in (Path(TESTS) / "data" / "ondevice").glob("*.tflite"))
    mlp = str(Path(TESTS) / "data" / "torch" / "mlp.tflite")
    recipes = ("weight_only_wi4_afp32", "dynamic_wi4b32_afp32", "dynamic_wi2c_afp32")
    return ondevice + [quantized_path(mlp, r) for r in recipes]


@pytest.mark.slow
def test_mutated_resource_and_sub_byte_files_load_or_are_refused_in_one_line() -> None:
    corpus = _extra_corpus()
    assert all(fuzz.judge(Path(p).read_bytes()) in ("ok", "refused") for p in corpus)
    bad = [(case, result) for case, result in
           fuzz.run_cases(fuzz.cases(corpus, 5, start=2000), timeout=30)
           if result.startswith("bad")]
    assert not bad, bad
