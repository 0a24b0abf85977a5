"""Ask a server's own interpreter a question: run one of the harness's probe scripts with that interpreter, in
the server's environment, and read the JSON line the script prints after its mark (the argv preflight and
the provenance probe both work this way, so that facts are read where the server will run)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any


class AskError(RuntimeError):
    """The interpreter could not answer: it cannot be run, it timed out, or it printed no answer."""


def ask(python: str, script: Path, args: list[str], *, mark: str, env: dict[str, str], timeout_s: float,
        stdin: str | None = None, cwd: Path | None = None, what: str = "the probe") -> dict[str, Any]:
    """The last `mark`-prefixed JSON line `python script ARGS` prints (its environment: ours plus `env`)."""
    try:
        proc = subprocess.run([python, str(script), *args], input=stdin, capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, **env}, cwd=cwd, check=False)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise AskError(f"the server interpreter {python} cannot be run ({exc.strerror or exc})") from None
    except subprocess.TimeoutExpired:
        raise AskError(f"{what} in {python} did not answer within {timeout_s:.0f} s") from None
    marked = [line[len(mark):] for line in proc.stdout.splitlines() if line.startswith(mark)]
    if not marked:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise AskError(f"{what} in {python} exited with code {proc.returncode} without an answer:\n{tail}")
    return json.loads(marked[-1])
