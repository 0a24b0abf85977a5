"""How the report takes memory and threads while it is built: Arrow's jemalloc pool (the system allocator where the
wheel has no jemalloc) instead of its default, no transparent huge pages for numpy's large arrays, and one BLAS
thread per call.

Reading a large campaign allocates and frees several GiB of short-lived buffers and arrays. On a virtual machine
whose freed memory goes back to the host (as on the project's 2-core VM), every fresh page is zeroed again, and a
huge page costs 2 MiB of zeroing however little of it is used: 1,000,160 records took 18-21 s of system time
with Arrow's default pool (mimalloc) and numpy's huge pages, 4-8 s with these settings, the same bytes written
(`python -m analysis.bench_report`). The report runs its own work two at a time (analysis.report); a BLAS that
starts a thread per core for each product, and keeps them spinning between products, only competes with it:
with one BLAS thread the two bootstraps that run side by side took 1.7-2.0 s instead of 2.2 s (3.1-3.8 CPU-s
instead of 4.4). It also makes the bootstrap's float32 products one sum order whatever the machine's cores:
summary.json's unrounded interval ends differed in their 7th digit between one and two BLAS threads (report.md,
which prints them rounded, did not). The settings are process-wide while they hold; `report_memory()` restores the
previous ones when the report is built, but for one: glibc's malloc arenas, limited to one for every thread
(one_malloc_arena), since a worker thread's own arena is memory no other thread reuses: on that VM the report of
1,000,160 records took 9.4-9.6 s against 9.9-10.9 s without the limit, 2.6-2.8 s of system time against 3.6-4.1
(3 pairs of whole processes, 2026-12-04 ~19:20 UTC, the same bytes written). glibc cannot go back to its default.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from threadpoolctl import threadpool_limits

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h): the most malloc arenas the process's threads share


def one_malloc_arena() -> bool:
    """glibc: every thread allocates from the same malloc arena from now on (mallopt M_ARENA_MAX 1); False where
    the C library has no mallopt. A thread that is not the main one otherwise gets an arena of its own, whose freed
    memory no other thread reuses: the report's worker threads (the ITL beside the request tables, the bootstrap's
    draws) then touched fresh pages that the VM zeroes again. glibc reads the limit once, when a process first
    needs more arenas, and has no way back to its default: the setting stays for the process."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no C library by that call (Windows), or no mallopt (macOS)
        return False
    return bool(mallopt(M_ARENA_MAX, 1))


def report_pool() -> pa.MemoryPool:
    """jemalloc where the wheel has it, else the system allocator."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


@contextlib.contextmanager
def report_memory() -> Iterator[None]:
    """report_pool() as Arrow's default pool, numpy's huge-page advice off, one BLAS thread and Python's cyclic
    garbage collector paused, for the block's duration; and one malloc arena for every thread (one_malloc_arena,
    which stays)."""
    one_malloc_arena()
    multiarray = getattr(np, "_core", np).multiarray  # numpy's switch is private: used where it exists
    set_huge_pages = getattr(multiarray, "_set_madvise_hugepage", None)
    previous_pool = pa.default_memory_pool()
    pa.set_memory_pool(report_pool())
    previous_huge = set_huge_pages(False) if set_huge_pages else None
    collecting = gc.isenabled()
    gc.disable()  # the report's objects live until it is built, and it makes few cycles
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        if collecting:
            gc.enable()
        pa.set_memory_pool(previous_pool)
        if set_huge_pages:
            set_huge_pages(previous_huge)
