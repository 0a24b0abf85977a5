"""`python -m harness.bench experiment=NAME [overrides]`: run an A/B campaign and write its report.

Examples:
  python -m harness.bench                                   # the default experiment, embedded server
  python -m harness.bench experiment=embedded_aa            # the A/A noise floor
  python -m harness.bench experiment=dflash_block_vs_token dry_run=true   # print the exact commands
  python -m harness.bench campaign=20261129-101500-c8-3fa2c1      # resume a campaign
  python -m harness.bench -m experiment=dflash_verify_probs_speedbench client.concurrency=64,128
"""

from __future__ import annotations

import asyncio
import sys

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from rich.console import Console

from harness.cli import CONFIG_DIR, OverrideError, check_overrides
from harness.config import HYDRA_VERSION_BASE, BenchConfig, ConfigError, register_configs
from harness.dryrun import print_dry_run
from harness.runner import build_campaign, run_campaign, summary
from harness.sglang_preflight import preflight_before_launch
from workloads import load_workload
from workloads.base import WorkloadError

GROUPS = ("experiment", "server", "workload", "client")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def to_typed(cfg: DictConfig) -> BenchConfig:
    """The composed config as typed objects; schema checks in __post_init__ run here."""
    return OmegaConf.to_object(cfg).validate()


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


def run(cfg_node: DictConfig, console: Console) -> int:
    """Compose -> plan -> (dry run | runs -> report). Returns the process exit code."""
    cfg = to_typed(cfg_node)
    if cfg.dry_run:
        return print_dry_run(cfg, console)
    code = preflight_before_launch(cfg, console)  # backend sglang: fail before anything is loaded or launched
    if code:
        return code
    config_dict = OmegaConf.to_container(cfg_node, resolve=True)
    workload = load_workload(cfg.workload)
    campaign = build_campaign(cfg, config_dict, workload, console)
    console.print(f"[bold]{cfg.experiment.name}[/]: {len(campaign.plan)} runs x {len(workload.items)} requests "
                  f"({workload.name}, sha256 {workload.sha256[:12]}) -> {campaign.root}")
    campaign.open()
    try:
        statuses = asyncio.run(run_campaign(campaign))
    except KeyboardInterrupt:
        console.print(f"[bold red]interrupted[/] (Ctrl-C): the running run is marked failed, its server stopped; "
                      f"records so far are kept in {campaign.root}. Resume with campaign={campaign.root.name}")
        return EXIT_INTERRUPTED
    console.print(f"runs: {summary(statuses)}")
    report_code = write_report(campaign.root, console, cfg.strict_audit) if cfg.report else 0
    console.print(f"[bold green]records:[/] {campaign.root}/runs/*/records.jsonl")
    failed = [r for r, s in statuses.items() if s != "finished"]
    if failed:
        console.print(f"[bold red]{len(failed)} run(s) failed[/]: {', '.join(failed)}; rerun with "
                      f"campaign={campaign.root.name} to resume them")
        return 1
    return 1 if report_code else 0


@hydra.main(version_base=HYDRA_VERSION_BASE, config_path=str(CONFIG_DIR), config_name="bench")
def hydra_main(cfg: DictConfig) -> None:
    console = Console()
    try:
        code = run(cfg, console)
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
    if code:
        sys.exit(code)


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
