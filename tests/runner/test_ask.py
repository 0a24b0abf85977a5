"""harness.server.ask: questions to a server's own interpreter, several at once, none left running."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.server.ask import AskError, Question, ask, ask_all

MARK = "ANSWER "
# Writes its pid, then waits (up to 60 s) for the file its argument names: two copies that wait for each other
# answer only when they run side by side. Answers with what it read on stdin.
RENDEZVOUS = """
import json, os, sys, time
me, other = sys.argv[1], sys.argv[2]
request = sys.stdin.read()
open(me, "w").write(str(os.getpid()))
deadline = time.monotonic() + 60
while not os.path.exists(other) and time.monotonic() < deadline:
    time.sleep(0.02)
print(MARK + json.dumps({"request": request, "saw_other": os.path.exists(other)}))
""".replace("MARK", repr(MARK))


def _question(script: Path, *args: str, timeout_s: float = 60, stdin: str | None = None) -> Question:
    return Question(sys.executable, script, list(args), MARK, {}, timeout_s, stdin=stdin)


@pytest.fixture
def rendezvous(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(RENDEZVOUS)
    return script


def _gone(pid: int) -> bool:
    """No such process (ask_all reaps what it kills)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_questions_run_side_by_side_each_with_its_own_request(rendezvous: Path, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    answers = ask_all([_question(rendezvous, a, b, stdin="first"), _question(rendezvous, b, a, stdin="second")])
    assert answers == [{"request": "first", "saw_other": True}, {"request": "second", "saw_other": True}]


def test_each_question_gets_its_answer_or_the_error_that_says_why(rendezvous: Path, tmp_path: Path) -> None:
    silent = tmp_path / "silent.py"
    silent.write_text("import sys\nprint('no mark here', file=sys.stderr)\nsys.exit(3)\n")
    both = str(tmp_path / "both")
    open(both, "w").close()
    missing = Question(str(tmp_path / "no-python"), rendezvous, [], MARK, {}, 10)
    answers = ask_all([missing, _question(silent), _question(rendezvous, str(tmp_path / "x"), both)])
    assert isinstance(answers[0], AskError) and "no-python cannot be run" in str(answers[0])
    assert isinstance(answers[1], AskError) and "exited with code 3 without an answer" in str(answers[1])
    assert "no mark here" in str(answers[1])
    assert answers[2] == {"request": "", "saw_other": True}
    with pytest.raises(AskError, match="exited with code 3"):
        ask(sys.executable, silent, [], mark=MARK, env={}, timeout_s=10)


def test_a_question_past_its_time_is_an_error_and_its_process_is_killed(rendezvous: Path, tmp_path: Path) -> None:
    me = tmp_path / "me"
    t0 = time.monotonic()
    answer = ask_all([_question(rendezvous, str(me), str(tmp_path / "never"), timeout_s=1.5)])[0]
    assert isinstance(answer, AskError) and "did not answer within 2 s" in str(answer)
    assert _gone(int(me.read_text())) and time.monotonic() - t0 < 30  # killed, not waited for (60 s)


def test_an_interruption_while_waiting_leaves_no_probe_running(rendezvous: Path, tmp_path: Path) -> None:
    """A stop signal raises in the main thread while it waits: every probe started is killed before it goes on."""
    me, other = tmp_path / "me", tmp_path / "other"

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)  # not SIGALRM: pytest-timeout's
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGUSR1))  # handled in the main thread
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ask_all(
                [
                    _question(rendezvous, str(me), str(tmp_path / "never")),
                    _question(rendezvous, str(other), str(tmp_path / "never")),
                ]
            )
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert _gone(int(me.read_text())) and _gone(int(other.read_text()))
    assert time.monotonic() - t0 < 30  # killed, not waited for (60 s)
