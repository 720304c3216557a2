"""Compiled training programs kept on disk, so that a repeated run neither traces nor compiles.

Compiling an epoch first traces the model's training step in Python and lowers it to
StableHLO (over a second for a MobileNet), then XLA compiles it. JAX's persistent
compilation cache keeps only the compiled executable, under the hash of the lowered
program: finding it needs the trace and the lowering again. A :class:`ProgramCache` keeps
the executable under a key that needs neither: the compiled program, serialized by
``jax.experimental.serialize_executable`` with the structure of its arguments and result,
keyed by the caller's description of the model and configuration, the program's name, the
arguments' tree, shapes and dtypes, the JAX and jaxlib versions, the settings that change
a trace (64-bit mode, default matmul precision), the device (backend, kind, platform
version), ``XLA_FLAGS`` and circle_jax's own source. A run with the same key loads the
executable: no trace, no lowering, no compile. An entry that cannot be read or loaded
(damaged; or compiled for CPU features this machine lacks, which XLA's CPU loader checks
and refuses) is compiled again and rewritten; a program that cannot be serialized is
compiled as usual and not kept. Programs with host callbacks (a progress bar) or sharded
arguments are not cached (`Trainer` does not ask). An entry is machine code: a cache
directory is as trusted as the code that reads it.

Loading is XLA rebuilding the executable from its HLO, in time that grows with the
program, so it starts as early as its entry is known, on a thread of its own: `prefetch`
from the arguments' shapes, and `prefetch_run` from a record (``runs/``) of the entries
that a caller-named run (the command line: its flags and files) used when it last ended
(`remember_run`), before the model is even read. Measurements: benchmarks/README.md.

`AheadOfTime` is a `Trainer`'s side of it: every program the trainer runs is compiled ahead
of time for its arguments' shapes (so that compiling is measured apart from training),
once per trainer, and loaded from or written to its `ProgramCache` where it has one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import os
import pickle
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from ..lowering import cpu_kernels

_PACKAGE = Path(__file__).resolve().parents[1]


@functools.cache
def source_digest() -> str:
    """SHA-256 of circle_jax's Python source (a changed operator is a changed program)."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(_PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def describe_config(config: Any) -> str:
    """A deterministic text of a (dataclass) configuration: sets sorted, mappings by key."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (set, frozenset)):
            return sorted((plain(x) for x in v), key=repr)
        if isinstance(v, dict):
            return [[repr(k), plain(x)] for k, x in sorted(v.items(), key=lambda kv: repr(kv[0]))]
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return repr(v)

    return json.dumps(plain(config))


class ProgramCache:
    """Compiled programs in ``directory`` (created when first written)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        #: programs loaded from the cache / compiled and written by this object
        self.hits = self.misses = 0
        #: the entries this object loaded or wrote, in order (what `remember_run` records)
        self.used: list[Path] = []
        #: entries being loaded by `prefetch` or `prefetch_run`, by path
        self._loading: dict[Path, futures.Future] = {}
        #: why entries could not be written (a full disk: the OS's words, once each)
        self.write_errors: list[str] = []

    def compiled(self, key: Sequence[str], fn: Callable[..., Any], args: tuple,
                 compile: Callable[[jax.stages.Lowered], jax.stages.Compiled]
                 ) -> jax.stages.Compiled:
        """``fn`` compiled by ``compile`` (a ``jax.stages.Lowered`` → executable; ``key``
        names its compiler options) for arguments shaped like ``args``: loaded from the
        entry for ``key`` and those arguments (by `prefetch`, if it was asked for), or
        traced, compiled and written now."""
        path, in_tree = self._entry(key, args)
        loading = self._loading.pop(path, None)
        loaded = _checked(loading.result() if loading is not None else _load(path), in_tree)
        if loaded is not None:
            self.hits += 1
            self.used.append(path)
            return loaded
        self.misses += 1
        with _persistent_cache_off():
            with _no_source_locations():
                lowered = jax.jit(fn).lower(*args)
            _strip_debug_info(lowered)
            compiled = compile(lowered)
        try:
            data, stored_in, out_tree = serialize_executable.serialize(compiled)
            results = [(tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(compiled.out_info)]
            entry = pickle.dumps((data, stored_in, out_tree, results))
        except Exception:  # noqa: BLE001 - a program that cannot be serialized: not kept
            return compiled
        self._write(path, entry)
        self.used.append(path)
        return compiled

    def result_shapes(self, key: Sequence[str], args: tuple) -> Any:
        """The result of the program kept for ``key`` and ``args``, as a tree of
        ``jax.ShapeDtypeStruct`` (no trace, nothing loaded), or None without an entry."""
        try:
            _, _, out_tree, results = pickle.loads(self._entry(key, args)[0].read_bytes())
            return out_tree.unflatten([jax.ShapeDtypeStruct(s, d) for s, d in results])
        except Exception:  # noqa: BLE001 - missing, damaged or older: not known
            return None

    def prefetch(self, key: Sequence[str], args: tuple) -> None:
        """Start loading the entry for ``key`` and arguments shaped like ``args`` (arrays or
        ``jax.ShapeDtypeStruct``) on a thread of its own, for the `compiled` call that asks
        for it; nothing without an entry. XLA loads an executable without Python's lock:
        a command-line run loads its epoch while it makes the fresh training state."""
        self._prefetch([self._entry(key, args)[0]])

    def prefetch_run(self, run: str) -> int:
        """Start loading, on a thread of its own and in the order they were asked for, the
        entries that the run named ``run`` used when it last ended (`remember_run`), before
        anything of this run is known: a repeated command-line run loads its programs
        while it imports, reads the model and the data. An entry this run does not ask for
        only cost the thread its load; nothing without a record. Returns how many entries
        started loading."""
        try:
            names = json.loads(self._run_record(run).read_text())
        except (OSError, ValueError):  # no record (a first run), or a damaged one
            return 0
        if not isinstance(names, list):
            return 0
        return self._prefetch([self.directory / n for n in names
                               if isinstance(n, str) and n == Path(n).name])

    def remember_run(self, run: str) -> None:
        """Record the entries this object used (`used`) as those of the run named ``run``,
        for `prefetch_run` in its next process."""
        names = list(dict.fromkeys(p.name for p in self.used))
        if not names:
            return
        record, data = self._run_record(run), json.dumps(names).encode()
        with contextlib.suppress(OSError):
            if record.read_bytes() == data:  # as it was: not written again
                return
        self._write(record, data)

    def _run_record(self, run: str) -> Path:
        """The record of run ``run`` made with this JAX, jaxlib, ``XLA_FLAGS`` and circle_jax
        source: an entry is only ever loaded by the versions that wrote it."""
        return self.directory / "runs" / f"{_hashed([run, *_software()])}.json"

    def _prefetch(self, paths: list[Path]) -> int:
        """Load the existing entries of ``paths`` not yet loading, one after another, on
        a thread of their own; how many. The thread is not a daemon: a process that ends
        while it loads (a run refused after its start) waits for the load, where
        Python's exit would stop the thread inside XLA, which can abort the process
        ("terminate called after throwing")."""
        # read and unpickled here: unpickling imports the modules of the arguments' tree,
        # which this thread may be importing as well
        entries = {p: _read(p) for p in paths if p not in self._loading and p.exists()}
        if not entries:
            return 0
        loading = {p: futures.Future() for p in entries}

        def load() -> None:
            for path, future in loading.items():
                future.set_result(_deserialized(entries[path]))

        self._loading.update(loading)
        threading.Thread(target=load, name="circle-jax program load").start()
        return len(entries)

    def _entry(self, key: Sequence[str], args: tuple) -> tuple[Path, Any]:
        leaves, in_tree = jax.tree.flatten(args)
        return self.directory / f"{self._digest(key, in_tree, leaves)}.jaxexec", in_tree

    @staticmethod
    def _digest(key: Sequence[str], in_tree: Any, leaves: list) -> str:
        device = jax.devices()[0]
        return _hashed([*key, str(in_tree), *_software(),
                        device.platform, device.device_kind, device.client.platform_version,
                        # JAX settings that change what a trace produces
                        f"x64={jax.config.jax_enable_x64}",
                        f"matmul={jax.config.jax_default_matmul_precision}",
                        *(f"{a.shape}:{a.dtype}" for a in leaves)])

    def _write(self, path: Path, data: bytes) -> None:
        # imported here: the formats package reads the Circle schema, which loading an
        # entry (`prefetch_run`, as the command line starts) does not need
        from ..formats.atomic import atomic_write

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError as e:  # costs only the next run its compile; said in `write_errors`
            why = e.strerror or str(e)
            if why not in self.write_errors:
                self.write_errors.append(why)


def _software() -> list[str]:
    """The JAX and jaxlib versions, ``XLA_FLAGS``, circle_jax's source digest and its CPU
    kernels (`circle_jax.lowering.cpu_kernels.cache_key`): what makes an entry another
    program (or unloadable) besides its key and the device."""
    return [jax.__version__, jax.lib.__version__, os.environ.get("XLA_FLAGS", ""),
            source_digest(), cpu_kernels.cache_key()]


def _hashed(parts: Sequence[str]) -> str:
    """SHA-256 of ``parts``, each ended by a NUL."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _load(path: Path) -> tuple[jax.stages.Compiled, Any] | None:
    """(the executable, the tree of its arguments) of the entry at ``path``, or None when it
    is missing, damaged or not for this machine."""
    return _deserialized(_read(path))


def _read(path: Path) -> tuple[bytes, Any, Any] | None:
    """(the serialized executable, its arguments' tree, its result's tree) of the entry at
    ``path``, or None when it is missing or damaged."""
    try:
        data, stored_in, out_tree, _ = pickle.loads(path.read_bytes())
        return data, stored_in, out_tree
    except Exception:  # noqa: BLE001 - missing or damaged: compile
        return None


def _deserialized(entry: tuple[bytes, Any, Any] | None
                  ) -> tuple[jax.stages.Compiled, Any] | None:
    """(the executable, the tree of its arguments) of a `_read` entry, or None when there is
    none or it is not for this machine."""
    if entry is None:
        return None
    data, stored_in, out_tree = entry
    cpu_kernels.available()  # its custom calls registered before it loads
    try:
        return serialize_executable.deserialize_and_load(data, stored_in, out_tree), stored_in
    except Exception:  # noqa: BLE001 - damaged, or not for this machine: compile
        return None


def _checked(loaded: tuple[jax.stages.Compiled, Any] | None, in_tree: Any
             ) -> jax.stages.Compiled | None:
    """The loaded executable if it takes arguments of the tree ``in_tree``."""
    if loaded is None or loaded[1].children()[0] != in_tree:
        return None
    return loaded[0]


def _strip_debug_info(lowered: jax.stages.Lowered) -> None:
    """Drop the source locations (operation names, Python stack frames) from ``lowered``'s
    module, in place, before it compiles: XLA keeps them as every instruction's metadata in
    the executable, and a repeated run parses them all when it loads it (MobileNet
    0.25/128, Adam, validation: 22% fewer bytes, loads about 20% faster; benchmarks/
    README.md). The machine code is the same; a profile of a cached program names no JAX
    operations. Left as it is where this JAX's MLIR bindings differ."""
    try:
        from jax._src.lib.mlir import passmanager

        module = lowered.compiler_ir()
        with module.context:
            passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(
                module.operation)
    except Exception:  # noqa: BLE001 - an internal API: compile with the locations
        pass


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a program is traced and compiled (the
    objects a trace makes are freed by reference counting; the collector's passes over
    them took about a quarter of MobileNet's trace, benchmarks/README.md); back on after,
    if it was on before."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@contextlib.contextmanager
def _jax_settings(settings: dict[str, Any]) -> Iterator[None]:
    """JAX's configuration ``settings`` (name -> value) for the block, and as they were
    after."""
    before = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)


#: JAX's settings for a lowering without Python stack frames in its source locations
_NO_LOCATIONS = {"jax_include_full_tracebacks_in_locations": False,
                 "jax_traceback_in_locations_limit": 0}


def _no_source_locations() -> contextlib.AbstractContextManager[None]:
    """Lower without the Python stack frames of each operation's source location (and the
    settings as they were after): a kept program's locations are stripped before it
    compiles (`_strip_debug_info`), and writing them took a fifth of MobileNet 0.25/128's
    epoch lowering (benchmarks/README.md)."""
    return _jax_settings(_NO_LOCATIONS)


@contextlib.contextmanager
def _persistent_cache_off() -> Iterator[None]:
    """JAX's persistent compilation cache off for the block (and as it was after): an
    executable that cache loads serializes without its kernels, and such an entry would
    fail at its first call (measured with JAX 0.10.2 on CPU: "Function ... not found").
    JAX decides once per process whether its cache is used, at the first compile, so the
    setting alone changes nothing after one: the decision is reset on entry and on exit
    (``reset_cache``, JAX's public way to have the setting read again)."""
    try:
        with _jax_settings({"jax_enable_compilation_cache": False}):
            compilation_cache.reset_cache()
            yield
    finally:
        compilation_cache.reset_cache()


#: XLA's classic fusion emitters: the options of a model's compiled training programs on
#: CPU when it has a `SPATIAL_OPERATORS` operator (see `cpu_compiler_options`).
CLASSIC_EMITTERS = {"xla_cpu_use_fusion_emitters": False}

#: Operators whose compiled training steps run faster with `CLASSIC_EMITTERS`: their
#: reductions over activations (bias and pooling gradients).
SPATIAL_OPERATORS = frozenset({
    "CONV_2D", "CONV_3D", "CONV_3D_TRANSPOSE", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV",
    "AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"})


#: LLVM's optimization level 2 instead of XLA's default 3: the options a large convolutional
#: model's programs add (see `cpu_compiler_options`).
LLVM_O2 = {"xla_backend_optimization_level": 2}

#: The fewest operators of a convolutional model compiled with `LLVM_O2`.
LLVM_O2_MIN_OPERATORS = 24


def cpu_compiler_options(operator_types: Iterable[str]) -> dict[str, Any]:
    """The XLA options of a model's compiled training programs on CPU, by its operators (one
    type per operator): `CLASSIC_EMITTERS` where it has a `SPATIAL_OPERATORS` one, with
    `LLVM_O2` too where it has at least `LLVM_O2_MIN_OPERATORS` operators; XLA's defaults
    otherwise.

    Rules: XLA's classic emitters reduce over activations faster (convolutional models'
    steps 4-10% faster, 30-40% less compile memory), but they run an elementwise kernel that
    writes over its own operand as a scalar loop (LLVM's vectorizer cannot rule out a
    partial overlap): every weight and optimizer-state update of a step. Dense models, where
    those updates are much of the step, train faster on XLA's default emitters (an MLP 17-25%
    with SGD, 2x with Adam). A first run's compile is mostly LLVM optimizing every kernel
    XLA generates; at level 2 a large convolutional model compiles in about a fifth less
    time and steps as fast (its steps are mostly library calls), while a small one steps up
    to 30% slower (its few small kernels are the step). Measured in benchmarks/README.md."""
    types = list(operator_types)
    if not SPATIAL_OPERATORS.intersection(types):
        return {}
    return {**CLASSIC_EMITTERS, **(LLVM_O2 if len(types) >= LLVM_O2_MIN_OPERATORS else {})}


def compile_for(lowered: jax.stages.Lowered, options: dict[str, Any]) -> Callable[..., Any]:
    """Compile with XLA ``options``; with XLA's defaults where this XLA lacks one of them."""
    if options:
        try:
            return lowered.compile(compiler_options=options)
        except Exception as e:  # XLA's runtime error type moved between jaxlib versions
            if "compile option" not in str(e):
                raise
    return lowered.compile()


class AheadOfTime:
    """`Trainer`'s programs compiled ahead of time, kept per trainer and, with a
    `ProgramCache`, on disk (a base of `Trainer`, whose attributes these methods read)."""

    model: Any
    config: Any
    hoist: Any
    placement: Any
    progress: Any
    trainable: frozenset[str]
    program_cache: ProgramCache | None
    compiler_options: dict[str, Any]
    _compiled: dict[Any, Callable[..., Any]]
    packed: Callable[[Any], Any]
    _epochs_arguments: Callable[..., tuple]

    def _compiled_for(self, fn: Callable[..., Any], name: str, args: tuple
                      ) -> Callable[..., Any]:
        """``fn`` compiled ahead of time for ``args``' shapes, kept per trainer and, with a
        ``program_cache``, on disk (compiled once for every later run)."""
        leaves, tree = jax.tree.flatten(args)
        key = (name, tree, tuple((a.shape, a.dtype, getattr(a, "sharding", None))
                                 for a in leaves))
        if key not in self._compiled:
            cached = self._cache_key(name)
            with collector_paused():
                if cached is not None:
                    self._compiled[key] = self.program_cache.compiled(
                        cached, fn, args, lambda low: compile_for(low, self.compiler_options))
                else:
                    self._compiled[key] = compile_for(jax.jit(fn).lower(*args),
                                                       self.compiler_options)
        return self._compiled[key]

    def _cache_key(self, name: str) -> tuple[str, ...] | None:
        """The `ProgramCache` key of program ``name``, or None where it is not kept."""
        if self.program_cache is None or self.progress is not None \
                or self.placement is not None or self.model.digest is None:
            return None
        # how many epochs a run trains is not in the programs (a call's count is an argument
        # of the epochs program), so runs of other lengths share them
        config = describe_config(dataclasses.replace(self.config, epochs=0))
        return (self.model.digest, name, config, str(self.hoist), repr(self.compiler_options))

    def prefetch_epochs(self, params: Mapping[str, Any] | None, x: Sequence[jax.Array],
                        y: jax.Array, count: int, val: tuple[tuple, jax.Array] | None
                        ) -> None:
        """Start loading, from the program cache, the `epochs_runner` program of ``count``
        epochs that a fresh state from ``params`` (`init`) will train, while `init` makes
        that state: its shapes come from the kept fresh-state program (no trace). Nothing
        without a cache or its entries."""
        fresh, epochs = self._cache_key("fresh"), self._cache_key(f"epochs{count}")
        if fresh is None or epochs is None:
            return
        params = params if params is not None else self.model.params

        def shaped(tree: dict) -> dict:  # as `jax.device_put` places them
            return {k: jax.ShapeDtypeStruct(np.shape(v), jax.dtypes.canonicalize_dtype(
                v.dtype if hasattr(v, "dtype") else np.result_type(v))) for k, v in tree.items()}

        trainable = shaped({k: v for k, v in params.items() if k in self.trainable})
        state = self.program_cache.result_shapes(fresh, (trainable,))
        if state is None:
            return
        frozen = shaped({k: v for k, v in params.items() if k not in self.trainable})
        self.program_cache.prefetch(epochs, self._epochs_arguments(self.packed(state), frozen,
                                                                   x, y, val))
