"""Ask a server's own interpreter a question: run one of the harness's probe scripts with that interpreter, in
the server's environment, and read the JSON line the script prints after its mark (the argv preflight and
the provenance probe both work this way, so that facts are read where the server will run). Several questions
(an experiment's arms on their own interpreters) are asked at once, side by side."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil


class AskError(RuntimeError):
    """The interpreter could not answer: it cannot be run, it timed out, or it printed no answer."""


@dataclass(frozen=True)
class Question:
    """`python script ARGS` in our environment plus `env`, `stdin` written to it, the answer after `mark`."""

    python: str
    script: Path
    args: list[str]
    mark: str
    env: dict[str, str]
    timeout_s: float
    stdin: str | None = None
    cwd: Path | None = None
    what: str = "the probe"


def ask(
    python: str,
    script: Path,
    args: list[str],
    *,
    mark: str,
    env: dict[str, str],
    timeout_s: float,
    stdin: str | None = None,
    cwd: Path | None = None,
    what: str = "the probe",
) -> dict[str, Any]:
    """The last `mark`-prefixed JSON line `python script ARGS` prints (its environment: ours plus `env`)."""
    answer = ask_all([Question(python, script, args, mark, env, timeout_s, stdin, cwd, what)])[0]
    if isinstance(answer, AskError):
        raise answer
    return answer


def ask_all(questions: list[Question]) -> list[dict[str, Any] | AskError]:
    """Every question at once, a process each running side by side: the answer of each, or the AskError that
    says why it has none. Each has its own time limit, counted from when they all start. Whatever ends this
    call (a stop signal included) leaves no probe running, nor anything a probe started (its whole process
    group and every descendant still alive is killed, a probe that ignores SIGTERM included)."""
    procs: list[subprocess.Popen | AskError] = []
    try:
        for q in questions:
            procs.append(_start(q))
        started = time.monotonic()
        return [p if isinstance(p, AskError) else _answer(q, p, started) for q, p in zip(questions, procs, strict=True)]
    finally:
        for p in procs:
            if isinstance(p, subprocess.Popen):
                kill_tree(p)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`, its process group (it leads one: start_new_session) and each descendant, then reap it."""
    family: list[psutil.Process] = []
    if proc.poll() is None:  # not reaped yet, so its pid is still its own
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            member.kill()
    proc.wait()


def _start(q: Question) -> subprocess.Popen | AskError:
    try:
        proc = subprocess.Popen(
            [q.python, str(q.script), *q.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **q.env},
            cwd=q.cwd,
            start_new_session=True,  # its own process group: whatever it forks is killed with it
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        return AskError(f"the server interpreter {q.python} cannot be run ({exc.strerror or exc})")
    stdin, proc.stdin = proc.stdin, None  # communicate() has nothing left to write
    # a small request: it fits the pipe, so each probe reads it (to its end) whenever it gets to it
    with contextlib.suppress(BrokenPipeError):  # one that exited before reading: its output says why
        stdin.write(q.stdin or "")  # type: ignore[union-attr]
    with contextlib.suppress(BrokenPipeError):
        stdin.close()  # type: ignore[union-attr]
    return proc


def _answer(q: Question, proc: subprocess.Popen, started: float) -> dict[str, Any] | AskError:
    try:
        out, err = proc.communicate(timeout=max(0.0, started + q.timeout_s - time.monotonic()))
    except subprocess.TimeoutExpired:
        return AskError(f"{q.what} in {q.python} did not answer within {q.timeout_s:.0f} s")
    marked = [line[len(q.mark) :] for line in out.splitlines() if line.startswith(q.mark)]
    if not marked:
        tail = "\n".join((err or out).strip().splitlines()[-8:])
        return AskError(f"{q.what} in {q.python} exited with code {proc.returncode} without an answer:\n{tail}")
    return json.loads(marked[-1])
