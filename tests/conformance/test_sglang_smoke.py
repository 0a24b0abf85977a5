"""The conformance environment itself: SGLang imports, at the pinned version, beside the project."""

import pytest
from sglang_support import import_sglang, pinned_sglang_version

pytestmark = pytest.mark.sglang


def test_sglang_imports_at_the_pinned_version():
    sglang = import_sglang()
    assert sglang.__version__ == pinned_sglang_version()
    for module in (
        "sglang.srt.speculative.dflash_utils",
        "sglang.kernels.ops.speculative.reject_sampling",
        "sglang.srt.server_args",
        "sglang.benchmark.serving",
    ):
        import_sglang(module)
