"""SIGINT and SIGTERM at every moment of a campaign (harness.runner.stopping): exit 130 / 143, the running
run marked failed with the signal named, its server stopped, its manifest written, nothing recorded lost,
no traceback. Every runner here starts with SIGINT *ignored* (as `cmd &` from a non-interactive shell, nohup
and many CI and batch wrappers start it): the runner's own handlers must not depend on what it inherits.

The moments are held by the runner's fault-injection point (SPECBENCH_HOLD_AT=<phase>: it prints
`specbench: holding at <phase>` and waits there), so the signal lands exactly there:
plan (campaign folder made, no run started), startup (the first run's server started, not ready), warmup
(its warmup requests in flight), measure (its measured requests in flight), scoring (its responses being
scored), report (every run ended, the report about to be written), end (every file written).

Around those: a signal in the runner's first milliseconds (with SIGINT at its default, as in a terminal),
two signals at the very end, and a runner SIGKILLed at the moment it forks its server (tests/support/spawn_race.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from campaigns import SMALL, engine_processes, ports_of, read_jsonl, wait_for

pytestmark = pytest.mark.slow

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
RUN_PHASES = ("startup", "warmup", "measure", "scoring")


def ignore_sigint() -> None:  # runs in the child before exec: the runner inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_runner(
    tmp: Path, hold: str | None, *overrides: str, hold_s: float | None = None
) -> tuple[subprocess.Popen, Path]:
    """The runner on a one-seed embedded_aa campaign (two runs), its output in tmp/out.log; held at `hold`
    (for `hold_s` seconds, or until a signal ends it)."""
    log = tmp / "out.log"
    env = {
        **os.environ,
        **({"SPECBENCH_HOLD_AT": hold} if hold else {}),
        **({"SPECBENCH_HOLD_S": str(hold_s)} if hold_s else {}),
    }
    args = [
        sys.executable,
        "-m",
        "harness.bench",
        f"results_dir={tmp}",
        "campaign=stopped",
        "experiment=embedded_aa",
        "experiment.base_seeds=[3]",
        *SMALL,
        *overrides,
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=ignore_sigint)
    return proc, log


def stop(proc: subprocess.Popen, sig: int, timeout: float = 120) -> int:
    try:
        proc.send_signal(sig)
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def held(log: Path, phase: str) -> bool:
    return f"specbench: holding at {phase}" in log.read_text()


def check_no_server_left(root: Path) -> None:
    ports = ports_of(root) if (root / "runs").exists() else set()
    wait_for(lambda: not engine_processes(ports), timeout=30)


@pytest.fixture
def burners():
    """Two processes that keep both CPUs busy while a test runs (the runner stops under load)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def check_run_stopped(tmp: Path, sig: int, code: int, phase: str) -> None:
    out = (tmp / "out.log").read_text()
    root = tmp / "embedded_aa" / "stopped"
    assert code == EXIT[sig], out
    assert "Traceback" not in out and "Exception ignored" not in out, out
    assert f"interrupted ({sig.name})" in out and re.search(
        r"Resume with \S*python\S* -m harness\.bench results_dir=\S+ .*campaign=stopped", out.replace("\n", " ")
    ), out
    first = sorted((root / "runs").iterdir())[0]
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"] == f"interrupted by {sig.name}", manifest["error"]
    assert manifest["t_end_unix"] is not None and manifest["log_checks"] is not None
    order = json.loads((root / "campaign.json").read_text())["order_run"]
    assert [(o["run_id"], o["status"]) for o in order] == [(first.name, "failed")]
    records = read_jsonl(first / "records.jsonl") if (first / "records.jsonl").exists() else []
    warm = [r for r in records if r["warmup"]]
    if phase == "warmup":  # requests in flight when the signal came are not recorded; none is measured
        assert len(warm) == len(records)
    if phase in ("measure", "scoring"):  # the warmup had ended: its records are all there
        assert len(warm) == 2
    if phase == "scoring":  # every request had ended, and what was scored before the signal stays
        assert len(records) == 2 + 4 and len(read_jsonl(first / "scores.jsonl")) >= 1
    check_no_server_left(root)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", RUN_PHASES)
def test_a_stop_signal_during_a_run_fails_it_and_stops_its_server(tmp_path, phase, sig):
    proc, log = start_runner(tmp_path, phase)
    wait_for(lambda: held(log, phase) or proc.poll() is not None)
    check_run_stopped(tmp_path, sig, stop(proc, sig), phase)


