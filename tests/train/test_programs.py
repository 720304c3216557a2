"""Compiled programs kept on disk (`circle_jax.train.programs`): a second trainer loads
them instead of tracing and compiling (its `fit` runs no trace and no XLA compile, and
loads the epochs while it makes the fresh state) and trains to the same weights; a
recorded run's programs load before any is asked for; the key follows the configuration;
a damaged entry or run record is compiled again or ignored; a process that ends while
its programs load waits for them; a progress callback bypasses the cache."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

import circle_jax as cj
from circle_jax.train import TrainConfig, Trainer, fit, programs
from circle_jax.train.programs import ProgramCache, describe_config
from tests.compile_events import COMPILE, TRACE, compile_events
from tests.toy_models import reshape_mlp, toy_data

CFG = dict(epochs=2, batch_size=4, learning_rate=0.1, loss="cce", optimizer="adam")


@pytest.fixture(scope="module")
def model() -> cj.Model:
    return reshape_mlp()


def _fit(model, directory, **changes):
    x, y = toy_data(20)
    trainer = Trainer(model, **{**CFG, **changes})
    cache = trainer.program_cache = ProgramCache(directory)
    return fit(model, x, y, trainer=trainer), cache


def test_a_second_trainer_reads_the_program_and_trains_alike(model, tmp_path) -> None:
    first, c1 = _fit(model, tmp_path)
    second, c2 = _fit(model, tmp_path)
    # two programs: the fresh state and the two epochs
    assert (c1.misses, c1.hits, c2.misses, c2.hits) == (2, 0, 0, 2)
    assert len(list(tmp_path.iterdir())) == 2
    x, y = toy_data(20)
    plain = fit(model, x, y, **CFG)
    for k in plain.params:
        np.testing.assert_array_equal(second.params[k], plain.params[k])
        np.testing.assert_array_equal(first.params[k], plain.params[k])
    assert second.history.loss == plain.history.loss


def test_another_configuration_is_another_program(model, tmp_path) -> None:
    _fit(model, tmp_path)
    _, cache = _fit(model, tmp_path, learning_rate=0.2)  # baked into both programs
    assert cache.misses == 2 and len(list(tmp_path.iterdir())) == 4
    _, cache = _fit(model, tmp_path, epochs=3)  # three epochs in one call: the same programs
    assert (cache.hits, cache.misses) == (2, 0) and len(list(tmp_path.iterdir())) == 4
    x, y = toy_data(20)
    for epochs in (5, 4):  # epoch by epoch: the same programs again
        trainer = Trainer(model, **{**CFG, "epochs": epochs})
        trainer.program_cache = cache = ProgramCache(tmp_path)
        fit(model, x, y, trainer=trainer, on_epoch=lambda i, h: None)
        assert (cache.hits, cache.misses) == (2, 0)
    assert len(list(tmp_path.iterdir())) == 4


def test_64_bit_mode_is_another_program(model, tmp_path) -> None:
    _fit(model, tmp_path)
    with jax.enable_x64(True):
        _, cache = _fit(model, tmp_path)  # the same float32 arguments, another trace
    assert cache.misses == 2 and len(list(tmp_path.iterdir())) == 4


def test_a_damaged_entry_is_compiled_again(model, tmp_path) -> None:
    _fit(model, tmp_path)
    for entry in tmp_path.iterdir():
        entry.write_bytes(entry.read_bytes()[:100])
    result, cache = _fit(model, tmp_path)
    assert cache.misses == 2 and np.isfinite(result.history.loss).all()
    assert _fit(model, tmp_path)[1].hits == 2  # rewritten whole


def test_a_program_in_jax_s_own_cache_is_kept_runnable(model, tmp_path) -> None:
    """JAX's persistent cache on and already used by this process, holding the very
    programs a `ProgramCache` then compiles: what it keeps is compiled anew (an executable
    JAX's cache loads serializes without its kernels), and a later trainer runs it."""
    before = jax.config.jax_compilation_cache_dir, \
        jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()
    try:
        x, y = toy_data(20)
        fit(model, x, y, **CFG)  # JAX's cache is used from now on
        _fit(model, tmp_path / "first")  # compiled; JAX's cache may keep them too
        _, cache = _fit(model, tmp_path / "second")  # compiled again, for another directory
        assert cache.misses == 2
        second, cache = _fit(model, tmp_path / "second")  # loads and runs them
        assert cache.hits == 2
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        compilation_cache.reset_cache()
    for k, v in fit(model, x, y, **CFG).params.items():
        np.testing.assert_array_equal(second.params[k], v)


def test_a_program_that_cannot_be_serialized_is_compiled_as_usual(model, tmp_path,
                                                                  monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise ValueError("Compilation does not support serialization")

    monkeypatch.setattr(programs.serialize_executable, "serialize", refuse)
    result, cache = _fit(model, tmp_path)
    assert cache.misses == 2 and not any(tmp_path.iterdir())
    x, y = toy_data(20)
    assert result.history.loss == fit(model, x, y, **CFG).history.loss


def test_a_cache_hit_traces_and_compiles_nothing(model, tmp_path) -> None:
    """What a repeated command-line run saves: no Python trace, no XLA compile (JAX's
    monitoring events, counted after JAX's in-memory caches are emptied)."""
    _fit(model, tmp_path, validation_split=0.2)
    jax.clear_caches()
    with compile_events() as events:
        _, cache = _fit(model, tmp_path, validation_split=0.2)
    seen = collections.Counter(e.name for e in events)
    assert cache.hits == 2
    assert seen[TRACE] == 0, seen
    assert seen[COMPILE] == 0, seen


def test_a_cache_hit_loads_the_epochs_while_the_fresh_state_is_made(model, tmp_path,
                                                                    monkeypatch) -> None:
    """The epochs' entry, found from the fresh-state program's kept result shapes (no
    trace), loads on a thread of its own, and `compiled` takes it from there."""
    _fit(model, tmp_path, validation_split=0.2)
    threads = _spy_loads(monkeypatch)
    result, cache = _fit(model, tmp_path, validation_split=0.2)
    assert (cache.hits, cache.misses) == (2, 0) and not cache._loading
    assert sorted(threads) == ["MainThread", "circle-jax program load"]
    x, y = toy_data(20)
    assert result.history.val_loss == fit(model, x, y, **CFG, validation_split=0.2
                                          ).history.val_loss


def _spy_loads(monkeypatch) -> list[str]:
    """The names of the threads that load executables, as they do."""
    threads = []
    load = programs._deserialized

    def spy(entry):
        threads.append(threading.current_thread().name)
        return load(entry)

    monkeypatch.setattr(programs, "_deserialized", spy)
    return threads


def test_a_recorded_run_loads_its_programs_before_any_is_asked_for(model, tmp_path,
                                                                    monkeypatch) -> None:
    """`remember_run` records the entries a run used, in order; a new cache's
    `prefetch_run` of that name starts loading them on one thread before any key is known,
    and `fit` takes both from there (its own prefetch finds the epochs already loading)."""
    _, first = _fit(model, tmp_path)
    first.remember_run("run A")
    record = first._run_record("run A")
    written = record.stat().st_ino  # a rewrite replaces the file (`atomic_write`)
    first.remember_run("run A")  # the same entries: the record is left as it is
    assert record.stat().st_ino == written
    threads = _spy_loads(monkeypatch)
    cache = ProgramCache(tmp_path)
    assert cache.prefetch_run("run A") == 2
    assert list(cache._loading) == first.used and len(set(first.used)) == 2
    x, y = toy_data(20)
    trainer = Trainer(model, **CFG)
    trainer.program_cache = cache
    result = fit(model, x, y, trainer=trainer)
    assert (cache.hits, cache.misses) == (2, 0) and not cache._loading
    assert threads == ["circle-jax program load"] * 2
    assert result.history.loss == fit(model, x, y, **CFG).history.loss
    assert ProgramCache(tmp_path).prefetch_run("run B") == 0  # another run: nothing


def test_a_process_that_ends_while_its_programs_load_waits_for_them(model, tmp_path) -> None:
    """A run refused right after its start (`prefetch_run`, then exit status 1) ends once
    the load it began has ended: Python's exit stops a daemon thread where it stands, and
    one stopped inside XLA's load aborts the process ("terminate called", status 134, in 2
    of 12 such exits before). The load is held for 1 s here, so a process that did not
    wait would end without its mark."""
    _, first = _fit(model, tmp_path)
    first.remember_run("run A")
    mark = tmp_path / "loaded"
    code = f"""
        import sys, time
        from circle_jax.train import programs
        load = programs._deserialized
        def held(entry):
            time.sleep(1)
            result = load(entry)
            open({str(mark)!r}, "a").write("x")
            return result
        programs._deserialized = held
        assert programs.ProgramCache({str(tmp_path)!r}).prefetch_run("run A") == 2
        print("E: refused", file=sys.stderr)
        sys.exit(1)
        """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "E: refused\n")
    assert mark.read_text() == "xx"  # both programs loaded before the process ended


@pytest.mark.parametrize("record", [b"not json", b'{"a": 1}',
                                    b'["../x.jaxexec", "/etc/passwd", 3, "missing.jaxexec"]'])
def test_a_damaged_run_record_loads_nothing(tmp_path, record) -> None:
    """A record that is not a list of entry names in the directory starts no load: names
    with a directory part (outside the cache), other values and missing entries are left."""
    cache = ProgramCache(tmp_path)
    path = cache._run_record("run")
    path.parent.mkdir(parents=True)
    path.write_bytes(record)
    (tmp_path.parent / "x.jaxexec").write_bytes(b"")
    assert cache.prefetch_run("run") == 0 and not cache._loading


def test_a_progress_callback_bypasses_the_cache(model, tmp_path) -> None:
    x, y = toy_data(20)
    trainer = Trainer(model, **CFG)
    trainer.program_cache = cache = ProgramCache(tmp_path)
    fit(model, x, y, trainer=trainer, progress=lambda done, total: None)
    assert (cache.hits, cache.misses) == (0, 0)
    assert not any(tmp_path.iterdir())


def test_the_configuration_text_is_deterministic() -> None:
    a = TrainConfig(trainable={"b", "a", "c"}, optimizer_kwargs={"beta_2": 0.9, "beta_1": 0.8})
    b = TrainConfig(trainable={"c", "a", "b"}, optimizer_kwargs={"beta_1": 0.8, "beta_2": 0.9})
    assert describe_config(a) == describe_config(b)
    assert describe_config(a) != describe_config(TrainConfig(trainable={"a"}))


def test_collector_paused_while_a_program_is_traced_and_restored_after(model, monkeypatch):
    """Python's cyclic collector is off while the trainer traces and compiles a program, and
    comes back as it was: on after, and still off where the caller had turned it off."""
    import gc

    seen = []
    lower = jax.stages.Traced.lower

    def spy(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return lower(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Traced, "lower", spy)
    x, y = toy_data(16)
    assert gc.isenabled()
    fit(model, x, y, epochs=1, batch_size=4)
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        with programs.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_kept_program_lowers_without_stack_frames_and_restores_the_settings(
        model, tmp_path, monkeypatch) -> None:
    """A program written to the cache lowers without Python stack frames in its source
    locations (they are stripped before it compiles), and JAX's settings come back as they
    were, also when the lowering raises."""
    seen = []
    lower = jax.stages.Traced.lower

    def spy(self, *args, **kwargs):
        seen.append((jax.config.jax_include_full_tracebacks_in_locations,
                     jax.config.jax_traceback_in_locations_limit))
        return lower(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Traced, "lower", spy)
    before = (jax.config.jax_include_full_tracebacks_in_locations,
              jax.config.jax_traceback_in_locations_limit)
    _fit(model, tmp_path)
    assert seen and all(s == (False, 0) for s in seen), seen
    assert (jax.config.jax_include_full_tracebacks_in_locations,
            jax.config.jax_traceback_in_locations_limit) == before
    with pytest.raises(RuntimeError), programs._no_source_locations():
        raise RuntimeError("lowering failed")
    assert (jax.config.jax_include_full_tracebacks_in_locations,
            jax.config.jax_traceback_in_locations_limit) == before
