"""How this process keeps the host memory it frees: for the next compiled call to reuse.

XLA's CPU runtime allocates each execution's temporary buffers with ``malloc`` and frees
them when the call returns. glibc serves a block of more than 32 MiB (the ceiling of its
dynamic mmap threshold) with a fresh ``mmap`` and gives it back with ``munmap``, so every
call of a large model's compiled epoch faults all of its temporary pages in again, whatever
the number of steps in it (measured in benchmarks/README.md, "Small models"). With mmap off
and trimming off, malloc serves those blocks from its heap and keeps what is freed there, so
the next call finds its pages already mapped. The same results; the process holds its peak
heap until it exits, as a training run does anyway.

It is a process-wide C-library setting, so the library never changes it behind a
caller's back: the command line calls `retain_host_memory` as it starts, and a notebook or
script may call it at any time (blocks allocated before keep their own way of being freed).
"""

from __future__ import annotations

import ctypes
import platform

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

#: Largest value ``mallopt`` takes (an int): the heap is trimmed only above 2 GiB free.
TRIM_THRESHOLD = 2**31 - 1


def retain_host_memory() -> bool:
    """Make glibc's malloc serve every block from its heap (``M_MMAP_MAX`` 0) and keep freed
    memory there (``M_TRIM_THRESHOLD`` 2 GiB). Returns whether it did: False where the C
    library is not glibc (macOS, musl, Windows), which keeps its own behaviour."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library this process runs on (no ldconfig lookup)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                    TRIM_THRESHOLD))
