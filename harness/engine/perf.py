"""Throughput of the embedded server: NONE vs DFLASH (token-wise, block) at several concurrencies.

    python -m harness.engine.perf [--model-path embedded:small] [--concurrency 1 8 32] ...   (make perf)

Each arm gets a fresh server subprocess (the harness's launcher) and the harness's own streaming client
drives closed-loop load over the synthetic workload's prompts: per concurrency a warm-up, a
/flush_cache, then `max(min_requests, requests_per_slot * concurrency)` requests with `ignore_eos`, so
every request yields exactly `max_new_tokens`. Output tokens/s = total output tokens / wall time;
acceptance length = sum completion_tokens / sum spec_verify_ct (SGLang's definition). A table is
printed and written, with the machine and every setting, under results/perf/<timestamp>/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from harness.client import Outcome, RequestSpec, drive
from harness.config import ClientConfig, LogChecks, SamplingConfig
from harness.launcher import LaunchSpec, Server, flush_cache, free_port
from workloads.config import WorkloadConfig
from workloads.synthetic import load as load_synthetic

HOST = "127.0.0.1"


@dataclass(frozen=True)
class PerfConfig:
    """What the benchmark runs; every field is a command-line flag."""

    model_path: str = "embedded:small"
    concurrency: tuple[int, ...] = (1, 8, 32)
    max_new_tokens: int = 128
    requests_per_slot: int = 2
    min_requests: int = 6
    num_draft_tokens: int = 8
    draft_mode: str = "sampled"
    temperature: float = 1.0
    top_k: int = 20
    top_p: float = 0.95
    server_args: tuple[str, ...] = ()
    arms: tuple[str, ...] = ("NONE", "DFLASH-token", "DFLASH-block")
    results_dir: str = "results/perf"


@dataclass
class Measurement:
    arm: str
    concurrency: int
    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    accept_length: float | None  # sum completion_tokens / sum spec_verify_ct; None for NONE
    speedup: float | None = None  # tokens_per_s / NONE's at the same concurrency


@dataclass
class Machine:
    cpu: str
    cores: int
    torch: str
    torch_threads: int
    python: str
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    extra: dict = field(default_factory=dict)


def arm_args(name: str, cfg: PerfConfig) -> list[str]:
    """Server flags of an arm (on top of the model path and the common flags)."""
    spec = ["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", str(cfg.num_draft_tokens),
            "--draft-mode", cfg.draft_mode]
    table = {"NONE": [], "DFLASH-token": spec, "DFLASH-block": [*spec, "--speculative-use-block-verification"]}
    if name not in table:
        raise ValueError(f"unknown arm {name!r}; valid: {', '.join(table)}")
    return table[name]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def machine() -> Machine:
    return Machine(cpu=cpu_model(), cores=os.cpu_count() or 0, torch=torch.__version__,
                   torch_threads=torch.get_num_threads(), python=platform.python_version(),
                   load_before=os.getloadavg())


# ---------------------------------------------------------------------- running one arm


def request_specs(n: int, max_new_tokens: int, offset: int) -> list[RequestSpec]:
    items = load_synthetic(WorkloadConfig(kind="synthetic", n_items=offset + n, seed=0)).items[offset:]
    return [RequestSpec(item=item, request_seed=None, warmup=False, max_new_tokens=max_new_tokens)
            for item in items]


async def measure(url: str, arm: str, concurrency: int, cfg: PerfConfig, sampling: SamplingConfig,
                  model: str) -> Measurement:
    """Warm up, flush, then time a closed loop of requests at `concurrency`."""
    client = ClientConfig(route="generate", stream=True, concurrency=concurrency, timeout_s=3600)
    warm = request_specs(concurrency, 8, offset=0)
    await drive(url, warm, sampling=sampling, client=client, model=model, concurrency=concurrency,
                arrival_seed=0, on_done=lambda s, o: None)
    await flush_cache(url)
    n = max(cfg.min_requests, cfg.requests_per_slot * concurrency)
    outcomes: list[Outcome] = []
    start = time.monotonic()
    await drive(url, request_specs(n, cfg.max_new_tokens, offset=concurrency), sampling=sampling, client=client,
                model=model, concurrency=concurrency, arrival_seed=0, on_done=lambda s, o: outcomes.append(o))
    wall = time.monotonic() - start
    good = [o.meta_info for o in outcomes if o.error is None]
    tokens = sum(m["completion_tokens"] for m in good)
    verify = sum(m.get("spec_verify_ct", 0) for m in good)
    return Measurement(arm=arm, concurrency=concurrency, requests=n, errors=n - len(good), output_tokens=tokens,
                       wall_s=wall, tokens_per_s=tokens / wall, accept_length=tokens / verify if verify else None)


async def run_arm(arm: str, cfg: PerfConfig, out_dir: Path) -> list[Measurement]:
    port = free_port(HOST)
    argv = [sys.executable, "-m", "harness.engine", "--model-path", cfg.model_path, "--host", HOST,
            "--port", str(port), "--max-running-requests", str(max(cfg.concurrency)), *cfg.server_args,
            *arm_args(arm, cfg)]
    spec = LaunchSpec(argv=argv, env_overrides={}, host=HOST, port=port, log_path=out_dir / f"{arm}.server.log",
                      log_checks=LogChecks(), ready_timeout_s=300, stop_timeout_s=20)
    sampling = SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                              max_new_tokens=cfg.max_new_tokens, ignore_eos=True)
    async with Server(spec) as server:
        await server.wait_ready()
        return [await measure(spec.base_url, arm, c, cfg, sampling, cfg.model_path) for c in cfg.concurrency]


# ---------------------------------------------------------------------- report


def add_speedups(rows: list[Measurement]) -> None:
    base = {r.concurrency: r.tokens_per_s for r in rows if r.arm == "NONE"}
    for r in rows:
        if r.concurrency in base and base[r.concurrency] > 0:
            r.speedup = r.tokens_per_s / base[r.concurrency]


def render(rows: list[Measurement], mach: Machine, cfg: PerfConfig) -> Table:
    table = Table(title=f"embedded server throughput: {cfg.model_path}, {mach.cpu} ({mach.cores} cores), "
                        f"{cfg.max_new_tokens} new tokens/request, T={cfg.temperature} top_k={cfg.top_k} "
                        f"top_p={cfg.top_p}, gamma={cfg.num_draft_tokens - 1} {cfg.draft_mode} drafts")
    for col in ("arm", "concurrency", "output tok/s", "vs NONE", "accept length", "requests", "tokens", "wall s"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for r in sorted(rows, key=lambda r: (r.concurrency, cfg.arms.index(r.arm))):
        table.add_row(r.arm, str(r.concurrency), f"{r.tokens_per_s:.1f}",
                      "-" if r.speedup is None else f"{r.speedup:.2f}x",
                      "-" if r.accept_length is None else f"{r.accept_length:.2f}",
                      f"{r.requests}" + (f" ({r.errors} failed)" if r.errors else ""),
                      str(r.output_tokens), f"{r.wall_s:.1f}")
    return table


def markdown(rows: list[Measurement], mach: Machine, cfg: PerfConfig) -> str:
    lines = [f"Machine: {mach.cpu}, {mach.cores} cores, torch {mach.torch} ({mach.torch_threads} threads); "
             f"load average before {mach.load_before[0]:.2f}, after {mach.load_after[0]:.2f}.",
             f"Model {cfg.model_path}; {cfg.max_new_tokens} new tokens per request (ignore_eos); "
             f"T={cfg.temperature}, top_k={cfg.top_k}, top_p={cfg.top_p}; DFLASH gamma={cfg.num_draft_tokens - 1}, "
             f"{cfg.draft_mode} drafts.", "",
             "| arm | concurrency | output tok/s | vs NONE | accept length |", "|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r.concurrency, cfg.arms.index(r.arm))):
        lines.append(f"| {r.arm} | {r.concurrency} | {r.tokens_per_s:.1f} | "
                     f"{'-' if r.speedup is None else f'{r.speedup:.2f}x'} | "
                     f"{'-' if r.accept_length is None else f'{r.accept_length:.2f}'} |")
    return "\n".join(lines) + "\n"


def results_dir(cfg: PerfConfig) -> Path:
    out = Path(cfg.results_dir) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_results(rows: list[Measurement], mach: Machine, cfg: PerfConfig, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(
        {"config": asdict(cfg), "machine": asdict(mach), "rows": [asdict(r) for r in rows]}, indent=2))
    (out / "table.md").write_text(markdown(rows, mach, cfg))


# ---------------------------------------------------------------------- entry point


def parse(argv: list[str] | None) -> PerfConfig:
    d = PerfConfig()
    p = argparse.ArgumentParser(prog="python -m harness.engine.perf", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--model-path", default=d.model_path)
    p.add_argument("--concurrency", type=int, nargs="+", default=list(d.concurrency))
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--requests-per-slot", type=int, default=d.requests_per_slot)
    p.add_argument("--min-requests", type=int, default=d.min_requests)
    p.add_argument("--num-draft-tokens", type=int, default=d.num_draft_tokens, help="gamma + 1")
    p.add_argument("--draft-mode", choices=("greedy", "sampled"), default=d.draft_mode)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--top-p", type=float, default=d.top_p)
    p.add_argument("--server-arg", action="append", default=[], dest="server_args",
                   help="extra server flag for every arm (repeat; e.g. --server-arg=--num-threads --server-arg=1)")
    p.add_argument("--arms", nargs="+", default=list(d.arms), choices=list(d.arms))
    p.add_argument("--results-dir", default=d.results_dir)
    ns = p.parse_args(argv)
    if min(ns.concurrency) < 1 or ns.max_new_tokens < 1 or ns.num_draft_tokens < 2:
        p.error("--concurrency and --max-new-tokens must be >= 1, --num-draft-tokens >= 2")
    return PerfConfig(model_path=ns.model_path, concurrency=tuple(ns.concurrency), max_new_tokens=ns.max_new_tokens,
                      requests_per_slot=ns.requests_per_slot, min_requests=ns.min_requests,
                      num_draft_tokens=ns.num_draft_tokens, draft_mode=ns.draft_mode, temperature=ns.temperature,
                      top_k=ns.top_k, top_p=ns.top_p, server_args=tuple(ns.server_args), arms=tuple(ns.arms),
                      results_dir=ns.results_dir)


async def run(cfg: PerfConfig, out_dir: Path, console: Console) -> list[Measurement]:
    rows: list[Measurement] = []
    for arm in cfg.arms:
        console.print(f"[bold]{arm}[/bold]: starting a server ({' '.join(arm_args(arm, cfg)) or 'no speculation'})")
        for m in await run_arm(arm, cfg, out_dir):
            console.print(f"  concurrency {m.concurrency}: {m.tokens_per_s:.1f} output tok/s"
                          + (f", accept length {m.accept_length:.2f}" if m.accept_length else ""))
            rows.append(m)
    return rows


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    console = Console(width=max(Console().width, 130))
    mach = machine()
    out = results_dir(cfg)
    rows = asyncio.run(run(cfg, out, console))
    mach.load_after = os.getloadavg()
    add_speedups(rows)
    console.print(render(rows, mach, cfg))
    write_results(rows, mach, cfg, out)
    console.print(f"Machine: {mach.cpu}, {mach.cores} cores; load average {mach.load_before[0]:.2f} before, "
                  f"{mach.load_after[0]:.2f} after")
    console.print(f"Results written to {out}/ (results.json, table.md, server logs)")
    return 0 if all(r.errors == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
