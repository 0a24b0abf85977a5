"""A temporary git repository holding a copy of this project's harness/ (branch `change` one observable line
apart: the embedded server's ready line), and the overrides that make two arms of it (shared by the code-under-test
and source-cache tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


SERVICE = Path("harness/engine/service.py")


READY = 'READY_LINE = "The server is fired up and ready to roll!"'


CHANGED = 'READY_LINE = "The server is fired up and ready to roll! (arm change)"'


def squash(text: str) -> str:
    """Text without whitespace (rich wraps long lines anywhere)."""
    return "".join(text.split())


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def make_repo(where: Path, path: Path = SERVICE, old: str = READY, new: str = CHANGED) -> Path:
    """A git repository holding a copy of harness/ on `main`, and branch `change` with another ready line (or, given
    `path`, `old` and `new`, that other one-line change)."""
    repo = where / "project"
    shutil.copytree(ROOT / "harness", repo / "harness", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "main")
    git(repo, "checkout", "-q", "-b", "change")
    changed = repo / path
    assert old in changed.read_text()
    changed.write_text(changed.read_text().replace(old, new))
    git(repo, "commit", "-q", "-am", f"change {path}")
    git(repo, "checkout", "-q", "main")
    return repo


def arms(repo: Path, base: str = "main", change: str = "change") -> list[str]:
    return [
        f"experiment.arms.0.source.repo={repo}",
        f"experiment.arms.0.source.ref={base}",
        f"experiment.arms.1.source.repo={repo}",
        f"experiment.arms.1.source.ref={change}",
    ]
