"""`python -m harness.bench experiment=NAME [overrides]`: run an A/B campaign and write its report.

Examples:
  python -m harness.bench                                   # the default experiment, embedded server
  python -m harness.bench experiment=embedded_aa            # the A/A noise floor
  python -m harness.bench experiment=dflash_block_vs_token dry_run=true   # print the exact commands
  python -m harness.bench campaign=20261129-101500-c8-3fa2c1      # resume a campaign
  python -m harness.bench -m experiment=dflash_verify_probs_speedbench client.concurrency=64,128
  python -m harness.bench -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu shard='range(0,3)'

A multirun's jobs and its end are harness.campaign.sweep's.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, cast

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from rich.console import Console

from harness.campaign.dryrun import print_dry_run
from harness.campaign.overrides import OverrideError, check_overrides
from harness.campaign.runner import Campaign, build_campaign, run_campaign, summary
from harness.campaign.sweep import SweepJob
from harness.config import CONFIG_DIR, HYDRA_VERSION_BASE, BenchConfig, ConfigError, register_configs
from harness.server.sglang_preflight import preflight_before_launch
from workloads import load_workload
from workloads.base import WorkloadError

GROUPS = ("experiment", "server", "workload", "client")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def to_typed(cfg: DictConfig) -> BenchConfig:
    """The composed config as typed objects; schema checks in __post_init__ run here."""
    return cast(BenchConfig, OmegaConf.to_object(cfg)).validate()  # cfg's schema is BenchConfig


def write_report(campaign_dir, console: Console, strict: bool) -> int:
    """The analysis report of the campaign (it prints where it wrote); its exit code, non-zero when the
    report could not be written or (strict) its audit failed."""
    from analysis.report import EXIT_AUDIT_FAILED, power_lines, run_cli  # noqa: PLC0415  (heavy imports)

    code, report = run_cli([str(campaign_dir), *(["--strict"] if strict else [])])
    for line in power_lines(report) if report is not None else []:
        console.print(line, highlight=False, markup=False)
    if code == EXIT_AUDIT_FAILED:
        console.print(f"[bold red]the audit of {campaign_dir} failed[/] (see the top of its report.md); exit 1 "
                      "(strict_audit=false keeps exit 0)")
    elif code:
        console.print(f"[bold red]the report of {campaign_dir} failed (exit code {code}); see above[/]")
    return code


def campaign_complete(campaign: Campaign) -> bool:
    return all(campaign.run_status(r.run_id) == "finished" for r in campaign.plan)


def run(cfg_node: DictConfig, console: Console, sweep: SweepJob | None = None) -> tuple[int, Path | None]:
    """Compose -> plan -> (dry run | runs -> report). Returns the process exit code and the campaign folder.

    A shard writes the campaign's report only when it completes the campaign outside a sweep (in a sweep,
    SweepSummary writes it once every job has ended)."""
    cfg = to_typed(cfg_node)
    if cfg.campaign is None and sweep is not None:
        cfg.campaign = sweep.campaign_id(cfg.client.concurrency)
    if cfg.dry_run:
        return print_dry_run(cfg, console), None
    code = preflight_before_launch(cfg, console)  # backend sglang: fail before anything is loaded or launched
    if code:
        return code, None
    config_dict = cast(dict[str, Any], OmegaConf.to_container(cfg_node, resolve=True))  # of a DictConfig
    workload = load_workload(cfg.workload)
    campaign = build_campaign(cfg, config_dict, workload, console)
    part = f" (shard {cfg.shard}: {len(campaign.todo)} of them)" if cfg.shard is not None else ""
    console.print(f"[bold]{cfg.experiment.name}[/]: {len(campaign.plan)} runs{part} x {len(workload.items)} requests "
                  f"({workload.name}, sha256 {workload.sha256[:12]}) -> {campaign.root}")
    campaign.open()
    resume = f"campaign={campaign.root.name}" + (f" shard={cfg.shard}" if cfg.shard is not None else "")
    try:
        statuses = asyncio.run(run_campaign(campaign))
    except KeyboardInterrupt:
        console.print(f"[bold red]interrupted[/] (Ctrl-C): the running run is marked failed, its server stopped; "
                      f"records so far are kept in {campaign.root}. Resume with {resume}")
        return EXIT_INTERRUPTED, campaign.root
    console.print(f"runs: {summary(statuses)}")
    report_now = cfg.report and (cfg.shard is None or (sweep is None and campaign_complete(campaign)))
    report_code = write_report(campaign.root, console, cfg.strict_audit) if report_now else 0
    if cfg.shard is not None and not report_now:
        console.print(f"shard {cfg.shard} done; the campaign's report, once every shard has finished: "
                      f"specbench-report {campaign.root}" + (" (the sweep writes it at its end)" if sweep else ""))
    console.print(f"[bold green]records:[/] {campaign.root}/runs/*/records.jsonl")
    failed = [r for r, s in statuses.items() if s != "finished"]
    if failed:
        console.print(f"[bold red]{len(failed)} run(s) failed[/]: {', '.join(failed)}; rerun with {resume} "
                      "to resume them")
        return 1, campaign.root
    return (1 if report_code else 0), campaign.root


@hydra.main(version_base=HYDRA_VERSION_BASE, config_path=str(CONFIG_DIR), config_name="bench")
def hydra_main(cfg: DictConfig) -> None:
    """One run of the command, or one job of a sweep: a job records its outcome (SweepSummary reads it at
    the sweep's end) instead of exiting, so one failed job does not stop the others."""
    console = Console()
    sweep = SweepJob.current()
    code, root = guarded_run(cfg, console, sweep)
    if sweep is not None:
        sweep.record(code, root, cfg.get("shard"))
    elif code:
        sys.exit(code)


def guarded_run(cfg: DictConfig, console: Console, sweep: SweepJob | None) -> tuple[int, Path | None]:
    """run(), with the errors a user can fix printed as one line and an exit code."""
    code, root = 2, None
    try:
        code, root = run(cfg, console, sweep)
    except MissingMandatoryValue as exc:
        key = exc.full_key or "a value"
        console.print(f"[bold red]error:[/] {key} is required and has no value: set it on the command line "
                      f"({key}=...) or in the experiment file")
        code = 2
    except (ConfigError, WorkloadError, OmegaConfBaseException) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        code = 2
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/] (Ctrl-C) before any run started; nothing was launched")
        code = EXIT_INTERRUPTED
    return code, root


def main() -> None:
    register_configs()
    try:
        check_overrides(sys.argv[1:], BenchConfig, GROUPS)
    except OverrideError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    hydra_main()


if __name__ == "__main__":
    main()
