"""Timing, peak memory, statistics and bandwidth arithmetic of the microbenchmark.

On CUDA each call is bracketed by CUDA events (recorded on the current stream) and read after one
synchronisation; on the CPU by `time.perf_counter`. The implementations of one batch size are timed
interleaved (each round calls every one once, in a seeded shuffled order, so drift and neighbours hit
all alike), and calls cycle through rotated input copies so that no call finds its input in the cache.

Two ways to start a timed call on CUDA: on the GPU as the previous call left it (idle after a call that
synchronised: the host's work before the call's first kernel is timed too), or queued (`queued_ms`) behind a GPU
busy-wait launched just before the start event, so that the host's launches overlap GPU work as when the call
follows the target model's forward in a server: the events then time the GPU from the end of the wait to the
call's end, with any bubble a synchronisation inside the call leaves.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Call = Callable[[Tensor], Tensor]
OUTPUT_ELEM_SIZE = 4  # every builder writes a dense fp32 [rows, vocab] output


@dataclass(frozen=True)
class TimingStats:
    """Median, min and max of the per-call times (ms) over `repeats` timed calls."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int


def summarize(times_ms: Sequence[float]) -> TimingStats:
    """TimingStats of per-call times in ms (at least one)."""
    if not times_ms:
        raise ValueError("no timings to summarize")
    return TimingStats(statistics.median(times_ms), min(times_ms), max(times_ms), len(times_ms))


def bytes_moved(rows: int, vocab: int, elem_size: int) -> int:
    """The least a builder must move: read the logits once, write the dense fp32 output once."""
    return rows * vocab * elem_size + rows * vocab * OUTPUT_ELEM_SIZE


def bandwidth_gbs(nbytes: int, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second) of moving `nbytes` in `ms` milliseconds."""
    if ms <= 0:
        raise ValueError(f"time {ms} ms must be positive")
    return nbytes / (ms * 1e-3) / 1e9


def floor_fraction(copy_floor_ms: float, median_ms: float) -> float:
    """How close an implementation comes to the copy floor: copy_floor_ms / median_ms (1 = at the floor)."""
    if median_ms <= 0:
        raise ValueError(f"median {median_ms} ms must be positive")
    return copy_floor_ms / median_ms


class _CpuTimer:
    """Wall-clock intervals (time.perf_counter), in ms."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self.times: list[float] = []

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.times.append((time.perf_counter() - self._t0) * 1e3)

    def result(self) -> list[float]:
        return self.times


class _CudaTimer:
    """CUDA event pairs on the current stream, read after one synchronisation, in ms; each start queued behind
    a GPU busy-wait of `wait_cycles` clock cycles when that is not 0."""

    def __init__(self, wait_cycles: int = 0) -> None:
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.wait_cycles = wait_cycles

    def start(self) -> None:
        self.pairs.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        if self.wait_cycles:
            torch.cuda._sleep(self.wait_cycles)
        self.pairs[-1][0].record()

    def stop(self) -> None:
        self.pairs[-1][1].record()

    def result(self) -> list[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self.pairs]


def round_robin_order(names: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: `names` shuffled by a generator seeded with the round's index, so that
    no name is always first or always runs after the same other one (reproducible)."""
    order = list(names)
    random.Random(round_index).shuffle(order)
    return order


def start_text(queued_ms: float, gpu: bool = True) -> str:
    """How a timed call starts, in the words the reports print (the module's docstring); `gpu` False: on a CPU."""
    if not gpu:
        return "each call runs on the CPU after the previous one returned (no device queue: the whole call is timed)"
    if queued_ms:
        return (
            f"each call queued behind a GPU busy-wait of about {queued_ms:g} ms (the host's launches overlap GPU "
            "work, as when the call follows the target model's forward in a server; the GPU's span from the end "
            "of the wait to the call's end is timed, with any bubble a synchronisation inside the call leaves)"
        )
    return (
        "each call starts on the GPU as the previous call left it (idle after a call that synchronised: the "
        "host's work before its first kernel is timed too)"
    )


def gpu_wait_cycles(ms: float) -> int:
    """Clock cycles of torch.cuda._sleep that keep the current GPU busy for about `ms` ms (measured here)."""
    probe = 2_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # the clocks up before the measured one
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return max(1, round(probe * ms / start.elapsed_time(end)))


def time_interleaved(
    calls: dict[str, Call],
    inputs: Sequence[Tensor],
    *,
    warmup: int,
    repeats: int,
    on_round: Callable[[int], None] | None = None,
    queued_ms: float = 0.0,
) -> dict[str, list[float]]:
    """Per-call times in ms of every call, interleaved: `warmup` untimed rounds, then `repeats` timed
    rounds; each round calls every entry once, in `round_robin_order` (a seeded shuffle).

    The c-th call overall gets inputs[c % len(inputs)], so consecutive calls never share an input
    (with two or more copies) and drift or noise hits every entry alike. Device: that of the inputs.
    `on_round(r)` is called after each round r (warm-up rounds included). `queued_ms` > 0 (CUDA only): each
    timed call queued behind a GPU busy-wait of about that long (the module's docstring).
    """
    if queued_ms < 0 or (queued_ms and not inputs[0].is_cuda):
        raise ValueError(
            f"queued_ms={queued_ms} must be >= 0, and 0 off CUDA (a CPU has no queue to hide the host's work behind)"
        )
    names = list(calls)
    cycles = gpu_wait_cycles(queued_ms) if queued_ms else 0
    timers = {n: _CudaTimer(cycles) if inputs[0].is_cuda else _CpuTimer() for n in names}
    c = 0
    if inputs[0].is_cuda:
        torch.cuda.synchronize()
    for r in range(warmup + repeats):
        for name in round_robin_order(names, r):
            x = inputs[c % len(inputs)]
            c += 1
            if r < warmup:
                calls[name](x)
                continue
            timers[name].start()
            calls[name](x)
            timers[name].stop()
        if on_round is not None:
            on_round(r)
    return {n: timers[n].result() for n in names}


def time_calls(call: Call, inputs: Sequence[Tensor], *, warmup: int, repeats: int) -> list[float]:
    """Per-call times in ms of one call over `repeats` calls after `warmup` untimed ones.

    Call i gets inputs[i % len(inputs)]; the device is that of the inputs.
    """
    return time_interleaved({"call": call}, inputs, warmup=warmup, repeats=repeats)["call"]


def call_with_peak_memory(call: Call, x: Tensor) -> tuple[Tensor, int | None]:
    """(output, peak temporary bytes) of one call; bytes are None on the CPU (not measured).

    On CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus what was allocated
    before the call (inputs and everything else already alive). The output itself counts.
    """
    if not x.is_cuda:
        return call(x), None
    torch.cuda.synchronize(x.device)
    before = torch.cuda.memory_allocated(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    out = call(x)
    torch.cuda.synchronize(x.device)
    return out, torch.cuda.max_memory_allocated(x.device) - before
