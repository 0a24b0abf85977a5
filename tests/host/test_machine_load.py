"""Machine load around a run (manifest `machine`) and CPU pinning (issue 11 item 8).

The counters are checked against real processes: CPU burnt by this process or a child of it is ours,
CPU burnt by a process outside our tree is "other". End to end, a foreign CPU burner started during the
second run of a campaign raises that run's cpu_other_frac well above the first's; a pinned campaign
runs its server on server.cpus and its client on client.cpus; bad CPU lists fail before any launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from campaigns import SMALL, bench, engine_processes, ports_of, read_jsonl, wait_for

from configs import composed
from harness.contract import to_json
from harness.host import machine
from harness.host.machine import Counters, CpuPin
from harness.validation import ConfigError

BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"
H200_LINE = "0, 540, 32, 0\n"  # nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,utilization.gpu on an H200


def test_gpu_status_parses_nvidia_smi_rows():
    assert [to_json(g) for g in machine.parse_gpu_status(H200_LINE)] == [
        {"index": 0, "sm_clock_mhz": 540, "temperature_c": 32, "utilization_pct": 0}
    ]
    rows = "0, 1980, 61, 97\n1, [N/A], [Not Supported], 3\nNo devices were found\n"
    assert [to_json(g) for g in machine.parse_gpu_status(rows)] == [
        {"index": 0, "sm_clock_mhz": 1980, "temperature_c": 61, "utilization_pct": 97},
        {"index": 1, "sm_clock_mhz": None, "temperature_c": None, "utilization_pct": 3},
    ]
    assert machine.parse_gpu_status("") == []


def test_window_arithmetic():
    cores = machine.cores()
    c0 = Counters(
        t_mono=10.0, t_unix=1.0, busy_s=100.0, total_s=400.0, steal_s=4.0, ours_s={(1, 5.0): 1.0, (2, 6.0): 3.0}
    )
    c1 = Counters(
        t_mono=12.0,
        t_unix=3.0,
        busy_s=100.0 + 1.5 * cores,
        total_s=400.0 + 2 * cores,
        steal_s=4.0 + 0.2 * cores,
        ours_s={(1, 5.0): 1.25, (3, 11.0): 0.25},
    )  # pid 2 exited, 3 was born
    doc = to_json(machine.during(c0, c1))
    assert doc["cpu_ours_s"] == 0.5 and doc["wall_s"] == 2.0 and doc["cpu_total_s"] == 1.5 * cores
    assert doc["cpu_other_frac"] == pytest.approx((1.5 * cores - 0.5) / (2 * cores), abs=1e-4)
    assert doc["steal_frac"] == 0.1
    snap = to_json(machine.snapshot(c0, c1, None))
    assert snap["cpu_other"] == doc["cpu_other_frac"] and snap["steal"] == 0.1 and snap["gpus"] is None
    assert snap["t_unix"] == 3.0 and len(snap["load_avg"]) == 3
    no_steal = Counters(12.0, 3.0, 100.0, 400.0 + 2 * cores, None, {})
    assert machine.steal_fraction(c0, no_steal) is None
    # more busy time seen in our processes than in the whole machine (counter granularity): 0, never below
    assert machine.other_fraction(c0, Counters(12.0, 3.0, 100.0, 404.0, 4.0, {(1, 5.0): 9.0})) == 0.0


def detached_burner(seconds: float) -> int:
    """A CPU burner outside this process's tree (double fork: its parent exits at once); its pid."""
    launcher = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {BURN.format(s=seconds)!r}], start_new_session=True,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid)\n"
    )
    return int(subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, check=True).stdout)


