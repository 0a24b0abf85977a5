"""How loaded the machine is around a run (manifest `machine`, docs/records.md), and CPU pinning.

A run is only as clean as the machine it ran on: another process burning CPU, a throttled or busy GPU,
steal time on a VM all move throughput while the acceptance length stays put. The runner records:

- `before` / `after`: short samples (`load_sample_s`, 1 s by default) just before the server is
  launched and just after the last request: the load average, the fraction of all CPUs busy in processes outside the harness (the runner and
  every process it started, the server's tree included), steal time, and each GPU's SM clock,
  temperature and utilisation (nvidia-smi; null without it).
- `during`: CPU-seconds of every process and of ours over the measured window, from counters read at
  its start and its end.
- the server's own CPU time over the measured window (manifest `server_cpu`): its process tree's user and
  system seconds, read at both ends (`tree_times`, `server_cpu`).

Every probe tolerates what a machine lacks (no steal counter, no nvidia-smi, a process that exited):
the value is null, a run never fails for it.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import psutil

from harness.contract import GpuStatus, LoadDuring, LoadSnapshot, ServerCpu
from harness.host.envinfo import run_tool

_NVIDIA_SMI_QUERY = "--query-gpu=index,clocks.sm,temperature.gpu,utilization.gpu"
_IDLE_FIELDS = ("idle", "iowait")
_GUEST_FIELDS = ("guest", "guest_nice")  # already counted in user / nice on Linux


@dataclass(frozen=True)
class Counters:
    """System-wide and per-process CPU counters at one instant."""

    t_mono: float
    t_unix: float
    busy_s: float  # CPU-seconds spent busy, all CPUs, since boot (idle, iowait and steal excluded)
    total_s: float  # every CPU-second since boot (busy + idle + iowait + steal)
    steal_s: float | None  # None where the kernel does not report steal
    ours_s: dict[tuple[int, float], float] = field(default_factory=dict)  # (pid, create_time) -> user + system


def our_processes() -> list[psutil.Process]:
    """The runner and every process it started, recursively (the servers and their children)."""
    me = psutil.Process()
    try:
        return [me, *me.children(recursive=True)]
    except psutil.Error:
        return [me]


def _cpu_seconds(procs: list[psutil.Process]) -> dict[tuple[int, float], float]:
    out = {}
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                out[(proc.pid, proc.create_time())] = times.user + times.system
        except psutil.Error:
            continue  # exited or not ours to read: its time falls to "other", never an error
    return out


@dataclass(frozen=True)
class TreeTimes:
    """A process tree's CPU times at one instant: (pid, create_time) -> (user, system) seconds of each process, its
    reaped children's included (a child that ends inside the window is counted by its parent)."""

    pid: int
    t_mono: float
    times: dict[tuple[int, float], tuple[float, float]]


