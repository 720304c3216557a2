"""JAX's persistent compilation cache for the command line: on by default, per user.

The directory is, first found: ``--compile_cache DIR``, ``$CIRCLE_JAX_CACHE``,
``$XDG_CACHE_HOME/circle-jax/xla``, ``~/.cache/circle-jax/xla``. The value ``off`` (also
``none``, ``0`` or empty) in the flag or the variable disables it. A repeated run of the same
model and flags then loads its compiled epoch instead of compiling it. A directory the user
named (the flag or the variable) that cannot be created is an error; the default one (a
read-only home, as in some containers) is skipped with a ``W:`` line, and the run trains
without the cache.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

OFF = ("off", "none", "0", "")


def cache_dir(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The cache directory chosen by ``flag`` and the environment, as an absolute path (JAX
    writes to it after the run has left the working directory it was named in), or None
    when disabled."""
    env = os.environ if env is None else env
    value = flag if flag is not None else env.get("CIRCLE_JAX_CACHE")
    if value is not None:
        return None if value.strip().lower() in OFF else \
            os.path.abspath(os.path.expanduser(value))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(base, "circle-jax", "xla"))


def named_by_user(flag: str | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the user chose the cache (``--compile_cache`` or ``$CIRCLE_JAX_CACHE``) rather
    than leaving the default."""
    return flag is not None or "CIRCLE_JAX_CACHE" in (os.environ if env is None else env)


def enable_compile_cache(directory: str | None, named: bool = True) -> str:
    """Point JAX's persistent compilation cache at ``directory`` (None: leave it off);
    every compile is cached, however short. Returns what the timing legend shows. A
    directory that cannot be created is an error when the user ``named`` it, else a
    ``W:`` line and no cache."""
    if directory is None:
        return "off"
    import jax

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        why = f"cannot create the compile cache directory {directory!r}: {e.strerror}"
        if not named:
            print(f"W: {why}; training without it (give --compile_cache DIR or off)",
                  file=sys.stderr)
            return "off"
        from .common import CliError

        raise CliError(f"{why} (give --compile_cache DIR or off)") from None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
