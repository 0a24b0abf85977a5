"""`dry_run=true`: print every planned run's exact argv, environment and placement, and what differs
between the arms, without launching anything. For backend sglang each argv is also checked by the
SGLang of the interpreter that will run it (`harness.backends.python_preflight`, `server.preflight`).
Both read the planned launches that the command built once (`harness.runner.plan.planned_launches`) and that its
real run would launch."""

from __future__ import annotations

import difflib
import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.backends import get as get_backend
from harness.backends.python_preflight import EXIT_CODE
from harness.contract import PlannedRun, ServerBinary, ServerCode, SourceDoc
from harness.runner.config import BenchConfig
from harness.runner.plan import check_shard, slots
from harness.server.launch import PlannedLaunch
from harness.server.provenance import ProvenanceError, probe_server_code
from workloads.base import Workload


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


def code_line(code: ServerCode) -> str:
    """What a server will import, in one line."""
    where = code.checkout
    if where is None:
        held = f"installed {code.distribution or 'package'} {code.distribution_version or ''}".rstrip()
    elif where.kind == "snapshot":
        held = f"snapshot of {where.repo} at {where.commit}"
    else:
        state = (
            f"dirty: diff {(where.diff_sha256 or 'none')[:12]}, {len(where.untracked)} untracked"
            if where.dirty
            else "clean"
        )
        held = f"git {where.commit} ({where.branch or 'detached'}, {state})"
    versions = " ".join(
        f"{k}={getattr(code, k)}" for k in ("torch", "sglang", "sgl_kernel", "flashinfer", "triton") if getattr(code, k)
    )
    return (
        f"{code.module} from {code.module_origin}: {held}; python {code.python} {versions}; "
        f"{len(code.packages)} packages (sha256 {code.packages_sha256[:12]})"
    )


def print_server_code(launches: list[PlannedLaunch], sources: dict[str, SourceDoc], console: Console) -> list[str]:
    """Each arm's source and the code its server will import (asked of its interpreter); the arms whose
    interpreter could not say (a real run of them fails before its server starts)."""
    console.print("\n[bold]code under test[/] (each arm's interpreter asked, as its server will start):")
    firsts: dict[str, PlannedLaunch] = {}
    for launch in launches:
        firsts.setdefault(launch.run.arm, launch)
    failed = []
    for launch in firsts.values():
        arm = launch.run.arm
        if launch.launch.native or not launch.launch.launched:
            binary = get_backend(launch.launch.backend).describe_code(launch.launch)
            if not isinstance(binary, ServerBinary):
                console.print(
                    f"  {arm}: unknown: the server at {launch.launch.base_url} is not launched by the run (its code "
                    "cannot be pinned)",
                    highlight=False,
                    soft_wrap=True,
                )
                continue
            built = f"built from {binary.package} {binary.package_version}" if binary.package else "build unknown"
            console.print(
                f"  {arm}: {binary.path} (sha256 {binary.sha256[:16]}, {built}): "
                f"{escape(binary.version.splitlines()[0] if binary.version else '?')}",
                highlight=False,
                soft_wrap=True,
            )
            continue
        if (src := sources.get(arm)) is not None:
            console.print(
                f"  {arm}: source {src.repo} ref {src.ref} = {src.commit}, snapshot {src.snapshot}/{src.package_dir}",
                highlight=False,
                soft_wrap=True,
            )
        try:
            console.print(
                f"  {arm}: {escape(code_line(probe_server_code(launch.launch)))}", highlight=False, soft_wrap=True
            )
        except ProvenanceError as exc:
            failed.append(arm)
            console.print(
                f"  [bold red]{arm}: {escape(str(exc))}[/] (a real run of this arm fails here)",
                highlight=False,
                soft_wrap=True,
            )
    return failed


