"""How this process hands compiled programs to the CPU: inline, on the calling thread.

JAX runs CPU programs on a worker thread by default (asynchronous dispatch) so that Python
can queue the next call while one runs. A training run here is one compiled call per
epoch (or per run, see `fit`) and waits for each at its logging point, so the queue never
holds more than one program and the hand-over between threads is pure overhead, which on a
small model is most of an epoch (benchmarks/README.md, "Small models"). Run inline, the
program executes on the calling thread with the same results.

It is a process-wide JAX setting, read once when JAX starts its CPU backend, so the
library never changes it behind a caller's back: the command line calls
`inline_cpu_dispatch` as it starts, and a notebook or script may call it before its
first JAX computation.
"""

from __future__ import annotations

import jax


def inline_cpu_dispatch() -> bool:
    """Make JAX run CPU programs on the calling thread (``jax_cpu_enable_async_dispatch``
    off) if its backends have not started yet. Returns whether this process runs them
    inline (False: JAX had already started with asynchronous dispatch, and keeps it)."""
    from jax._src import xla_bridge  # no public way to ask whether the backends started

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    return not jax.config.read("jax_cpu_enable_async_dispatch")


def dispatches_async(platform: str) -> bool:
    """Whether a compiled call on ``platform`` returns before its program has run: on CPU
    unless this process runs CPU programs inline (`inline_cpu_dispatch`), on accelerators
    always."""
    return platform != "cpu" or bool(jax.config.read("jax_cpu_enable_async_dispatch"))
