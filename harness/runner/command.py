"""The campaign command behind `python -m harness.bench` (harness/bench.py starts it): compose the config
(Hydra), then a dry run, or the plan's runs followed by the report. Also one job of a Hydra multirun: a
job records its outcome (harness.runner.sweep) instead of exiting, so one failed job does not stop the
others; a stop signal stops the whole sweep.

Stop signals (SIGINT, SIGTERM) are one graceful stop at any moment (harness.runner.stopping); what the
command says and its exit code (130, 143) depend on where they arrive: before any run (nothing launched),
during the runs (the running run failed, its server stopped; resume with campaign=...), or while the report
is written (every run had ended; `make report DIR=...` writes it).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, cast

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from rich.console import Console

from harness.backends import get as get_backend
from harness.hydra_setup import CONFIG_DIR, HYDRA_VERSION_BASE
from harness.models.check import ModelFileError, PresetError, check_launches
from harness.runner.cmdline import CommandLine
from harness.runner.config import BenchConfig, register_configs
from harness.runner.difference import check_arms_differ
from harness.runner.dryrun import print_dry_run
from harness.runner.folder import Campaign, build_campaign
from harness.runner.overrides import OverrideError, check_overrides
from harness.runner.plan import check_request_seeds, planned_launches
from harness.runner.report_step import report_campaign
from harness.runner.required import check_required
from harness.runner.runs import run_campaign, summary
from harness.runner.sources import resolve_sources
from harness.runner.stopping import DONE, REPORT, STARTING, Stopped, StopSignals, hold_sync
from harness.runner.storage import StorageError
from harness.runner.sweep import SweepJob
from harness.runner.unread import check_unread
from harness.server.launch import PlannedLaunch
from harness.server.redact import Secrets, redact_override
from harness.validation import ConfigError
from workloads import load_workload
from workloads.base import WorkloadError

GROUPS = ("experiment", "server", "workload", "client")


def to_typed(cfg: DictConfig, line: CommandLine | None = None) -> BenchConfig:
    """The composed config as typed objects; schema checks in __post_init__ run here. Every `???` of a chosen
    config file must hold a value (harness.runner.required: composition can lose one); `line`: the command line
    it was composed from (default: the running @hydra.main's)."""
    check_required(cfg, line or CommandLine.current(), GROUPS)
    return cast(BenchConfig, OmegaConf.to_object(cfg)).validate()  # cfg's schema is BenchConfig


def check_model_paths(launches: list[PlannedLaunch]) -> None:
    """ConfigError naming the model path (and what is wrong with it) that an embedded server could not load:
    checked here, where a server would otherwise start and exit before it was ready."""
    try:
        check_launches((launch.launch.argv, launch.launch.cwd, launch.launch.module) for launch in launches)
    except (ModelFileError, PresetError) as exc:
        raise ConfigError(f"server.model_path (or an arm's --model-path): {exc}; nothing was launched") from None


def preflight_before_launch(cfg: BenchConfig, launches: list[PlannedLaunch], console: Console) -> int:
    """A real run's fail-fast check of every planned command by the backend's own parser: 0 to go on."""
    preflight = get_backend(cfg.server.backend).preflight(cfg.server, launches, console)
    code = preflight.verdict(console) if preflight is not None else 0
    if code:
        console.print("no server was launched", highlight=False)
    return code


def campaign_complete(campaign: Campaign) -> bool:
    return all(campaign.run_status(r.run_id) == "finished" for r in campaign.plan)


def run(
    cfg_node: DictConfig, console: Console, stops: StopSignals, sweep: SweepJob | None = None
) -> tuple[int, Path | None]:
    """Compose -> plan -> (dry run | runs -> report). Returns the process exit code and the campaign folder.

    A shard writes the campaign's report only when it completes the campaign outside a sweep (in a sweep,
    SweepSummary writes it once every job has ended). A Stopped before the runs start propagates (the
    caller says nothing was launched); during the runs and the report it is handled here."""
    stops.phase = STARTING  # (a sweep's jobs run one after another in one process)
    line = CommandLine.current()
    cfg = to_typed(cfg_node, line)
    check_unread(cfg, [k for k in line.keys() if k not in GROUPS] if line else [])
    stops.resume()  # deferred by harness.bench over the imports and Hydra's composition: a signal then stops here
    if cfg.campaign is None and sweep is not None:
        cfg.campaign = sweep.campaign_id(cfg.client.concurrency)
    sources = resolve_sources(cfg)  # each arm's git ref, once: a commit and its snapshot
    launches = planned_launches(cfg, sources)  # the plan, built once: the dry run prints it, the runs launch it
    check_arms_differ(cfg, launches, sources)  # a comparison needs a difference (or an A/A)
    check_model_paths(launches)  # an embedded server's model, before anything launches
    if cfg.dry_run:  # the workload read and its request seeds checked as a run would, before anything launches
        workload = load_workload(cfg.workload)
        check_request_seeds(cfg, workload)
        return print_dry_run(cfg, console, launches, sources, workload), None
    code = preflight_before_launch(cfg, launches, console)  # each argv by the engine's parser, before anything loads
    if code:
        return code, None
    config_dict = cast(dict[str, Any], OmegaConf.to_container(cfg_node, resolve=True))  # of a DictConfig
    workload = load_workload(cfg.workload)
    campaign = build_campaign(cfg, config_dict, workload, launches, console, stops, sources)
    part = f" (shard {cfg.shard}: {len(campaign.todo)} of them)" if cfg.shard is not None else ""
    console.print(
        f"[bold]{cfg.experiment.name}[/]: {len(campaign.plan)} runs{part} x {len(workload.items)} requests "
        f"({workload.name}, sha256 {workload.sha256[:12]}) -> {campaign.root}"
    )
    campaign.open()
    hold_sync("plan")
    secrets = campaign.secrets + Secrets.of({}, [launch.launch.argv for launch in launches])  # the arms' env too
    resume = secrets.scrub(resume_hint(line, campaign.root.name, cfg.shard, sweep is not None))  # (--api-key X)
    try:
        statuses = stops.run(run_campaign(campaign))
    except Stopped as stop:
        if stops.phase == REPORT:  # the runs had all ended
            console.print(
                f"[bold red]interrupted[/] ({stop.name}) after every run had ended; the records are in "
                f"{campaign.root}; `make report DIR={campaign.root}` writes the report",
                soft_wrap=True,
            )
        else:
            console.print(
                f"[bold red]interrupted[/] ({stop.name}): the running run is marked failed, its server "
                f"stopped; records so far are kept in {campaign.root}. Resume with {resume}",
                soft_wrap=True,
            )
        return stop.exit_code, campaign.root
    except StorageError as exc:
        console.print(
            f"[bold red]stopped:[/] {exc}. The campaign stopped at once (every later run would fail the "
            f"same way); what was written before is kept in {campaign.root}. Free space there (or make it "
            f"writable), then resume with {resume}",
            soft_wrap=True,
        )
        return 1, campaign.root
    try:
        code = after_runs(cfg, campaign, statuses, console, sweep, resume)
        stops.check()  # a signal that Python noted but could not raise while the report was written
    except Stopped as stop:
        console.print(
            f"[bold red]interrupted[/] ({stop.name}) while writing the report: every run had ended "
            f"({summary(statuses)}); the records are in {campaign.root}; "
            f"`make report DIR={campaign.root}` writes the report",
            soft_wrap=True,
        )
        return stop.exit_code, campaign.root
    return code, campaign.root


def resume_hint(line: CommandLine | None, campaign: str, shard: int | None, in_sweep: bool) -> str:
    """The command that resumes this campaign (or this job of a sweep, alone): every override given, results_dir
    and --config-dir included, with campaign= (and shard=) of this one."""
    kept = [redact_override(o) for o in line.without("campaign", "shard")] if line else []
    dirs = [f"--config-dir={d}" for d in (line.config_dirs if line else ()) if d.resolve() != CONFIG_DIR.resolve()]
    own = [*dirs, *kept, f"campaign={campaign}", *([f"shard={shard}"] if shard is not None else [])]
    command = shlex.join([interpreter(), "-m", "harness.bench", *own])
    return f"{command} (this job alone, without -m)" if in_sweep else command


def interpreter() -> str:
    """This interpreter as a command that runs it from the working directory: relative below it (`.venv/bin/python`
    after `make bench`: the system's python lacks the project's packages), else its absolute path."""
    exe = Path(sys.executable)
    if not exe.is_relative_to(Path.cwd()):
        return str(exe)
    rel = str(exe.relative_to(Path.cwd()))
    return rel if os.sep in rel else os.path.join(".", rel)


def after_runs(
    cfg: BenchConfig,
    campaign: Campaign,
    statuses: dict[str, str],
    console: Console,
    sweep: SweepJob | None,
    resume: str,
) -> int:
    """Every run has ended: the failed runs and how to resume them, then the report (unless a shard's or a sweep's
    job leaves it for later), which ends with the answer and where things are; the exit code."""
    console.print(f"runs: {summary(statuses)}")
    failed = [r for r, s in statuses.items() if s != "finished"]
    if failed:
        console.print(
            f"[bold red]{len(failed)} run(s) failed[/]: {', '.join(failed)}; resume them with: {resume}", soft_wrap=True
        )
    report_now = cfg.report and (cfg.shard is None or (sweep is None and campaign_complete(campaign)))
    report_code = 0
    if report_now:
        hold_sync("report")
        report_code = report_campaign(campaign.root, console, cfg.strict_audit, cfg.experiment.gate)
    if cfg.shard is not None and not report_now:
        left = sorted({r.slot for r in campaign.plan if campaign.run_status(r.run_id) != "finished"})
        todo = (
            f"; shards not finished: {', '.join(map(str, left))} (run each with campaign={campaign.root.name} shard=K)"
            if left and not sweep
            else ""
        )
        console.print(
            f"shard {cfg.shard} done{todo}; the campaign's report, once every shard has finished: "
            f"{interpreter()} -m analysis.report {campaign.root}"
            + (" (the sweep writes it at its end)" if sweep else ""),
            soft_wrap=True,
        )
    if not report_now:
        console.print(f"[bold green]records:[/] {campaign.root}/runs/*/records.jsonl")
    if not failed and report_code in GATE_CODES:
        return report_code  # the gate's verdict (experiment.gate): 3 failed, 4 inconclusive
    return 1 if failed or report_code else 0


GATE_CODES = (3, 4)  # analysis.gate's EXIT_GATE_FAILED, EXIT_INCONCLUSIVE (the runner does not import the analysis)


@hydra.main(version_base=HYDRA_VERSION_BASE, config_path=str(CONFIG_DIR), config_name="bench")
def hydra_main(cfg: DictConfig) -> None:
    """One run of the command, or one job of a sweep: a job records its outcome (SweepSummary reads it at
    the sweep's end) instead of exiting, so one failed job does not stop the others; a stopped job stops
    the sweep."""
    console = Console()
    stops = StopSignals.ensure()  # installed by harness.bench; a submitit job process installs its own here
    sweep = SweepJob.current()
    code, root = guarded_run(cfg, console, stops, sweep)
    if sweep is None:
        stops.phase = DONE  # every file is written: a signal from now on has nothing to stop
        hold_sync("end")
    if sweep is not None:
        sweep.record(code, root, cfg.get("shard"))
        if stops.signum is not None:
            sys.exit(code)
    elif code:
        sys.exit(code)


def guarded_run(
    cfg: DictConfig, console: Console, stops: StopSignals, sweep: SweepJob | None
) -> tuple[int, Path | None]:
    """run(), with the errors a user can fix printed as one line and an exit code."""
    code, root = 2, None
    try:
        code, root = run(cfg, console, stops, sweep)
    except MissingMandatoryValue as exc:
        key = exc.full_key or "a value"
        console.print(
            f"[bold red]error:[/] {key} is required and has no value: set it on the command line "
            f"({key}=...) or in the experiment file"
        )
        code = 2
    except (ConfigError, WorkloadError, OmegaConfBaseException) as exc:
        console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)  # paths in one piece
        code = 2
    except Stopped as stop:  # run() handles it from the runs on: this one came before
        console.print(
            f"[bold red]interrupted[/] ({stop.name}) before any run started; nothing was launched", soft_wrap=True
        )
        code = stop.exit_code
    return code, root


def main(stops: StopSignals) -> None:
    """The command line: overrides checked against the schema first (the valid keys listed), then Hydra."""
    register_configs()
    try:
        check_overrides(sys.argv[1:], BenchConfig, GROUPS)
    except OverrideError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        sys.exit(2)
    stops.check()
    hydra_main()