@pytest.mark.parametrize(
    ("phase", "sig"),
    [("startup", signal.SIGTERM), ("measure", signal.SIGINT)],
    ids=["startup-SIGTERM", "measure-SIGINT"],
)
def test_a_stop_signal_under_cpu_load(tmp_path, burners, phase, sig):
    proc, log = start_runner(tmp_path, phase)
    wait_for(lambda: held(log, phase) or proc.poll() is not None, timeout=240)
    check_run_stopped(tmp_path, sig, stop(proc, sig), phase)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_before_any_run_launches_nothing(tmp_path, sig):
    proc, log = start_runner(tmp_path, "plan")
    wait_for(lambda: held(log, "plan") or proc.poll() is not None)
    code = stop(proc, sig)
    out = log.read_text()
    assert code == EXIT[sig] and "Traceback" not in out, out
    assert f"interrupted ({sig.name}) before any run started; nothing was launched" in out.replace("\n", " "), out
    root = tmp_path / "embedded_aa" / "stopped"
    assert (root / "campaign.json").exists() and not (root / "runs").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A results folder holding the finished campaign `stopped` (both runs), made once."""
    tmp = tmp_path_factory.mktemp("finished")
    proc, log = start_runner(tmp, None)
    assert proc.wait(timeout=240) == 0, log.read_text()
    return tmp


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_while_the_report_is_written_keeps_every_run(tmp_path, finished, sig):
    """Resuming the finished campaign goes straight to the report; the signal lands there."""
    shutil.copytree(finished / "embedded_aa", tmp_path / "embedded_aa")
    proc, log = start_runner(tmp_path, "report", "report=true")
    wait_for(lambda: held(log, "report") or proc.poll() is not None)
    code = stop(proc, sig)
    out = log.read_text()
    assert code == EXIT[sig] and "Traceback" not in out, out
    flat = out.replace("\n", " ")
    assert f"interrupted ({sig.name}) while writing the report: every run had ended (2 finished)" in flat, out
    assert "make report DIR=" in flat, out
    root = tmp_path / "embedded_aa" / "stopped"
    statuses = [json.loads(p.read_text())["status"] for p in sorted(root.glob("runs/*/manifest.json"))]
    assert statuses == ["finished", "finished"]


def catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has installed a handler of `sig` (Linux: SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(mask & (1 << (sig - 1)))


def test_a_stop_signal_while_starting_is_one_line(tmp_path):
    """SIGINT as soon as the handlers are installed, while the runner imports its modules (Hydra, the runner,
    the workloads come after the handlers). Sent before that, with SIGINT ignored by the parent as here, no
    process could see it: the interpreter itself is still starting (a fixed sleep raced with that under load)."""
    proc, log = start_runner(tmp_path, None)
    wait_for(lambda: catches(proc.pid, signal.SIGINT) or proc.poll() is not None, step=0.001)
    code = stop(proc, signal.SIGINT)
    out = log.read_text()
    assert code == 130 and "Traceback" not in out, out
    assert "interrupted (SIGINT)" in out and "nothing was launched" in out.replace("\n", " "), out


def test_a_signal_in_the_first_milliseconds_is_a_clean_stop_once_the_runner_runs(tmp_path):
    """SIGINT from 0 to 150 ms after the start, SIGINT at its default: 130 and one line once harness/bench.py's
    main() has begun; before that Python's own start-up is what is interrupted (death by the signal, or a
    KeyboardInterrupt through the interpreter's import machinery), never a traceback through the runner's code
    but the first import lines of harness/bench.py."""
    bench = Path(__file__).resolve().parents[2] / "harness" / "bench.py"
    main_line = next(i for i, line in enumerate(bench.read_text().splitlines(), 1) if line.startswith("def main"))
    outcomes = []
    for ms in [*range(0, 160, 10), None]:  # None: as soon as the runner's handlers are in (SIGTERM caught)
        args = [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={tmp_path}",
            "experiment=embedded_aa",
            "experiment.base_seeds=[3]",
            *SMALL,
        ]
        # SIGINT at its default in the runner, as from a terminal (an xdist worker's children inherit it ignored)
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        if ms is None:
            wait_for(lambda proc=proc: catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, step=0.001)
        else:
            time.sleep(ms / 1000)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        outcomes.append((ms, proc.returncode))
        if proc.returncode == 130:
            assert "Traceback" not in out and "interrupted (SIGINT)" in out, out
            continue
        assert proc.returncode in (-signal.SIGINT, 1), out
        for line in out.splitlines():  # where the KeyboardInterrupt went through: Python's start-up only
            if line.strip().startswith('File "') and "/harness/" in line:
                assert line.strip().startswith(f'File "{bench}"'), out
                assert int(line.split(", line ")[1].split(",")[0]) < main_line, out
    assert outcomes[-1][1] == 130 and not (tmp_path / "embedded_aa").exists(), outcomes  # nothing was launched


UNRAISABLE = """
import os, signal
from harness.runner.stopping import Stopped, StopSignals
stops = StopSignals.ensure()
class Finalised:
    def __init__(self, send):
        self.send = send
    def __del__(self):  # Python cannot raise out of here: it reports the exception as unraisable
        if self.send:
            os.kill(os.getpid(), signal.SIGINT)
        else:
            raise ValueError("an unrelated error in a finaliser")
