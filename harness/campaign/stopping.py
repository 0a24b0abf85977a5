"""Stopping a campaign: SIGINT (Ctrl-C) and SIGTERM (`kill`, SLURM's `scancel` and time limits) as one
graceful stop, whatever the moment they arrive, and whatever the parent did with the signals (a shell's
`cmd &`, `nohup` and many CI and batch wrappers start their children with SIGINT ignored).

The runner installs its own handlers for both at start-up. A stop signal:
- while runs are under way (the event loop of `StopSignals.run`): cancels the campaign's task, so the run in
  progress fails ("interrupted by SIGINT"), its server is stopped and its manifest written, and then raises
  `Stopped`;
- at any other moment (composing, loading the workload, writing the report): raises `Stopped` at once.
A second signal while the stop is under way is reported and otherwise ignored, so the stop always ends
cleanly (every wait on the way is bounded: servers get SIGTERM, then SIGKILL after server.stop_timeout_s).
The command exits with 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM, as shells report it.

`hold(phase)` is a fault-injection point for tests: with SPECBENCH_HOLD_AT=<phase>[,<phase>...] in its
environment the runner prints `specbench: holding at <phase>` to stderr and waits there (up to HOLD_S),
so that a test can send a signal at that exact moment. Without the variable it does nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
HOLD_ENV = "SPECBENCH_HOLD_AT"
HOLD_S = 60.0
# where a test can hold the runner: after the plan is made (before any run), a run's server started but
# not ready, its warmup requests in flight, its measured requests in flight, its scoring, the report
PHASES = ("plan", "startup", "warmup", "measure", "scoring", "report")


class Stopped(BaseException):
    """A stop signal ended the command (a BaseException, as KeyboardInterrupt: `except Exception` lets it by)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass
class StopSignals:
    """The process's handler of SIGINT and SIGTERM (see the module's docstring); `ensure()` installs it once."""

    signum: int | None = None  # the first stop signal received
    _task: asyncio.Task | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _deferred: bool = field(default=False, repr=False)

    @classmethod
    def ensure(cls) -> StopSignals:
        """The installed handler, or a new one, installed now for both signals (main thread only)."""
        current = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        if isinstance(current, cls):
            return current
        stops = cls()
        for sig in STOP_SIGNALS:
            signal.signal(sig, stops._on_signal)
        return stops

    @property
    def reason(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}" if self.signum else "interrupted"

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            print(f"specbench: {signal.Signals(signum).name} received; already stopping after "
                  f"{signal.Signals(self.signum).name} (the running run is being marked failed and its server "
                  "stopped)", file=sys.stderr, flush=True)
            return
        self.signum = signum
        if self._task is not None and not self._task.done():
            self._task.cancel()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(lambda: None)  # wake the loop if it waits in select()
            return
        if self._deferred:
            return
        raise Stopped(signum)

    def check(self) -> None:
        """Stopped when a stop signal was received (and deferred) so far."""
        if self.signum is not None:
            raise Stopped(self.signum)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """asyncio.run(coro), such that a stop signal cancels it (its `finally` blocks and `async with` exits
        run: servers stop, manifests are written) and then raises Stopped."""
        async def main() -> T:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            self._deferred = False
            if self.signum is not None:  # it came while the loop was starting
                coro.close()
                raise asyncio.CancelledError
            try:
                return await coro
            finally:
                self._task, self._deferred = None, True  # the loop's own teardown is not interrupted

        self.check()
        self._deferred = True  # until main() runs: a signal is noted, then acted on there
        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if self.signum is None:
                raise
            raise Stopped(self.signum) from None
        finally:
            self._deferred, self._loop = False, None
        self.check()  # a signal during the loop's teardown
        return result


def _holding(phase: str) -> bool:
    return phase in os.environ.get(HOLD_ENV, "").split(",")


def _announce(phase: str) -> None:
    print(f"specbench: holding at {phase} ({HOLD_ENV})", file=sys.stderr, flush=True)


async def hold(phase: str) -> None:
    """The fault-injection point `phase` inside the event loop (a no-op unless SPECBENCH_HOLD_AT names it)."""
    if _holding(phase):
        _announce(phase)
        await asyncio.sleep(HOLD_S)


def hold_sync(phase: str) -> None:
    """The fault-injection point `phase` outside the event loop."""
    if _holding(phase):
        _announce(phase)
        time.sleep(HOLD_S)
