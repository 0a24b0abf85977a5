"""`make lint` stays clean: ruff's rules and its formatter on the code, the tests, scripts/ and lab/, mypy on
harness and analysis (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 20 s: mypy checks every module
ROOT = Path(__file__).resolve().parents[1]
TREES = ["harness", "workloads", "analysis", "tests", "scripts", "lab"]  # the Makefile's lint target
RUFF = ["ruff", "check", *TREES]
FORMAT = ["ruff", "format", "--check", *TREES]


@pytest.mark.parametrize("cmd", [RUFF, FORMAT, ["mypy"]], ids=["ruff", "format", "mypy"])
def test_lint_is_clean(cmd):
    proc = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
