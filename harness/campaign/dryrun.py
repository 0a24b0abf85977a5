"""`dry_run=true`: print every planned run's exact argv, environment and placement, and what differs
between the arms, without launching anything. For backend sglang each argv is also checked by the
SGLang of the interpreter that will run it (`harness.server.sglang_preflight`, `server.preflight`)."""

from __future__ import annotations

import difflib
import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.campaign.plan import PlannedRun, make_plan, slots
from harness.campaign.runner import check_shard
from harness.config import BenchConfig
from harness.server.launcher import LaunchSpec, planned_spec
from harness.server.sglang_preflight import print_verdict, run_preflight

PORT_PLACEHOLDER = 0  # shown as PORT: the real port is picked when the run starts


def spec_of(cfg: BenchConfig, run: PlannedRun) -> LaunchSpec:
    return planned_spec(cfg, run, port=cfg.server.port or PORT_PLACEHOLDER)


def shown_argv(spec: LaunchSpec) -> list[str]:
    return ["PORT" if a == str(PORT_PLACEHOLDER) and prev == "--port" else a
            for prev, a in zip([""] + spec.argv[:-1], spec.argv, strict=True)]


def argv_diff(base: list[str], other: list[str]) -> str:
    """Tokens removed (-) and added (+) going from the baseline's argv to another arm's."""
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=base, b=other, autojunk=False).get_opcodes():
        if op in ("replace", "delete"):
            parts.append("- " + shlex.join(base[i1:i2]))
        if op in ("replace", "insert"):
            parts.append("+ " + shlex.join(other[j1:j2]))
    return "; ".join(parts) or "(same argv)"


def env_diff(base: dict[str, str], other: dict[str, str]) -> str:
    keys = sorted(set(base) | set(other))
    parts = [f"{k}: {base.get(k, '(unset)')} -> {other.get(k, '(unset)')}" for k in keys if base.get(k) != other.get(k)]
    return "; ".join(parts) or "(same env)"


def seeds_line(cfg: BenchConfig, run: PlannedRun) -> str:
    """How the run's request seeds are made (the arm's seed stream included)."""
    if not cfg.experiment.seeded_requests:
        return "unseeded (experiment.seeded_requests=false)"
    stream = cfg.experiment.arm(run.arm).seed_stream
    return f"base {run.base_seed} + item seed_offset + seed_stream {stream} * 2**32"


def stream_diff(cfg: BenchConfig, arm: str) -> str:
    base = cfg.experiment.arm(cfg.experiment.baseline).seed_stream
    other = cfg.experiment.arm(arm).seed_stream
    return "(same seed stream)" if base == other else f"seed_stream {base} -> {other}"


def print_dry_run(cfg: BenchConfig, console: Console) -> int:
    """Print the plan; the exit code: non-zero when the argv preflight refused or could not check a command."""
    exp = cfg.experiment
    plan = make_plan(exp)
    report = run_preflight(cfg, console)
    console.print(f"[bold]dry run[/] of experiment [bold]{exp.name}[/]: {len(plan)} runs, "
                  f"order={exp.order}, placement={exp.placement}, baseline={exp.baseline}")
    console.print(f"workload: {cfg.workload.kind}; sampling: {cfg.sampling}; client: route={cfg.client.route} "
                  f"concurrency={cfg.client.concurrency} request_rate={cfg.client.request_rate}")
    console.print(f"pinning: server.cpus={list(cfg.server.cpus) or 'none'} client.cpus={list(cfg.client.cpus) or 'none'}",
                  highlight=False)
    n_slots = len(slots(plan))
    check_shard(cfg.shard, plan)
    console.print(f"shards: {n_slots}, one per (base seed, repeat), each holding both arms in their order"
                  + (f"; showing shard={cfg.shard}" if cfg.shard is not None else
                     f"; as cluster jobs: -m hydra/launcher=submitit_slurm shard='range(0,{n_slots})'"),
                  highlight=False, soft_wrap=True)
    for run in plan:
        if cfg.shard is not None and run.slot != cfg.shard:
            continue
        spec = spec_of(cfg, run)
        where = f"CUDA_VISIBLE_DEVICES={run.gpu}" if run.gpu is not None else "sequential"
        console.print(f"\n[bold][{run.index}] {run.run_id}[/]  arm={run.arm} seed={run.base_seed} "
                      f"repeat={run.repeat} slot={run.slot} placement: {where}", highlight=False, soft_wrap=True)
        console.print("  argv: " + shlex.join(shown_argv(spec)), highlight=False, soft_wrap=True)
        env = " ".join(f"{k}={v}" for k, v in sorted(spec.env_overrides.items())) or "(none)"
        console.print(f"  env:  {env}", highlight=False, soft_wrap=True)
        console.print(f"  request seeds: {seeds_line(cfg, run)}", highlight=False, soft_wrap=True)
        if report is not None:
            console.print(f"  preflight: {escape(report.outcome_of(run.run_id).line())}", highlight=False, soft_wrap=True)
    first_slot = [r for r in plan if r.slot == 0]
    base_run = next(r for r in first_slot if r.arm == exp.baseline)
    base_spec = spec_of(cfg, base_run)
    table = Table(title=f"What differs from the baseline arm '{exp.baseline}' (declared: {exp.declared_difference!r})")
    for col in ("arm", "argv", "env", "seeds"):
        table.add_column(col, overflow="fold")
    for run in first_slot:
        if run.arm != exp.baseline:
            spec = spec_of(cfg, run)
            env_base = {k: v for k, v in base_spec.env_overrides.items() if k != "CUDA_VISIBLE_DEVICES"}
            env_other = {k: v for k, v in spec.env_overrides.items() if k != "CUDA_VISIBLE_DEVICES"}
            table.add_row(run.arm, argv_diff(base_spec.argv, spec.argv), env_diff(env_base, env_other),
                          stream_diff(cfg, run.arm))
    console.print()
    console.print(table)
    code = print_verdict(report, console) if report is not None else 0
    console.print("nothing was launched (dry_run=true)")
    return code