Finalised(False)
print("still running")
Finalised(True)
print("still running")
try:
    stops.check()
except Stopped as stop:
    print("stopped at the check:", stop.name)
"""


BETWEEN_HANDLERS = """
import os, signal
from harness.runner import stopping
install = signal.signal
def install_then_signal(sig, handler):  # SIGINT lands right after its handler went in, before SIGTERM's did
    previous = install(sig, handler)
    if sig == signal.SIGINT:
        os.kill(os.getpid(), signal.SIGINT)
    return previous
signal.signal = install_then_signal
stops = stopping.StopSignals.ensure()
signal.signal = install
print("installed", signal.getsignal(signal.SIGTERM) == stops._on_signal)
try:
    stops.check()
except stopping.Stopped as stop:
    print("stopped at the check:", stop.name)
"""


def test_a_signal_while_the_handlers_go_in_is_raised_at_the_check_not_inside_ensure():
    """A fresh-clone run of 2026-12-04: SIGINT came after ensure() had put in the SIGINT handler and before the
    SIGTERM one; the handler raised Stopped inside ensure(), outside harness.bench.main's try (a traceback, exit
    1). ensure() now notes it, every handler goes in, and the caller's check raises it."""
    proc = subprocess.run(
        [sys.executable, "-c", BETWEEN_HANDLERS],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout.splitlines() == ["installed True", "stopped at the check: SIGINT"], proc
    assert "Traceback" not in proc.stderr, proc


def test_a_signal_python_cannot_raise_is_silent_and_acted_on_at_the_next_check():
    """The CI failure of 2026-12-03: a SIGINT that lands in a weakref callback of the import machinery (or in any
    finaliser) printed "Exception ignored ... Stopped: SIGINT"; it is now noted silently and raised at the next
    check, while other unraisable errors are still reported."""
    proc = subprocess.run(
        [sys.executable, "-c", UNRAISABLE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout.splitlines() == ["still running", "still running", "stopped at the check: SIGINT"], proc
    assert "ValueError: an unrelated error in a finaliser" in proc.stderr and "Stopped" not in proc.stderr, proc


def test_two_signals_at_the_very_end_change_nothing(tmp_path, finished):
    """Every file written (the hold at `end`): both signals are noted and ignored, the exit code is the
    campaign's, and the interpreter's teardown prints nothing."""
    shutil.copytree(finished / "embedded_aa", tmp_path / "embedded_aa")
    proc, log = start_runner(tmp_path, "end", "report=false", hold_s=1.0)  # (ignored signals do not end a hold)
    wait_for(lambda: held(log, "end") or proc.poll() is not None)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.002)
    code = stop(proc, signal.SIGINT)
    out = log.read_text()
    assert code == 0 and "Traceback" not in out and "Exception ignored" not in out, out


def test_a_runner_killed_as_it_forks_its_server_leaves_no_server_behind(tmp_path, burners):
    """100 runners, each SIGKILLed 0-4 ms after it starts forking its server, under CPU load."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "support" / "spawn_race.py"), "100", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "left behind: 0", proc.stdout + proc.stderr


def test_a_second_signal_while_stopping_does_not_break_the_stop(tmp_path):
    proc, log = start_runner(tmp_path, "measure")
    wait_for(lambda: held(log, "measure") or proc.poll() is not None)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    code = stop(proc, signal.SIGINT)
    assert "already stopping after SIGTERM" in log.read_text() or code == 143
    check_run_stopped(tmp_path, signal.SIGTERM, code, "measure")
