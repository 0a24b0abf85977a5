"""`python -m harness.bench experiment=NAME [overrides]`: run an A/B campaign and write its report.

Examples:
  python -m harness.bench                                   # the default experiment, embedded server
  python -m harness.bench experiment=embedded_aa            # the A/A noise floor
  python -m harness.bench experiment=dflash_block_vs_token dry_run=true   # print the exact commands
  python -m harness.bench campaign=20261129-101500-c8-3fa2c1      # resume a campaign
  python -m harness.bench -m experiment=dflash_verify_probs_speedbench client.concurrency=64,128
  python -m harness.bench -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu shard='range(0,3)'

This module only installs the stop-signal handlers (harness.runner.stopping, which imports nothing heavy)
before anything else is imported, so that Ctrl-C or SIGTERM during start-up is a clean stop too, from the
first lines of this module on when it runs as `python -m harness.bench`, from the first line of main() on
for the `specbench-bench` command (a signal that comes earlier interrupts Python's own start-up, about the first
30 ms, the way Python does it: a KeyboardInterrupt from its import machinery, or death by the signal); the
command itself is harness.runner.command, a multirun's jobs and its end are harness.runner.sweep's.
"""

from __future__ import annotations

import signal
import sys

# The stop signals that came before the runner's own handlers (harness.runner.stopping) were in: main() acts on
# the first. Module state because the handler must be in before main() is even called (below).
NOTED: list[int] = []


def _note(signum: int, frame: object) -> None:
    NOTED.append(signum)


if __name__ == "__main__":  # run as a program: noted from here on, so that no signal lands between these first
    for _sig in (signal.SIGINT, signal.SIGTERM):  # lines and main()'s (the eval loop checks for one on every call)
        signal.signal(_sig, _note)


def main() -> None:
    """`python -m harness.bench` and the `specbench-bench` command."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # a signal while the handlers' own module loads: noted
        signal.signal(sig, _note)
    from harness.runner.stopping import DONE, STARTING, STOPPED_WHERE, Stopped, StopSignals  # noqa: PLC0415

    stops = StopSignals.ensure()
    try:
        if NOTED:
            raise Stopped(NOTED[0])
        stops.check()  # a signal while ensure() put the handlers in
        stops.defer()  # until Hydra has composed the config (harness.runner.command.run resumes)
        from harness.runner import command  # noqa: PLC0415  (Hydra, the runner, the workloads: after the handlers)

        command.main(stops)
    except Stopped as stop:  # the command says what it stopped from the runs on; this is what is left
        print(f"interrupted ({stop.name}) {STOPPED_WHERE.get(stops.phase, STOPPED_WHERE[STARTING])}", file=sys.stderr)
        sys.exit(stop.exit_code)
    finally:  # the command has ended, whichever way: a signal from now on has nothing to stop
        stops.phase = DONE
        StopSignals.quiet()


if __name__ == "__main__":
    main()