def print_dry_run(
    cfg: BenchConfig,
    console: Console,
    launches: list[PlannedLaunch],
    sources: dict[str, SourceDoc] | None = None,
    workload: Workload | None = None,
) -> int:
    """Print the plan (`launches`: harness.runner.plan.planned_launches, what a real run would launch); the exit
    code: non-zero when the argv preflight refused or could not check a command, or (unless server.preflight=skip)
    an arm's interpreter could not say what code its server would run."""
    exp = cfg.experiment
    sources = sources or {}
    plan = [launch.run for launch in launches]
    backend = get_backend(cfg.server.backend)
    preflight = backend.preflight(cfg.server, launches, console)
    console.print(
        f"[bold]dry run[/] of experiment [bold]{exp.name}[/]: {len(plan)} runs, "
        f"order={exp.order}, placement={exp.placement}, baseline={exp.baseline}"
    )
    what = (
        f"{workload.name}, {len(workload.items)} items, sha256 {workload.sha256[:12]}"
        if workload
        else cfg.workload.kind
    )
    console.print(
        f"workload: {what}; sampling: {cfg.sampling}; client: route={cfg.client.route} "
        f"concurrency={cfg.client.concurrency} request_rate={cfg.client.request_rate}"
    )
    console.print(
        f"pinning: server.cpus={list(cfg.server.cpus) or 'none'} client.cpus={list(cfg.client.cpus) or 'none'}",
        highlight=False,
    )
    n_slots = len(slots(plan))
    check_shard(cfg.shard, plan)
    console.print(
        f"shards: {n_slots}, one per (base seed, repeat), each holding both arms in their order"
        + (
            f"; showing shard={cfg.shard}"
            if cfg.shard is not None
            else f"; as cluster jobs: -m hydra/launcher=submitit_slurm shard='range(0,{n_slots})'"
        ),
        highlight=False,
        soft_wrap=True,
    )
    for launch in launches:
        run, planned = launch.run, launch.launch
        if cfg.shard is not None and run.slot != cfg.shard:
            continue
        where = f"CUDA_VISIBLE_DEVICES={run.gpu}" if run.gpu is not None else "sequential"
        console.print(
            f"\n[bold][{run.index}] {run.run_id}[/]  arm={run.arm} seed={run.base_seed} "
            f"repeat={run.repeat} slot={run.slot} placement: {where}",
            highlight=False,
            soft_wrap=True,
        )
        if planned.launched:
            console.print("  argv: " + shlex.join(launch.shown_argv()), highlight=False, soft_wrap=True)
            env = " ".join(f"{k}={v}" for k, v in sorted(planned.env_overrides.items())) or "(none)"
            console.print(f"  env:  {env}", highlight=False, soft_wrap=True)
        else:
            console.print(f"  server: already running at {planned.base_url} (not launched)", highlight=False)
        console.print(f"  request seeds: {seeds_line(cfg, run)}", highlight=False, soft_wrap=True)
        if preflight is not None:
            console.print(f"  preflight: {escape(preflight.line(run.run_id))}", highlight=False, soft_wrap=True)
    console.print()
    console.print(difference_table(cfg, [launch for launch in launches if launch.run.slot == 0]))
    unreadable = print_server_code([launch for launch in launches if launch.run.slot == 0], sources, console)
    code = preflight.verdict(console) if preflight is not None else 0
    for limit in backend.cannot_measure:
        console.print(f"not measured on backend {backend.name}: {limit}", highlight=False, soft_wrap=True)
    if unreadable and cfg.server.preflight == "skip":  # made where the servers' installs are not: said, not counted
        console.print(
            f"[bold yellow]code under test unknown for arm(s) {', '.join(unreadable)}[/] (server.preflight=skip: "
            "not counted in the exit code)",
            highlight=False,
        )
    elif unreadable:
        console.print(
            f"[bold red]code under test unknown for arm(s) {', '.join(unreadable)}[/]: their runs would fail "
            f"before their servers start; exit {EXIT_CODE} (server.preflight=skip for a dry run made "
            "elsewhere)",
            highlight=False,
        )
        code = code or EXIT_CODE
    console.print("nothing was launched (dry_run=true)")
    return code


def difference_table(cfg: BenchConfig, first_slot: list[PlannedLaunch]) -> Table:
    """What each arm's command, environment (placement aside) and seeds change against the baseline's."""
    exp = cfg.experiment
    base = next(launch.launch for launch in first_slot if launch.run.arm == exp.baseline)
    table = Table(title=f"What differs from the baseline arm '{exp.baseline}' (declared: {exp.declared_difference!r})")
    for col in ("arm", "argv", "env", "seeds"):
        table.add_column(col, overflow="fold")
    env_base = {k: v for k, v in base.env_overrides.items() if k != "CUDA_VISIBLE_DEVICES"}
    for launch in first_slot:
        if launch.run.arm != exp.baseline:
            env_other = {k: v for k, v in launch.launch.env_overrides.items() if k != "CUDA_VISIBLE_DEVICES"}
            other = launch.launch
            table.add_row(
                launch.run.arm,
                argv_diff(base.argv, other.argv) if other.launched else f"server {other.base_url} (vs {base.base_url})",
                env_diff(env_base, env_other),
                stream_diff(cfg, launch.run.arm),
            )
    return table
