"""Every command the README and docs/ mark as runnable runs as printed on a fresh clone after `make bench` (issue
53): a fenced code block right after a line `<!-- runnable -->` (cheap: --help, dry runs, make help, a published
set's report) or `<!-- runnable: slow -->` (the slow suite), each of its lines through bash, exit 0, in a clone of
this checkout's HEAD whose `main` is that commit (a fresh clone of main: no uncommitted change) and whose `.venv` is
this checkout's (what `make bench` makes). The shell's `#` comments stay as printed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- runnable(: slow)? -->$")


def runnable(slow: bool) -> list[tuple[str, str]]:
    """(where, command) of each line of each marked block."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines):
            match = MARK.match(line.strip())
            if not match or bool(match.group(1)) != slow:
                continue
            start = n + 1
            while start < len(lines) and not lines[start].strip():
                start += 1
            assert lines[start].startswith("```"), f"{page.name}:{n + 1}: the mark is not followed by a code block"
            end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
            out += [(f"{page.name}:{i + 1}", lines[i]) for i in range(start + 1, end) if lines[i].strip()]
    return out


FAST, SLOW = runnable(slow=False), runnable(slow=True)


def test_the_docs_mark_commands_as_runnable():
    pages = {where.split(":")[0] for where, _ in FAST}
    assert {"README.md", "running.md", "results.md"} <= pages, pages
    assert SLOW


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of HEAD, `main` there too, with this checkout's .venv (linked, and ignored as make ignores it)."""
    path = tmp_path_factory.mktemp("clone") / "specbench"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(path)], check=True, timeout=120)
    # `checkout -B`, not `branch -f`: CI's clone has `main` checked out already, a worktree may be detached.
    subprocess.run(["git", "-C", str(path), "checkout", "-q", "-B", "main"], check=True, capture_output=True)
    (path / ".venv").symlink_to(ROOT / ".venv")
    with (path / ".git" / "info" / "exclude").open("a") as f:
        f.write(".venv\n")
    return path


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(("where", "command"), FAST, ids=[w for w, _ in FAST])
def test_a_runnable_command_runs_as_printed(where, command, clone):
    proc = run(command, clone)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize(("where", "command"), SLOW, ids=[w for w, _ in SLOW])
def test_a_slow_runnable_command_runs_as_printed(where, command, clone):
    proc = run(command, clone)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
