"""circle_jax.retain_host_memory: freed host memory kept for the next call (glibc's malloc)."""

from __future__ import annotations

import ast
import platform

import pytest

from .test_dispatch import TRAIN, _run

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="a glibc malloc setting; elsewhere it returns False")

#: ``faults()``: minor page faults of three successive 64 MiB allocations, each freed before
#: the next.
FAULTS_FN = """
import resource
import numpy as np
def faults():
    out = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.ones(16 << 20, np.float32)
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del a
    return out
"""
FAULTS = FAULTS_FN + "print(faults())\n"


def test_a_freed_block_is_reused_without_faulting_its_pages_in_again():
    *_, kept, retained = _run("import circle_jax as cj\nprint(cj.retain_host_memory())"
                              + FAULTS)
    *_, default = _run(FAULTS)
    assert kept == "True"
    _, *later = ast.literal_eval(retained)
    default_later = ast.literal_eval(default)[1:]
    # glibc's default mmaps a block this large and unmaps it when freed: every allocation
    # faults its pages in again (how many faults depends on the kernel's page sizes). Kept,
    # the later ones reuse mapped pages: under 1% of the 16,384 4-KiB pages.
    assert max(later) * 10 < min(default_later), (retained, default)
    assert max(later) < 164, retained


def test_training_results_are_bit_identical():
    *_, retained = _run("import circle_jax as cj\ncj.retain_host_memory()" + TRAIN)
    *_, default = _run("import circle_jax as cj" + TRAIN)
    assert retained == default


def test_fit_keeps_freed_memory_only_while_it_trains():
    """Inside `host_memory_kept` (what ``fit`` trains in) a freed block is reused without
    faulting its pages in again; after it, glibc maps and unmaps such a block again (every
    allocation faults its pages in, as in a process that never kept memory)."""
    *_, kept, within, after = _run(
        "from circle_jax.train.memory import host_memory_kept" + FAULTS_FN
        + "with host_memory_kept() as kept:\n    print(kept)\n    print(faults())\n"
        + "print(faults())")
    *_, default = _run(FAULTS)
    assert kept == "True"
    default_later = ast.literal_eval(default)[1:]
    assert max(ast.literal_eval(within)[1:]) * 10 < min(default_later), (within, default)
    assert min(ast.literal_eval(after)) * 2 > min(default_later), (after, default)


def test_a_process_that_keeps_memory_keeps_it_after_fit():
    *_, after = _run("import circle_jax as cj\ncj.retain_host_memory()\n"
                     "from circle_jax.train.memory import host_memory_kept\n"
                     "with host_memory_kept() as kept:\n    assert kept\n" + FAULTS)
    assert max(ast.literal_eval(after)[1:]) < 164, after


def test_fit_trains_inside_host_memory_kept(monkeypatch):
    """``fit`` on CPU trains (data, compile, epochs, callbacks) inside `host_memory_kept`
    and leaves it before returning."""
    import contextlib

    import circle_jax.train.loop as loop
    from tests.toy_models import reshape_mlp, toy_data

    events = []

    @contextlib.contextmanager
    def recorded():
        events.append("enter")
        yield True
        events.append("exit")

    monkeypatch.setattr(loop, "host_memory_kept", recorded)
    x, y = toy_data(32)
    loop.fit(reshape_mlp(), x, y, epochs=2, batch_size=8, loss="cce",
             on_epoch=lambda i, h: events.append(i))
    assert events == ["enter", 0, 1, "exit"]
