"""JAX's persistent compilation cache for the command line: on by default, per user.

The directory is, first found: ``--compile_cache DIR``, ``$CIRCLE_JAX_CACHE``,
``$XDG_CACHE_HOME/circle-jax/xla``, ``~/.cache/circle-jax/xla``. The value ``off`` (also
``none``, ``0`` or empty) in the flag or the variable disables it. A repeated run of the same
model and flags then loads its compiled epoch instead of compiling it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

OFF = ("off", "none", "0", "")


def cache_dir(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The cache directory chosen by ``flag`` and the environment, or None when disabled."""
    env = os.environ if env is None else env
    value = flag if flag is not None else env.get("CIRCLE_JAX_CACHE")
    if value is not None:
        return None if value.strip().lower() in OFF else os.path.expanduser(value)
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "circle-jax", "xla")


def enable_compile_cache(directory: str | None) -> str:
    """Point JAX's persistent compilation cache at ``directory`` (None: leave it off);
    every compile is cached, however short. Returns what the timing legend shows."""
    if directory is None:
        return "off"
    import jax

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        from .common import CliError

        raise CliError(f"cannot create the compile cache directory {directory!r}: "
                       f"{e.strerror} (give --compile_cache DIR or off)") from None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
