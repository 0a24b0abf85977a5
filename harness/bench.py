"""`python -m harness.bench experiment=NAME [overrides]`: run an A/B campaign and write its report.

Examples:
  python -m harness.bench                                   # the default experiment, embedded server
  python -m harness.bench experiment=embedded_aa            # the A/A noise floor
  python -m harness.bench experiment=dflash_block_vs_token dry_run=true   # print the exact commands
  python -m harness.bench campaign=20261129-101500-c8-3fa2c1      # resume a campaign
  python -m harness.bench -m experiment=dflash_verify_probs_speedbench client.concurrency=64,128
  python -m harness.bench -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu shard='range(0,3)'

This module only installs the stop-signal handlers (harness.campaign.stopping) before anything heavy is
imported, so that Ctrl-C or SIGTERM during start-up is a clean stop too; the command itself is
harness.campaign.command, a multirun's jobs and its end are harness.campaign.sweep's.
"""

from __future__ import annotations

import sys

from harness.campaign.stopping import Stopped, StopSignals


def main() -> None:
    """`python -m harness.bench` and the `specbench-bench` command."""
    stops = StopSignals.ensure()
    try:
        from harness.campaign import command  # noqa: PLC0415  (Hydra, the runner, the workloads: after the handlers)

        command.main(stops)
    except Stopped as stop:
        print(f"interrupted ({stop.name}) while starting; nothing was launched", file=sys.stderr)
        sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
