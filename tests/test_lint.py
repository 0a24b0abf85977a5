"""`make lint` stays clean: ruff on the code and the tests, mypy on harness and analysis (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 20 s: mypy checks every module
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cmd", [["ruff", "check", "harness", "workloads", "analysis", "tests"], ["mypy"]],
                         ids=["ruff", "mypy"])
def test_lint_is_clean(cmd):
    proc = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