def tree_times(pid: int | None) -> TreeTimes | None:
    """The CPU times of process `pid` and its descendants now; None when `pid` cannot be read (or is None: a server
    the run did not start)."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    out = {}
    for proc in procs:
        try:
            with proc.oneshot():
                t = proc.cpu_times()
                out[(proc.pid, proc.create_time())] = (t.user + t.children_user, t.system + t.children_system)
        except psutil.Error:
            continue  # ended between the listing and the read: its parent has its time by the next read
    return TreeTimes(pid, time.monotonic(), out) if out else None


def server_cpu(t0: TreeTimes | None, t1: TreeTimes | None) -> ServerCpu | None:
    """The manifest's `server_cpu`: what the tree spent between two reads (a process born in between from 0);
    None when either read failed."""
    if t0 is None or t1 is None:
        return None
    user = sum(max(0.0, u - t0.times.get(key, (0.0, 0.0))[0]) for key, (u, _) in t1.times.items())
    system = sum(max(0.0, s - t0.times.get(key, (0.0, 0.0))[1]) for key, (_, s) in t1.times.items())
    return ServerCpu(
        pid=t0.pid,
        processes=len(set(t0.times) | set(t1.times)),
        user_s=round(user, 3),
        system_s=round(system, 3),
        cpu_s=round(user + system, 3),
        wall_s=round(t1.t_mono - t0.t_mono, 4),
    )


def read_counters() -> Counters:
    """The counters now: system CPU times (psutil.cpu_times) and the CPU time of our processes."""
    times = psutil.cpu_times()._asdict()
    guest = sum(times.get(k, 0.0) for k in _GUEST_FIELDS)
    total = sum(times.values()) - guest
    steal = times.get("steal")
    idle = sum(times.get(k, 0.0) for k in _IDLE_FIELDS)
    return Counters(
        t_mono=time.monotonic(),
        t_unix=time.time(),
        busy_s=total - idle - (steal or 0.0),
        total_s=total,
        steal_s=steal,
        ours_s=_cpu_seconds(our_processes()),
    )


def ours_between(c0: Counters, c1: Counters) -> float:
    """CPU-seconds our processes used between the two readings (a process born in between from 0)."""
    return sum(max(0.0, s - c0.ours_s.get(key, 0.0)) for key, s in c1.ours_s.items())


def cores() -> int:
    """The CPUs psutil.cpu_times() counts (all of the machine's logical CPUs)."""
    return psutil.cpu_count(logical=True) or 1


def _fraction(value: float) -> float:
    return round(min(1.0, max(0.0, value)), 4)


def steal_fraction(c0: Counters, c1: Counters) -> float | None:
    if c0.steal_s is None or c1.steal_s is None or c1.total_s <= c0.total_s:
        return None
    return _fraction((c1.steal_s - c0.steal_s) / (c1.total_s - c0.total_s))


def other_fraction(c0: Counters, c1: Counters) -> float:
    """Fraction of all CPUs busy outside our processes between the two readings."""
    wall = max(c1.t_mono - c0.t_mono, 1e-9)
    return _fraction((c1.busy_s - c0.busy_s - ours_between(c0, c1)) / (wall * cores()))


def during(c0: Counters, c1: Counters) -> LoadDuring:
    """The manifest's `machine.during` over a window (docs/records.md)."""
    return LoadDuring(
        wall_s=round(c1.t_mono - c0.t_mono, 4),
        cpu_total_s=round(c1.busy_s - c0.busy_s, 3),
        cpu_ours_s=round(ours_between(c0, c1), 3),
        cpu_other_frac=other_fraction(c0, c1),
        steal_frac=steal_fraction(c0, c1),
    )


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _number(cell: str) -> int | float | None:
    """'1980' -> 1980, '35.5' -> 35.5, '[N/A]' or '[Not Supported]' -> None."""
    try:
        value = float(cell.strip())
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def parse_gpu_status(csv_text: str) -> list[GpuStatus]:
    """Rows of `nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,utilization.gpu
    --format=csv,noheader,nounits` -> one GpuStatus per GPU."""
    gpus = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        index = _number(cells[0]) if len(cells) == 4 else None
        if index is None:
            continue
        clock, temp, util = (_number(c) for c in cells[1:])
        gpus.append(GpuStatus(index=int(index), sm_clock_mhz=clock, temperature_c=temp, utilization_pct=util))
    return gpus


def gpu_status() -> list[GpuStatus] | None:
    """Every GPU's SM clock, temperature and utilisation now, or None without a working nvidia-smi."""
    out = run_tool(["nvidia-smi", _NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"])
    return (parse_gpu_status(out) or None) if out else None


def snapshot(c0: Counters, c1: Counters, gpus: list[GpuStatus] | None) -> LoadSnapshot:
    """The manifest's `machine.before` / `machine.after` from a short sample (docs/records.md)."""
    return LoadSnapshot(
        t_unix=round(c1.t_unix, 3),
        load_avg=load_avg(),
        cpu_other=other_fraction(c0, c1),
        steal=steal_fraction(c0, c1),
        gpus=gpus,
    )


async def sample(seconds: float) -> LoadSnapshot:
    """A `seconds` sample of the machine's load, without blocking the event loop."""
    c0 = read_counters()
    await asyncio.sleep(seconds)
    c1 = read_counters()
    return snapshot(c0, c1, await asyncio.to_thread(gpu_status))


@dataclass
class CpuPin:
    """Pins the calling thread (the runner's event loop) to `cpus` while at least one drive holds it, and
    restores the affinity it found when the last one lets go (runs of a parallel slot share it).
    Nothing happens when `cpus` is empty."""

    cpus: list[int]
    holders: int = 0
    saved: set[int] | None = None

    def acquire(self) -> None:
        if not self.cpus:
            return
        if self.holders == 0:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)
        self.holders += 1

    def release(self) -> None:
        if not self.cpus or self.holders == 0:
            return
        self.holders -= 1
        if self.holders == 0 and self.saved is not None:
            os.sched_setaffinity(0, self.saved)
            self.saved = None
