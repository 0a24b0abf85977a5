"""Stopping a campaign: SIGINT (Ctrl-C) and SIGTERM (`kill`, SLURM's `scancel` and time limits) as one
graceful stop, whatever the moment they arrive, and whatever the parent did with the signals (a shell's
`cmd &`, `nohup` and many CI and batch wrappers start their children with SIGINT ignored).

The runner installs its own handlers for both at start-up. A stop signal:
- while runs are under way (the event loop of `StopSignals.run`): cancels the campaign's task, so the run in
  progress fails ("interrupted by SIGINT"), its server is stopped and its manifest written, and then raises
  `Stopped`;
- at any other moment (composing, loading the workload, writing the report): raises `Stopped` at once.
A signal that lands while Python runs code whose exceptions it cannot raise (a weakref callback inside the import
machinery, a `__del__`) is not lost: it is noted (`signum`), the "Exception ignored" report of that `Stopped` is
silenced, and the next phase boundary (`check()`, `run()`) raises it.
A second signal while the stop is under way is reported and otherwise ignored, so the stop always ends
cleanly (every wait on the way is bounded: servers get SIGTERM, then SIGKILL after server.stop_timeout_s).
The command exits with 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM, as shells report it.
Once the command has ended (`phase` "done": every file written, the exit code known), a signal is noted and
ignored, and `quiet()` ignores both for the interpreter's own teardown.

asyncio is imported where it is used: `python -m harness.bench` installs these handlers before anything
else is imported, so that a signal in its first milliseconds is a clean stop too.

`hold(phase)` is a fault-injection point for tests: with SPECBENCH_HOLD_AT=<phase>[,<phase>...] in its
environment the runner prints `specbench: holding at <phase>` to stderr and waits there (HOLD_S, or
SPECBENCH_HOLD_S seconds), so that a test can send a signal, fill a disk or make a folder read-only at that
exact moment. Without the variable it does nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing itself is not imported at run time (see the module's docstring)
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine
    from typing import Any, TypeVar

    T = TypeVar("T")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
HOLD_ENV = "SPECBENCH_HOLD_AT"
HOLD_S = 60.0
HOLD_S_ENV = "SPECBENCH_HOLD_S"
# where a test can hold the runner: after the plan is made (before any run), a run's server started but
# not ready, its warmup requests in flight, its measured requests in flight, its scoring, the report, the
# very end (every file written, the exit code known)
PHASES = ("plan", "startup", "warmup", "measure", "scoring", "report", "end")
# what a stop signal interrupts (StopSignals.phase, set by the command): before any run, the runs, the report
# after them, nothing (the command has ended)
STARTING, RUNS, REPORT, DONE = "starting", "runs", "report", "done"
STOPPED_WHERE = {
    STARTING: "while starting; nothing was launched",
    REPORT: "after every run had ended; the campaign's files are kept (make report DIR=... writes the report)",
}
STOPPING_WHAT = {
    STARTING: "nothing was launched",
    RUNS: "the running run is being marked failed and its server stopped",
    REPORT: "every run had ended; the report is not written",
}


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


class StopSignals:
    """The process's handler of SIGINT and SIGTERM (see the module's docstring); `ensure()` installs it once.
    A plain class (no dataclasses, no typing at run time): it is imported before anything else."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first stop signal received
        self.phase = STARTING  # STARTING | RUNS | REPORT | DONE: what a signal interrupts (the command sets it)
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deferred = False
        self._previous_hook = sys.unraisablehook

    @classmethod
    def ensure(cls) -> StopSignals:
        """The installed handler, or a new one, installed now for both signals (main thread only). Never raises
        Stopped: a signal that comes while the handlers go in is noted (`signum`); the caller checks."""
        current = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        if isinstance(current, cls):
            return current
        stops = cls()
        stops._deferred = True  # a signal between two of these lines is noted: the caller's check() raises it
        for sig in STOP_SIGNALS:
            signal.signal(sig, stops._on_signal)
        sys.unraisablehook = stops._unraisable
        stops._deferred = False
        return stops

    def _unraisable(self, unraisable: Any) -> None:
        """sys.unraisablehook: a Stopped that Python could not raise (see the module's docstring) is already
        noted in `signum`; anything else goes to the previous hook."""
        if isinstance(unraisable.exc_value, Stopped) and self.signum is not None:
            return
        self._previous_hook(unraisable)

    @property
    def reason(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}" if self.signum else "interrupted"

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.phase == DONE:  # everything was written: nothing left to stop
            return
        if self.signum is not None:
            print(
                f"specbench: {signal.Signals(signum).name} received; already stopping after "
                f"{signal.Signals(self.signum).name} ({STOPPING_WHAT[self.phase]})",
                file=sys.stderr,
                flush=True,
            )
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

    @staticmethod
    def quiet() -> None:
        """Ignore both signals from now on: the command has ended, and the interpreter's teardown (which
        would otherwise put back the default action, death by the signal) has nothing left to stop."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def check(self) -> None:
        """Stopped when a stop signal was received (and deferred) so far."""
        if self.signum is not None:
            raise Stopped(self.signum)

    def defer(self) -> None:
        """From now until `resume()`, a stop signal is noted, not raised: for library code that an exception
        raised at an arbitrary line leaves broken (Hydra's and OmegaConf's imports and composition: OmegaConf's
        clean-up then raises an AttributeError in the Stopped's place, a traceback instead of a clean stop)."""
        self._deferred = True

    def resume(self) -> None:
        """Signals raise again; Stopped now if one came while they were deferred."""
        self._deferred = False
        self.check()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """asyncio.run(coro), such that a stop signal cancels it (its `finally` blocks and `async with` exits
        run: servers stop, manifests are written) and then raises Stopped. The phase is RUNS meanwhile, REPORT
        once the coroutine has returned."""
        import asyncio  # noqa: PLC0415  (see the module's docstring)

        self.phase = RUNS

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
            self._loop = None
        self.phase = REPORT  # (still deferred: a signal from the coroutine's end to here is the report's)
        self._deferred = False
        self.check()  # a signal during the loop's teardown
        return result


def hold_seconds() -> float:
    """How long a hold lasts: SPECBENCH_HOLD_S (a test that injects a fault there and lets the runner go on),
    else HOLD_S."""
    return float(os.environ.get(HOLD_S_ENV) or HOLD_S)


def _holding(phase: str) -> bool:
    return phase in os.environ.get(HOLD_ENV, "").split(",")


def _announce(phase: str) -> None:
    print(f"specbench: holding at {phase} ({HOLD_ENV})", file=sys.stderr, flush=True)


async def hold(phase: str) -> None:
    """The fault-injection point `phase` inside the event loop (a no-op unless SPECBENCH_HOLD_AT names it)."""
    if _holding(phase):
        import asyncio  # noqa: PLC0415  (see the module's docstring)

        _announce(phase)
        await asyncio.sleep(hold_seconds())


def hold_sync(phase: str) -> None:
    """The fault-injection point `phase` outside the event loop."""
    if _holding(phase):
        _announce(phase)
        time.sleep(hold_seconds())
