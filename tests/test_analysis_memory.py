"""analysis.memory: the report's allocation settings hold inside the block and are restored after it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analysis.memory import report_memory, report_pool

HUGE = np._core.multiarray._set_madvise_hugepage  # returns the previous setting


def test_the_report_allocates_from_its_pool_without_huge_pages_and_restores_both() -> None:
    before_pool, before_huge = pa.default_memory_pool().backend_name, HUGE(True)
    with pytest.raises(RuntimeError, match="inside"), report_memory():
        assert pa.default_memory_pool().backend_name == report_pool().backend_name
        assert report_pool().backend_name in ("jemalloc", "system")
        assert pa.array(np.arange(10)).buffers()[1] is not None  # Arrow allocates from it
        assert HUGE(False) is False  # off inside
        raise RuntimeError("inside")
    assert pa.default_memory_pool().backend_name == before_pool
    assert HUGE(before_huge) is True
