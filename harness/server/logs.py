"""The server's log: its tail (for error messages) and the log checks (regexes that must or must not
appear after readiness and at the end of a run)."""

from __future__ import annotations

import re
from pathlib import Path

from harness.contract import LogCheckResult
from harness.server.config import LogChecks


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def check_log(path: Path, checks: LogChecks) -> LogCheckResult:
    """Which regexes of `checks` the log holds so far, and whether that passes."""
    text = path.read_text(errors="replace") if path.exists() else ""
    must = {r: re.search(r, text, re.MULTILINE) is not None for r in checks.must}
    must_not = {r: re.search(r, text, re.MULTILINE) is not None for r in checks.must_not}
    return LogCheckResult(must=must, must_not=must_not, passed=all(must.values()) and not any(must_not.values()))


def describe_failed_checks(result: LogCheckResult) -> str:
    missing = [r for r, ok in result.must.items() if not ok]
    present = [r for r, hit in result.must_not.items() if hit]
    parts = ([f"missing {missing}"] if missing else []) + ([f"present but forbidden {present}"] if present else [])
    return "; ".join(parts)
