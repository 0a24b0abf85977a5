"""What the SGLang conformance tests (pytest marker `sglang`) share.

They run SGLang 0.5.23's own Python and Triton code on this machine's CPU, in the environment that
`make sglang` builds (`.venv-sglang`; requirements/sglang-*.txt). `make test` runs them there with
SPECBENCH_REQUIRE_SGLANG=1 and TRITON_INTERPRET=1: then a missing or different SGLang, or a missing
interpreter switch, FAILS the test instead of skipping it. Run elsewhere (plain `pytest` in `.venv`,
which has no SGLang), they skip with the command that runs them.

    from sglang_support import import_sglang
    dflash_utils = import_sglang("sglang.srt.speculative.dflash_utils")
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "SPECBENCH_REQUIRE_SGLANG"
HOW_TO_RUN = "make test-sglang (builds .venv-sglang with SGLang 0.5.23 on first use)"


def pinned_sglang_version() -> str:
    """The SGLang version the conformance environment pins (requirements/sglang-nodeps.txt)."""
    text = (REPO_ROOT / "requirements" / "sglang-nodeps.txt").read_text()
    match = re.search(r"^sglang==(\S+)", text, re.MULTILINE)
    assert match, "requirements/sglang-nodeps.txt must pin sglang==VERSION"
    return match.group(1)


def required() -> bool:
    """True under `make test` / `make test-sglang`: absence is a failure, not a skip."""
    return os.environ.get(REQUIRE_ENV) == "1"


def _absent(why: str) -> None:
    if required():
        pytest.fail(f"{why} ({REQUIRE_ENV}=1: the conformance tests must run; {HOW_TO_RUN})")
    pytest.skip(f"{why}; run them with {HOW_TO_RUN}")


def import_sglang(module: str = "sglang") -> ModuleType:
    """Import a module of the installed SGLang, checking that it is the pinned version."""
    try:
        sglang = importlib.import_module("sglang")
    except ImportError as exc:
        _absent(f"SGLang is not installed in this environment ({exc})")
    pinned = pinned_sglang_version()
    if required() and sglang.__version__ != pinned:
        pytest.fail(
            f"installed SGLang is {sglang.__version__}, the conformance tests pin {pinned}: rebuild .venv-sglang "
            f"(rm -r .venv-sglang && make sglang)"
        )
    return importlib.import_module(module)


def require_triton_interpreter() -> None:
    """SGLang's Triton kernels run on CPU tensors only under TRITON_INTERPRET=1 (set by the Makefile)."""
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        _absent("SGLang's Triton kernels need TRITON_INTERPRET=1 on a machine without CUDA")
