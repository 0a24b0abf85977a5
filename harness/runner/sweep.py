"""Hydra multiruns of the runner (`python -m harness.bench -m ...`): what a job knows of its sweep, and what
happens when every job has ended.

- SweepJob: the job's sweep folder, number and overrides; the campaign id the jobs of one sweep share
  (shards of one campaign) or not (any other swept value); the outcome file each job leaves.
- SweepSummary (a Hydra callback, hydra.callbacks in bench.yaml): at the sweep's end, one report per
  sharded campaign over all its shards, a sweep table per experiment, a line per job; exit 1 when a job
  or a report failed.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from harness.contract import read_json, write_json
from harness.runner.report_step import report_campaign, write_sweep_tables

JOBS_DIR = "specbench-jobs"  # under a sweep's folder: one outcome file per job, read by SweepSummary


def register_resolvers() -> None:
    """`${specbench_token:}`: a random suffix, drawn once per sweep (cached; Hydra copies the sweep's
    resolver cache into every job, on a SLURM node too), so that concurrent sweeps get distinct folders
    and the jobs of one sweep agree on theirs. Registered at import: a submitit job imports harness.bench
    (hence this module) and resolves hydra.sweep.dir before it calls hydra_main."""
    OmegaConf.register_new_resolver("specbench_token", lambda: secrets.token_hex(3), use_cache=True, replace=True)


register_resolvers()


@dataclass(frozen=True)
class SweepJob:
    """One job of a Hydra multirun (`-m`): local, submitit_local or submitit_slurm."""

    sweep_dir: Path
    num: int
    overrides: tuple[str, ...]

    @classmethod
    def current(cls) -> SweepJob | None:
        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        return cls(Path(hc.sweep.dir).resolve(), int(hc.job.num), tuple(hc.overrides.task))

    def campaign_id(self, concurrency: int) -> str:
        """The same id for every shard of one sweep with the same other overrides (a sweep over shards joins
        one campaign; a sweep over anything else gets one campaign per value)."""
        kept = sorted(o for o in self.overrides if not o.startswith(("shard=", "campaign=")))
        digest = hashlib.sha256("\n".join([self.sweep_dir.name, *kept]).encode()).hexdigest()[:6]
        stamp = self.sweep_dir.name[:15] if re.match(r"\d{8}-\d{6}", self.sweep_dir.name) else "sweep"
        return f"{stamp}-c{concurrency}-{digest}"

    def record(self, code: int, root: Path | None, shard: Any) -> None:
        write_json(
            self.sweep_dir / JOBS_DIR / f"{self.num}.json",
            {
                "num": self.num,
                "overrides": list(self.overrides),
                "code": code,
                "shard": shard,
                "campaign": str(root.resolve()) if root is not None else None,
            },
        )


def _rerun(job: dict[str, Any]) -> str:
    """The overrides that resume a failed job alone: its own, with the campaign it wrote into (when it made one)."""
    overrides = list(job["overrides"])
    if job["campaign"]:
        overrides = [o for o in overrides if not o.startswith(("shard=", "campaign="))]
        overrides += [f"campaign={Path(job['campaign']).name}"] + (
            [f"shard={job['shard']}"] if job["shard"] is not None else []
        )
    return " ".join(overrides)


class SweepSummary(Callback):
    """At the end of a multirun (hydra.callbacks in bench.yaml): the report of every campaign that shards
    wrote into (all its shards merged, coverage audited across them), a line per job, and exit 1 when a
    job or a report failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        console = Console()
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        jobs = sorted((read_json(p) for p in (sweep_dir / JOBS_DIR).glob("*.json")), key=lambda j: j["num"])
        failed = [j for j in jobs if j["code"]]
        for j in jobs:
            what = f"shard {j['shard']} of " if j["shard"] is not None else ""
            outcome = f"exit {j['code']}" if j["code"] else "ok"
            console.print(
                f"job {j['num']} ({' '.join(j['overrides']) or 'no overrides'}): {what}"
                f"{j['campaign'] or 'no campaign'}: {outcome}",
                highlight=False,
                soft_wrap=True,
            )
        sharded = sorted({j["campaign"] for j in jobs if j["shard"] is not None and j["campaign"]})
        bad_reports = [
            root
            for root in sharded
            if config.get("report", True) and report_campaign(Path(root), console, bool(config.strict_audit))
        ]
        if config.get("report", True):
            write_sweep_tables(sweep_dir, [Path(j["campaign"]) for j in jobs if j["campaign"]], console)
        if failed or bad_reports:
            reruns = [_rerun(j) for j in failed]
            console.print(
                f"[bold red]sweep failed[/]: {len(failed)} of {len(jobs)} job(s) failed"
                + (f"; the report of {', '.join(bad_reports)} failed" if bad_reports else "")
                + (f"; resume each failed job alone (no -m): {' | '.join(reruns)}" if reruns else ""),
                highlight=False,
                soft_wrap=True,
            )
            sys.exit(1)
