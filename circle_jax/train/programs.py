"""Traced training programs kept on disk, so that a repeated run skips tracing.

Compiling an epoch first traces the model's training step in Python (over a second for a
MobileNet), then XLA compiles it; JAX's persistent compilation cache saves only the second
part. A :class:`ProgramCache` keeps the first: the traced program, serialized by
``jax.export`` (StableHLO), stored under a key of everything the trace depends on: the
caller's description of the model and configuration, the program's name, the arguments'
tree, shapes and dtypes, the JAX and jaxlib versions, the settings that change a trace
(64-bit mode, default matmul precision), the backend and circle_jax's own source. A run
with the same key deserializes the program instead of tracing it, and XLA's compile of it
then comes from JAX's persistent cache. An entry that cannot be read is traced again and
rewritten; a program ``jax.export`` refuses is compiled as usual and not kept. Programs
with host callbacks (a progress bar) or sharded arguments are not cached (`Trainer` does
not ask). Measurements: benchmarks/README.md.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
from jax import export

from ..formats.atomic import atomic_write

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
    """Traced programs in ``directory`` (created when first written)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        #: programs read from the cache / traced and written by this object
        self.hits = self.misses = 0

    def compiled(self, key: Sequence[str], fn: Callable[..., Any], args: tuple,
                 out_tree: Any, compile: Callable[[Any], Callable[..., Any]]
                 ) -> Callable[..., Any]:
        """``fn(*args)`` compiled by ``compile`` (a ``jax.stages.Lowered`` → executable) from
        the cached program for ``key`` and these arguments, or traced and cached now.
        ``out_tree`` is the structure of ``fn``'s result (the program returns its leaves).
        Returns a function of arguments shaped like ``args``."""
        leaves, in_tree = jax.tree.flatten(args)
        path = self.directory / f"{self._digest(key, in_tree, leaves)}.jaxexport"
        program = self._read(path)
        if program is None:
            self.misses += 1

            def flat(*xs: Any) -> list:
                return jax.tree.leaves(fn(*jax.tree.unflatten(in_tree, xs)))

            try:
                program = export.export(jax.jit(flat))(*leaves)
                data = program.serialize()
            except Exception:  # noqa: BLE001 - a program jax.export cannot take: not kept
                return compile(jax.jit(fn).lower(*args))
            self._write(path, data)
        else:
            self.hits += 1
        run = compile(jax.jit(program.call).lower(*leaves))
        return lambda *a: jax.tree.unflatten(out_tree, run(*jax.tree.leaves(a)))

    @staticmethod
    def _digest(key: Sequence[str], in_tree: Any, leaves: list) -> str:
        h = hashlib.sha256()
        parts = [*key, str(in_tree), jax.__version__, jax.lib.__version__,
                 jax.default_backend(), source_digest(),
                 # JAX settings that change what a trace produces
                 f"x64={jax.config.jax_enable_x64}",
                 f"matmul={jax.config.jax_default_matmul_precision}",
                 *(f"{a.shape}:{a.dtype}" for a in leaves)]
        for part in parts:
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    @staticmethod
    def _read(path: Path) -> export.Exported | None:
        try:
            return export.deserialize(bytearray(path.read_bytes()))
        except Exception:  # noqa: BLE001 - missing, truncated or from another JAX: trace again
            return None

    def _write(self, path: Path, data: bytes | bytearray) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError:  # a read-only cache only costs the next run its trace
            pass
