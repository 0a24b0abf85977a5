"""analysis.memory: the report's allocation and thread settings hold inside the block and are restored after it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from threadpoolctl import threadpool_info

from analysis.memory import report_memory, report_pool

HUGE = np._core.multiarray._set_madvise_hugepage  # returns the previous setting


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_the_report_allocates_from_its_pool_without_huge_pages_on_one_blas_thread_and_restores_all() -> None:
    before_pool, before_huge, before_blas = pa.default_memory_pool().backend_name, HUGE(True), _blas_threads()
    assert before_blas  # numpy's BLAS is there to be limited
    with pytest.raises(RuntimeError, match="inside"), report_memory():
        assert pa.default_memory_pool().backend_name == report_pool().backend_name
        assert report_pool().backend_name in ("jemalloc", "system")
        assert pa.array(np.arange(10)).buffers()[1] is not None  # Arrow allocates from it
        assert HUGE(False) is False  # off inside
        assert set(_blas_threads()) == {1}
        raise RuntimeError("inside")
    assert pa.default_memory_pool().backend_name == before_pool
    assert HUGE(before_huge) is True
    assert _blas_threads() == before_blas
