"""analysis.memory: the report's allocation and thread settings hold inside the block and are restored after it."""

from __future__ import annotations

import gc
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from threadpoolctl import threadpool_info

from analysis.memory import report_memory, report_pool

HUGE = np._core.multiarray._set_madvise_hugepage  # returns the previous setting


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_the_report_allocates_from_its_pool_without_huge_pages_or_gc_on_one_blas_thread_and_restores_all() -> None:
    before_pool, before_huge, before_blas = pa.default_memory_pool().backend_name, HUGE(True), _blas_threads()
    assert before_blas  # numpy's BLAS is there to be limited
    with pytest.raises(RuntimeError, match="inside"), report_memory():
        assert pa.default_memory_pool().backend_name == report_pool().backend_name
        assert report_pool().backend_name in ("jemalloc", "system")
        assert pa.array(np.arange(10)).buffers()[1] is not None  # Arrow allocates from it
        assert HUGE(False) is False  # off inside
        assert set(_blas_threads()) == {1}
        assert not gc.isenabled()
        raise RuntimeError("inside")
    assert gc.isenabled()
    assert pa.default_memory_pool().backend_name == before_pool
    assert HUGE(before_huge) is True
    assert _blas_threads() == before_blas


ARENAS_SCRIPT = """
import ctypes, threading
import numpy as np
from analysis.memory import one_malloc_arena

libc = ctypes.CDLL(None)
libc.open_memstream.restype = ctypes.c_void_p


def arenas():  # malloc_info's XML has a <heap nr=...> per arena
    text, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(text), ctypes.byref(size))
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    return text.value.decode().count("<heap nr=")


before = arenas()
assert one_malloc_arena()
gate = threading.Barrier(4)


def work():
    gate.wait()  # the four threads allocate at once: without the limit each would take an arena of its own
    for _ in range(50):
        a, b = np.ones(50_000), np.ones(70_000)
        del a, b


threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(before, arenas())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's arena limit is glibc's")
def test_threads_started_after_one_malloc_arena_take_no_arena_of_their_own() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ARENAS_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    before, after = (int(x) for x in out.stdout.split())
    assert after == before, out.stdout