def cpu_of(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def window_until(proc: psutil.Process, cpu_s: float, timeout: float = 120.0) -> tuple[dict, float]:
    """machine.during over a window that lasts until `proc` has used `cpu_s` CPU-seconds (however long a loaded
    machine takes to give them: no share of a core is assumed), and the CPU-seconds it used in that window."""
    c0, p0 = machine.read_counters(), cpu_of(proc)
    deadline = time.monotonic() + timeout
    while cpu_of(proc) - p0 < cpu_s:
        if time.monotonic() > deadline:
            pytest.fail(f"pid {proc.pid} got {cpu_of(proc) - p0:.2f} of {cpu_s} CPU-s in {timeout:.0f} s")
        time.sleep(0.05)
    p1, c1 = cpu_of(proc), machine.read_counters()
    return to_json(machine.during(c0, c1)), p1 - p0


def test_a_child_is_ours_and_a_stranger_is_other():
    """What the counters decide, whatever share of a core each burner gets: the child's CPU-seconds in a window are
    counted as ours, a stranger's as other (not ours). At load 10-12 on 2 cores a burner got 0.13 CPU-s in 1 s,
    so the windows last until each burner has used 0.2 CPU-s rather than a fixed second."""
    child = subprocess.Popen([sys.executable, "-c", BURN.format(s=300)])
    try:
        assert child.pid in {p.pid for p in machine.our_processes()}
        mine, child_s = window_until(psutil.Process(child.pid), 0.2)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert mine["cpu_ours_s"] >= child_s - 0.03, (mine, child_s)  # counted as ours
    stranger = psutil.Process(detached_burner(300))
    try:
        assert stranger.pid not in {p.pid for p in machine.our_processes()}
        theirs, stranger_s = window_until(stranger, 0.2)
    finally:
        stranger.kill()
    assert theirs["cpu_ours_s"] < stranger_s, (theirs, stranger_s)  # not ours (this test process only polls)
    other_s = theirs["cpu_other_frac"] * theirs["wall_s"] * machine.cores()
    assert other_s >= stranger_s - 0.05, (theirs, stranger_s)  # counted as other


def test_cpu_pin_pins_and_restores():
    start = os.sched_getaffinity(0)
    if len(start) < 2:
        pytest.skip("needs two CPUs")
    first = min(start)
    pin = CpuPin([first])
    pin.acquire()
    pin.acquire()  # a second run of a parallel slot
    assert os.sched_getaffinity(0) == {first}
    pin.release()
    assert os.sched_getaffinity(0) == {first}  # one holder left
    pin.release()
    assert os.sched_getaffinity(0) == start
    CpuPin([]).acquire()  # no pinning: nothing changes
    assert os.sched_getaffinity(0) == start


def test_bad_cpus_fail_at_config_time(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    missing = max(allowed) + 1000
    with pytest.raises(
        ConfigError,
        match=rf"server.cpus=\[{missing}\] names CPU\(s\) \[{missing}\] that this "
        r"process may not run on \(allowed: ",
    ):
        composed(f"server.cpus=[{missing}]")
    with pytest.raises(ConfigError, match=r"client.cpus=\[.*\] lists a CPU twice"):
        composed(f"client.cpus=[{allowed[0]},{allowed[0]}]")
    with pytest.raises(
        ConfigError,
        match=rf"share CPU\(s\) \[{allowed[0]}\]; give the server and the client "
        "separate CPUs",
    ):
        composed(f"server.cpus=[{allowed[0]}]", f"client.cpus=[{allowed[0]}]")
    proc = bench(tmp_path, f"client.cpus=[{missing}]", *SMALL)
    assert proc.returncode == 2 and f"client.cpus=[{missing}]" in proc.stdout.replace("\n", ""), proc.stdout
    assert not any(tmp_path.iterdir())  # nothing was created, let alone launched


# ---------------------------------------------------------------------------------------------- end to end

# the default 1 s load samples: the burner test reads the `after` sample
LONGER = [
    *(o for o in SMALL if not o.startswith("load_sample_s=")),
    "sampling.max_new_tokens=640",
    "sampling.ignore_eos=true",
]


def run_manifests(root: Path) -> list[dict]:
    plan = json.loads((root / "campaign.json").read_text())["plan"]
    return [json.loads((root / "runs" / r["run_id"] / "manifest.json").read_text()) for r in plan]


class CpuTimeline:
    """Polls the summed CPU time of some processes (monotonic time, CPU-seconds) from a thread."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs, self.points, self._stop = procs, [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.points.append((time.monotonic(), sum(cpu_of(p) for p in self.procs)))
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> float:
        """CPU-seconds used in [t0, t1] (the last poll at or before t0, the first at or after t1)."""
        before = [c for t, c in self.points if t <= t0]
        after = [c for t, c in self.points if t >= t1]
        return (after[0] if after else self.points[-1][1]) - (before[-1] if before else 0.0)


def second_run_measures(root: Path) -> bool:
    """Whether the campaign's second run has ended its warmup (its measured window begins)."""
    files = sorted(root.glob("runs/*/records.jsonl"))  # run folders are named by their place in the order
    return len(files) >= 2 and any(r["warmup"] for r in read_jsonl(files[1]))


@pytest.mark.slow
def test_a_foreign_cpu_burner_shows_in_cpu_other(tmp_path):
    """Burners started by the test (not the runner's children) once the second run of a campaign measures: their
    CPU time inside that run's measured window is in its cpu_other_frac. (This machine is shared, so the
    first run's own cpu_other_frac is whatever the neighbours did: the burnt run is checked against the
    burners' measured CPU time rather than against a number.)"""
    root = tmp_path / "embedded_aa" / "burn"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={tmp_path}",
            "campaign=burn",
            "experiment=embedded_aa",
            "experiment.base_seeds=[3]",
            *LONGER,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    burners: list[subprocess.Popen] = []
    timeline = None
    try:
        wait_for(lambda: second_run_measures(root), timeout=180)
        burners = [subprocess.Popen([sys.executable, "-c", BURN.format(s=300)]) for _ in range(2 * machine.cores())]
        timeline = CpuTimeline([psutil.Process(b.pid) for b in burners])
        out, _ = runner.communicate(timeout=240)
    finally:
        if timeline is not None:
            timeline.stop()
        for b in burners:
            b.kill()
            b.wait()
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out
    idle, burnt = run_manifests(root)
    assert idle["status"] == burnt["status"] == "finished"
    measured = [r for r in read_jsonl(root / "runs" / burnt["run_id"] / "records.jsonl") if not r["warmup"]]
    t0, t1 = min(r["t_sent"] for r in measured), max(r["t_end"] for r in measured)
    burnt_s = timeline.between(t0, t1)
    during = burnt["machine"]["during"]
    # the measured window (a loaded machine may be slow to read the counters at its end)
    assert t1 - t0 <= during["wall_s"] <= t1 - t0 + 5.0, (during, t1 - t0)
    assert burnt_s > 0.05, burnt_s  # the burners did run in the window (how much: whatever the machine gave them)
    other_s = during["cpu_other_frac"] * during["wall_s"] * machine.cores()
    assert other_s >= burnt_s - 0.05, (during, burnt_s)
    assert during["cpu_other_frac"] >= burnt_s / (during["wall_s"] * machine.cores()) - 0.05
    # 2 x cores burners against an idle server: well above an idle machine (on a loaded
    # CI machine the burners share the cores with whatever else runs, so no more is asserted)
    assert burnt["machine"]["after"]["cpu_other"] >= 0.4, burnt["machine"]["after"]
    print(
        f"cpu_other_frac: first run {idle['machine']['during']['cpu_other_frac']}, burnt run "
        f"{during['cpu_other_frac']} (burners {burnt_s:.2f} CPU-s in a {t1 - t0:.2f} s window)"
    )


@pytest.mark.slow
def test_pinned_server_and_client(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    server_cpu, client_cpu = cpus[-1], cpus[0]
    root = tmp_path / "embedded_aa" / "pin"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={tmp_path}",
            "campaign=pin",
            "experiment=embedded_aa",
            "experiment.base_seeds=[3]",
            *SMALL[:-2],
            "client.concurrency=1",
            "sampling.max_new_tokens=256",
            "sampling.ignore_eos=true",
            "report=false",
            f"server.cpus=[{server_cpu}]",
            f"client.cpus=[{client_cpu}]",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def measuring() -> list[psutil.Process] | None:
            files = list(root.glob("runs/*/records.jsonl"))
            if not files or not any(not r["warmup"] for r in read_jsonl(files[0])):
                return None
            return engine_processes(ports_of(root)) or None

        (server,) = wait_for(measuring)
        server_affinity = server.cpu_affinity()
        runner_affinity = psutil.Process(runner.pid).cpu_affinity()  # the runner's event-loop thread
        out, _ = runner.communicate(timeout=240)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out
    assert server_affinity == [server_cpu] and runner_affinity == [client_cpu]
    for man in run_manifests(root):
        assert man["server_cpus"] == [server_cpu] and man["client"]["cpus"] == [client_cpu]
