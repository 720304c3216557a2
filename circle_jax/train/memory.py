"""How this process keeps the host memory it frees: for the next compiled call to reuse.

XLA's CPU runtime allocates each execution's temporary buffers with ``malloc`` and frees
them when the call returns. glibc serves a block of more than 32 MiB (the ceiling of its
dynamic mmap threshold) with a fresh ``mmap`` and gives it back with ``munmap``, so every
call of a large model's compiled epoch faults all of its temporary pages in again, whatever
the number of steps in it (measured in benchmarks/README.md, "Small models"). With mmap off
and trimming off, malloc serves those blocks from its heap and keeps what is freed there, so
the next call finds its pages already mapped. The same results.

It is a process-wide C-library setting. The command line calls `retain_host_memory` as it
starts (the process holds its peak heap until it exits, as a training run does anyway); a
script may call it at any time (blocks allocated before keep their own way of being
freed). ``fit`` keeps freed memory only while it trains (`host_memory_kept`), unless the
process already does: on leaving it sets glibc's default limits again and hands the heap's
free memory back (``malloc_trim``), so a notebook holds no more memory after ``fit`` than
before it (when the heap grew by more than `TRIM_ABOVE` inside: less is what glibc's own
limits keep anyway, and walking a heap of a few dozen MiB to return its free pages cost a
small model's ``fit`` a third of a millisecond a call: benchmarks/README.md, "Whole calls").
Rule: the library never leaves a process-wide setting changed that the caller did not ask
for.

Only the calling thread's allocations are kept this way: glibc serves other threads from
their own arenas, which map a block that large whatever ``M_MMAP_MAX`` says. JAX's default
asynchronous dispatch runs compiled CPU programs on a worker thread, so the pages are kept
only where programs run inline (`circle_jax.inline_cpu_dispatch`, as the command line
runs them; measured in benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import platform
from collections.abc import Iterator

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

#: Largest value ``mallopt`` takes (an int): the heap is trimmed only above 2 GiB free.
TRIM_THRESHOLD = 2**31 - 1

#: glibc's defaults (malloc.c: DEFAULT_MMAP_MAX, DEFAULT_TRIM_THRESHOLD), set again when a
#: `host_memory_kept` block ends.
DEFAULT_MMAP_MAX = 65536
DEFAULT_TRIM_THRESHOLD = 128 * 1024

#: how much the main heap may grow inside `host_memory_kept` before leaving it trims the
#: heap: glibc's default trim threshold, what its own limits would have kept
TRIM_ABOVE = DEFAULT_TRIM_THRESHOLD


#: whether `retain_host_memory` made this process keep its freed memory (for good)
_retained = False


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library this process runs on (no ldconfig lookup), if it is glibc."""
    return ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None


def _heap_end(libc: ctypes.CDLL) -> int:
    """The end of the main heap (``sbrk(0)``: no system call)."""
    libc.sbrk.restype = ctypes.c_void_p
    return int(libc.sbrk(ctypes.c_long(0)) or 0)


def _keep(libc: ctypes.CDLL, mmap_max: int, trim_threshold: int) -> bool:
    return bool(libc.mallopt(M_MMAP_MAX, mmap_max)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))


def retain_host_memory() -> bool:
    """Make glibc's malloc serve every block from its heap (``M_MMAP_MAX`` 0) and keep freed
    memory there (``M_TRIM_THRESHOLD`` 2 GiB) from now on. Returns whether it did: False
    where the C library is not glibc (macOS, musl, Windows), which keeps its own behaviour."""
    global _retained
    libc = _glibc()
    _retained = _retained or (libc is not None and _keep(libc, 0, TRIM_THRESHOLD))
    return _retained


@contextlib.contextmanager
def host_memory_kept() -> Iterator[bool]:
    """`retain_host_memory` for the duration of the block (yields whether memory is kept).
    Where the process already keeps it, or the C library is not glibc, it changes nothing.
    Otherwise, on leaving, glibc's default limits (``M_MMAP_MAX`` 65536, ``M_TRIM_THRESHOLD``
    128 KiB, fixed from then on: glibc no longer moves its mmap threshold by itself) and,
    where the main heap grew by more than `TRIM_ABOVE` inside the block,
    ``malloc_trim(0)``, which returns the heap's free pages to the system."""
    libc = None if _retained else _glibc()
    if libc is None or not _keep(libc, 0, TRIM_THRESHOLD):
        yield _retained
        return
    start = _heap_end(libc)
    try:
        yield True
    finally:
        _keep(libc, DEFAULT_MMAP_MAX, DEFAULT_TRIM_THRESHOLD)
        if _heap_end(libc) - start > TRIM_ABOVE:
            libc.malloc_trim(0)
