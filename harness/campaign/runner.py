"""Run a campaign: every planned run gets a fresh server, a warmup, a cache flush, the measured
requests, and a manifest. Finished runs of an existing campaign are kept; unfinished ones are set
aside (never mixed in) and run again from scratch.

Nothing but sending and recording happens inside the measured window: responses are scored once the
run's server is stopped (scores.jsonl), and the machine's load is sampled before and after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.campaign.plan import PlannedRun, make_plan, slots
from harness.campaign.records import (
    RecordWriter,
    finish_reason,
    make_record,
    make_score,
    read_json,
    write_json,
)
from harness.client.stream import Outcome, RequestSpec, drive
from harness.config import UNMEASURED_KEYS, BenchConfig, ClientConfig, ConfigError, request_seed
from harness.host import envinfo, machine
from harness.host.machine import CpuPin
from harness.schema import SCHEMA_VERSION, CampaignDoc, Manifest, to_json
from harness.server.launcher import (
    LaunchSpec,
    Server,
    ServerError,
    build_spec,
    check_log,
    describe_failed_checks,
    flush_cache,
    free_port,
    get_json,
    redact,
    redact_argv,
)
from workloads.base import Workload


@dataclass
class Campaign:
    """A campaign directory: results/<experiment>/<campaign_id>/."""

    cfg: BenchConfig
    config_dict: dict[str, Any]
    workload: Workload
    plan: list[PlannedRun]
    root: Path
    console: Console = field(default_factory=Console)
    pin: CpuPin = field(default_factory=lambda: CpuPin([]))  # the runner's own pinning (client.cpus)
    shard: int | None = None  # run only this slot of the plan (None: every slot)
    _locks: list[Any] = field(default_factory=list, repr=False)

    @property
    def campaign_id(self) -> str:
        return self.root.name

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def campaign_doc(self) -> CampaignDoc:
        exp, cfg = self.cfg.experiment, self.cfg
        return CampaignDoc(
            schema_version=SCHEMA_VERSION,
            campaign_id=self.campaign_id,
            experiment=exp.name,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            config=self.config_dict,
            arms=[{"name": a.name, "args": redact_argv([str(t) for t in a.args]), "env": redact(dict(a.env)),
                   "python": a.python, "seed_stream": a.seed_stream} for a in exp.arms],
            baseline=exp.baseline,
            declared_difference=exp.declared_difference,
            concurrency=cfg.client.concurrency,
            request_rate=cfg.client.request_rate,
            max_new_tokens=cfg.sampling.max_new_tokens,
            workload=workload_doc(self.workload),
            plan=[r.to_dict() for r in self.plan],
        )

    @property
    def todo(self) -> list[PlannedRun]:
        """The runs this runner does: the whole plan, or the slot of its shard."""
        return [r for r in self.plan if self.shard is None or r.slot == self.shard]

    def open(self) -> None:
        """Lock the campaign (the shard's slot, or every slot), then create campaign.json or check that an
        existing campaign was made by the same config. Raises ConfigError when the folder cannot be written
        or another runner holds a slot this one needs."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._locks = lock_slots(self.root, sorted({r.slot for r in self.todo}))
            with campaign_file_lock(self.root):
                path = self.root / "campaign.json"
                if not path.exists():
                    write_json(path, to_json(self.campaign_doc()))
                    return
                old = read_json(path)
        except OSError as exc:
            raise ConfigError(f"cannot write the campaign folder {self.root} ({exc.strerror or exc}); "
                              "choose a writable results_dir=...") from None
        diffs = config_differences(with_added_keys(old.get("config", {})), self.config_dict)
        if diffs:
            raise ConfigError(
                f"campaign {self.root} was created with a different config (differs at: {', '.join(diffs[:10])}); "
                "resume it with the same overrides, or start a new campaign (leave out `campaign=`)")
        self.console.print(f"[bold]{'joining' if self.shard is not None else 'resuming'}[/] campaign {self.root}")

    def close(self) -> None:
        """Release the slot locks (the process's exit does it too)."""
        for handle in self._locks:
            handle.close()
        self._locks = []

    def run_status(self, run_id: str) -> str | None:
        path = self.run_dir(run_id) / "manifest.json"
        return read_json(path).get("status") if path.exists() else None

    def set_aside(self, run_id: str) -> Path | None:
        """Move an unfinished run's files to attempts/<run_id>.<n> so a rerun starts clean."""
        src = self.run_dir(run_id)
        if not src.exists():
            return None
        n = 1
        while (dst := self.root / "attempts" / f"{run_id}.{n}").exists():
            n += 1
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))
        return dst

    def log_order(self, run_id: str, status: str, t_start: float, t_end: float) -> None:
        path = self.root / "campaign.json"
        with campaign_file_lock(self.root):  # shards append to the same list
            doc = read_json(path)
            doc["order_run"].append({"run_id": run_id, "status": status, "t_start_unix": t_start,
                                     "t_end_unix": t_end, "host": socket.gethostname()})
            write_json(path, doc)


def slot_lock_name(slot: int) -> str:
    return f".lock.shard-{slot}"


def lock_slots(root: Path, slot_ids: list[int]) -> list[Any]:
    """Hold an exclusive lock on each slot (shard) of the campaign for as long as the returned files stay
    open (the process's life: the kernel drops them even on SIGKILL, so a crashed runner never leaves a
    stale lock). Shards of one campaign run side by side; two runners on one slot never do.

    A runner that finds a slot held gets a ConfigError naming the holder (its own locks are released).
    """
    held: list[Any] = []
    for slot in slot_ids:
        handle = open(root / slot_lock_name(slot), "a+")  # noqa: SIM115  (kept open: the lock lives with it)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            for h in [handle, *held]:
                h.close()
            raise ConfigError(f"campaign {root} (shard {slot}) is being run by {holder}; wait for it to finish, "
                              "or start a new campaign (leave out campaign=)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{datetime.now(UTC).isoformat(timespec='seconds')}\n")
        handle.flush()
        held.append(handle)
    return held


@contextlib.contextmanager
def campaign_file_lock(root: Path) -> Iterator[None]:
    """A short exclusive lock around reading and rewriting campaign.json (shards share it)."""
    with open(root / ".lock.campaign-json", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as campaign.json stores it: env values and secret flags of the server and
    of each arm redacted (launcher.redact, redact_argv)."""
    out = copy.deepcopy(config)
    parts = [out.get("server") or {}] + list((out.get("experiment") or {}).get("arms") or [])
    for part in parts:
        if isinstance(part.get("env"), dict):
            part["env"] = redact(part["env"])
        if isinstance(part.get("args"), list):
            part["args"] = redact_argv([str(a) for a in part["args"]])
    return out


def workload_doc(workload: Workload) -> dict[str, Any]:
    return {
        "name": workload.name, "dataset_id": workload.dataset_id, "revision": workload.revision,
        "sha256": workload.sha256, "skipped_placeholders": workload.skipped_placeholders,
        "items": [{"item_id": i.item_id, "seed_offset": i.seed_offset, "category": i.category, "answer": i.answer}
                  for i in workload.items],
    }


# keys added to the config after campaigns were made: absent from an older campaign's stored config,
# they mean what these values mean (so such a campaign still resumes)
ADDED_KEYS: dict[str, Any] = {"server.cpus": [], "client.cpus": [], "experiment.arms.seed_stream": 0}
# keys removed since (nothing read them): an older campaign's value is dropped before comparing
REMOVED_KEYS = ("experiment.fresh_server_per_run",)


def with_added_keys(config: dict[str, Any]) -> dict[str, Any]:
    """An older campaign's stored config with the keys added since filled in with their neutral values,
    and the keys removed since dropped."""
    out = copy.deepcopy(config)
    for dotted in REMOVED_KEYS:
        head, key = dotted.rsplit(".", 1)
        if isinstance(section := out.get(head), dict):
            section.pop(key, None)
    for dotted, value in ADDED_KEYS.items():
        head, key = dotted.rsplit(".", 1)
        parts = head.split(".")
        node: Any = out
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
        targets = node if isinstance(node, list) else [node]
        for target in targets:
            if isinstance(target, dict):
                target.setdefault(key, copy.deepcopy(value))
    return out


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, ignoring the keys that do not change what is measured."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if not prefix and key in UNMEASURED_KEYS:
                continue
            out += config_differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


def request_specs(cfg: BenchConfig, workload: Workload, base_seed: int,
                  seed_stream: int = 0) -> tuple[list[RequestSpec], list[RequestSpec]]:
    """(warmup specs, measured specs) of one run. Request seed = base seed + the item's numeric id +
    the arm's seed_stream * 2**32."""
    def seed(offset: int) -> int | None:
        return request_seed(base_seed, offset, seed_stream) if cfg.experiment.seeded_requests else None

    items = workload.items
    warm = [RequestSpec(items[i % len(items)], seed(items[i % len(items)].seed_offset), True,
                        cfg.experiment.warmup.max_new_tokens) for i in range(cfg.experiment.warmup.requests)]
    measured = [RequestSpec(it, seed(it.seed_offset), False, cfg.sampling.max_new_tokens) for it in items]
    return warm, measured


def check_request_seeds(cfg: BenchConfig, workload: Workload) -> None:
    """ConfigError (before anything launches) when a planned request seed does not fit 64 bits."""
    if not cfg.experiment.seeded_requests:
        return
    for arm in cfg.experiment.arms:
        for base_seed in cfg.experiment.base_seeds:
            for item in workload.items:
                request_seed(base_seed, item.seed_offset, arm.seed_stream)


def server_env(env_overrides: dict[str, str]) -> dict[str, str]:
    """The server's whole environment, secrets redacted."""
    return redact({**os.environ, **env_overrides})


def env_sha256(env_overrides: dict[str, str]) -> str:
    """Hash of the server's whole environment (secrets redacted): equal hashes, equal environments."""
    return hashlib.sha256(json.dumps(server_env(env_overrides), sort_keys=True).encode()).hexdigest()


class RunFailed(RuntimeError):
    pass


@dataclass
class Response:
    """What scoring needs of one request, kept in memory until the measured window is over (the text
    too, whether or not the record stores it)."""

    request_index: int
    spec: RequestSpec
    text: str
    errored: bool


@dataclass
class RunContext:
    campaign: Campaign
    planned: PlannedRun
    spec: LaunchSpec
    manifest: Manifest
    progress: Progress
    failures: list[str] = field(default_factory=list)  # "item: error" of each errored/aborted/timed-out request
    responses: list[Response] = field(default_factory=list)

    def save(self) -> None:
        write_json(self.campaign.run_dir(self.planned.run_id) / "manifest.json", to_json(self.manifest))


def start_manifest(c: Campaign, run: PlannedRun, spec: LaunchSpec) -> Manifest:
    cfg = c.cfg
    mono, unix = time.monotonic(), time.time()
    return Manifest(
        schema_version=SCHEMA_VERSION, campaign_id=c.campaign_id, run_id=run.run_id, arm=run.arm,
        base_seed=run.base_seed, repeat=run.repeat, gpu=run.gpu,
        command=redact_argv(spec.argv), env=redact(spec.env_overrides), env_full=server_env(spec.env_overrides),
        env_full_sha256=env_sha256(spec.env_overrides),
        versions={"harness": envinfo.git_info(), **envinfo.versions()},
        gpu_info=envinfo.gpu_info(), host=envinfo.host_info(),
        dataset={"id": c.workload.dataset_id, "revision": c.workload.revision, "sha256": c.workload.sha256},
        model_path=cfg.server.model_path,
        wall_anchor={"monotonic": mono, "unix": unix}, t_start_unix=unix,
        concurrency=cfg.client.concurrency, request_rate=cfg.client.request_rate,
        max_new_tokens=cfg.sampling.max_new_tokens,
        client={"stream_mode": None, "arrival": "open" if cfg.client.request_rate else "closed",
                "cpus": list(cfg.client.cpus) or None},
        server_cpus=list(spec.cpus) or None,
        scorer={"name": c.workload.scorer.name, "version": c.workload.scorer.version},
    )


def incremental_stream(server_info: dict | None) -> bool:
    """Whether the server streams only the new text in each chunk (SGLang --incremental-streaming-output)."""
    return bool((server_info or {}).get("incremental_streaming_output"))


def stream_mode(client: ClientConfig, server_info: dict | None) -> str:
    """How the client reads the stream: none | chat | incremental | cumulative (manifest client.stream_mode)."""
    if not client.stream:
        return "none"
    if client.route == "chat":
        return "chat"
    return "incremental" if incremental_stream(server_info) else "cumulative"


def seeds_honoured(cfg: BenchConfig, server_info: dict | None) -> bool:
    if not cfg.experiment.seeded_requests:
        return True
    return bool((server_info or {}).get("enable_deterministic_inference", False))


async def read_server_facts(ctx: RunContext) -> None:
    """/server_info and /model_info after readiness, and what follows from them (seeds, stream mode)."""
    c, run, cfg, base = ctx.campaign, ctx.planned, ctx.campaign.cfg, ctx.spec.base_url
    man = ctx.manifest
    man.server_info = await get_json(base, "/server_info") or await get_json(base, "/get_server_info")
    man.model_info = await get_json(base, "/model_info") or await get_json(base, "/get_model_info")
    man.seeds_honoured = seeds_honoured(cfg, man.server_info)
    man.client["stream_mode"] = stream_mode(cfg.client, man.server_info)
    if not man.seeds_honoured:
        c.console.print(Panel(
            f"run {run.run_id}: per-request seeds are sent but the server does not run with "
            "--enable-deterministic-inference, so it ignores them; results are NOT reproducible "
            "(recorded as seeds_honoured: false)", title="WARNING: seeds not honoured", style="bold red"))
    ctx.save()


async def drive_run(ctx: RunContext) -> None:
    """Warm up, flush, send the measured requests, appending every record; the runner is pinned to
    client.cpus meanwhile, and the machine's CPU counters are read at both ends of the measured window."""
    c, run, cfg = ctx.campaign, ctx.planned, ctx.campaign.cfg
    base = ctx.spec.base_url
    await read_server_facts(ctx)
    incremental = incremental_stream(ctx.manifest.server_info)
    ids = {"campaign_id": c.campaign_id, "run_id": run.run_id, "arm": run.arm, "base_seed": run.base_seed,
           "repeat": run.repeat}
    warm, measured = request_specs(cfg, c.workload, run.base_seed, cfg.experiment.arm(run.arm).seed_stream)
    index_of = {id(spec): i for i, spec in enumerate([*warm, *measured])}
    writer = RecordWriter(c.run_dir(run.run_id) / "records.jsonl")
    task = ctx.progress.add_task(f"{run.run_id}", total=None)
    model = (ctx.manifest.model_info or {}).get("model_path") or cfg.server.model_path

    def on_done(spec: RequestSpec, out: Outcome) -> None:
        index = index_of[id(spec)]
        writer.append(make_record(ids, index, spec, out, cfg.client.store_output_text))
        ctx.responses.append(Response(index, spec, out.text, out.error is not None))
        if out.error is not None or finish_reason(out) == "abort":
            ctx.failures.append(f"{'warmup ' if spec.warmup else ''}item {spec.item.item_id}: {out.error or 'aborted'}")
        ctx.progress.advance(task)

    c.pin.acquire()
    try:
        if warm:
            ctx.progress.update(task, total=len(warm), completed=0, description=f"{run.run_id} warmup")
            await drive(base, warm, sampling=cfg.sampling, client=cfg.client, model=model,
                        concurrency=len(warm), arrival_seed=run.base_seed, on_done=on_done,
                        incremental=incremental)
        if cfg.experiment.warmup.flush_cache:
            await flush_cache(base)
        ctx.progress.update(task, total=len(measured), completed=0, description=f"{run.run_id}")
        start = machine.read_counters()
        await drive(base, measured, sampling=cfg.sampling, client=cfg.client, model=model,
                    concurrency=cfg.client.concurrency, arrival_seed=run.base_seed, on_done=on_done,
                    incremental=incremental)
        ctx.manifest.machine["during"] = machine.during(start, machine.read_counters())
    finally:
        c.pin.release()
        writer.close()
        ctx.progress.remove_task(task)


def score_run(ctx: RunContext) -> None:
    """Score every response of the run (warmup too) into scores.jsonl, after its measured window; the
    manifest gets how many and how long. Any scoring error fails the run (RunFailed), naming the request."""
    scorer = ctx.campaign.workload.scorer
    writer = RecordWriter(ctx.campaign.run_dir(ctx.planned.run_id) / "scores.jsonl")
    start = time.monotonic()
    try:
        for resp in sorted(ctx.responses, key=lambda r: r.request_index):
            try:
                line = make_score(resp.request_index, resp.spec, resp.text, resp.errored, scorer)
            except Exception as exc:  # any failure of the scorer is the run's failure, loudly
                raise RunFailed(f"scoring request_index {resp.request_index} (item {resp.spec.item.item_id}) with "
                                f"{scorer.label} failed: {type(exc).__name__}: {exc}") from exc
            writer.append(line)
    finally:
        writer.close()
        ctx.manifest.scoring = {"scored": writer.count, "seconds": round(time.monotonic() - start, 3)}


@dataclass
class SlotGate:
    """Scoring runs in the event loop's thread (math-verify's timeout needs the main thread), so it would
    stall any run still measuring: with parallel placement the runs of a slot score only once every one
    of them has stopped its server. Sequential runs get a gate of their own."""

    pending: set[str]
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def arrive(self, run_id: str) -> None:
        self.pending.discard(run_id)
        if not self.pending:
            self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


END_HEALTH_TIMEOUT_S = 10.0


def check_failed_requests(ctx: RunContext) -> None:
    """The run's failure policy, part 1: RunFailed when more requests errored, timed out or were aborted
    than experiment.max_failed_requests allows (default 0)."""
    allowed = ctx.campaign.cfg.experiment.max_failed_requests
    ctx.manifest.failed_requests = len(ctx.failures)
    if len(ctx.failures) > allowed:
        raise RunFailed(f"{len(ctx.failures)} request(s) errored, timed out or were aborted (allowed: "
                        f"experiment.max_failed_requests={allowed}); first: {ctx.failures[0]}")


async def check_server_health(ctx: RunContext, server: Server) -> None:
    """The run's failure policy, part 2: RunFailed unless the server is alive and answers /health at the
    end (a dead or hung server, SIGSTOP or deadlock, fails the run even when every request came back)."""
    if not server.alive():
        raise RunFailed(f"the server exited (code {server.started().returncode}) during the run; "
                        f"see {ctx.spec.log_path}")
    if not await responds(ctx.spec.base_url, "/health", END_HEALTH_TIMEOUT_S):
        raise RunFailed(f"the server did not answer /health within {END_HEALTH_TIMEOUT_S:.0f} s at the end of the "
                        f"run (hung or dying); see {ctx.spec.log_path}")


async def responds(base_url: str, path: str, timeout_s: float) -> bool:
    """Whether GET `path` answers 200 within `timeout_s`."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(base_url + path) as resp:
                return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def run_one(c: Campaign, run: PlannedRun, progress: Progress, gate: SlotGate | None = None) -> str:
    """One run from a fresh server to its manifest and scores. Returns its final status."""
    gate = gate or SlotGate({run.run_id})
    try:
        return await measure_and_score(c, run, progress, gate)
    finally:
        gate.arrive(run.run_id)


async def measure_and_score(c: Campaign, run: PlannedRun, progress: Progress, gate: SlotGate) -> str:
    if c.run_status(run.run_id) == "finished":
        c.console.print(f"[dim]{run.run_id}: finished earlier, kept[/]")
        return "finished"
    if (moved := c.set_aside(run.run_id)) is not None:
        c.console.print(f"[yellow]{run.run_id}: an unfinished earlier attempt was set aside in {moved}[/]")
    port = c.cfg.server.port or free_port(c.cfg.server.host)
    spec = build_spec(c.cfg.server, c.cfg.experiment.arm(run.arm), port=port, base_seed=run.base_seed,
                      gpu=run.gpu, log_path=c.run_dir(run.run_id) / "server.log")
    ctx = RunContext(c, run, spec, start_manifest(c, run, spec), progress)
    ctx.save()
    checks: dict[str, Any] = {}
    try:
        ctx.manifest.machine["before"] = await machine.sample(c.cfg.load_sample_s)
        async with Server(spec) as server:
            await server.wait_ready()
            checks["after_ready"] = check_log(spec.log_path, spec.log_checks)
            if not checks["after_ready"]["passed"]:
                raise RunFailed(f"log check after readiness failed: {describe_failed_checks(checks['after_ready'])}")
            await drive_run(ctx)
            ctx.manifest.machine["after"] = await machine.sample(c.cfg.load_sample_s)
            check_failed_requests(ctx)
            ctx.manifest.server_info_end = await get_json(spec.base_url, "/server_info", END_HEALTH_TIMEOUT_S)
            checks["at_end"] = check_log(spec.log_path, spec.log_checks)
            await check_server_health(ctx, server)
            if not checks["at_end"]["passed"]:
                raise RunFailed(f"log check at the end failed: {describe_failed_checks(checks['at_end'])}")
        gate.arrive(run.run_id)
        await gate.wait()
        score_run(ctx)
        ctx.manifest.status = "finished"
    except (ServerError, RunFailed, OSError, aiohttp.ClientError) as exc:  # the run fails, the campaign goes on
        ctx.manifest.status, ctx.manifest.error = "failed", str(exc)
        c.console.print(f"[bold red]{run.run_id} failed:[/] {exc}")
    except BaseException as exc:  # Ctrl-C, cancellation, a crash: record it, the server is already stopped
        ctx.manifest.status, ctx.manifest.error = "failed", f"interrupted: {type(exc).__name__}: {exc}"
        raise
    finally:
        checks["passed"] = all(v["passed"] for v in checks.values() if isinstance(v, dict)) if checks else False
        ctx.manifest.log_checks = checks
        ctx.manifest.t_end_unix = time.time()
        ctx.save()
        c.log_order(run.run_id, ctx.manifest.status, ctx.manifest.t_start_unix, ctx.manifest.t_end_unix)
    return ctx.manifest.status


async def run_campaign(c: Campaign) -> dict[str, str]:
    """Every slot in order; the runs of a slot together when placement is parallel."""
    statuses: dict[str, str] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=c.console) as progress:
        overall = progress.add_task("runs", total=len(c.todo))
        for slot in slots(c.todo):
            if c.cfg.experiment.placement == "parallel":
                gate = SlotGate({r.run_id for r in slot})
                results = await asyncio.gather(*(run_one(c, r, progress, gate) for r in slot))
            else:
                results = [await run_one(c, r, progress) for r in slot]
            for run, status in zip(slot, results, strict=True):
                statuses[run.run_id] = status
                progress.advance(overall)
    return statuses


def new_campaign_id(cfg: BenchConfig) -> str:
    """Time, concurrency and a random suffix: jobs started in the same second (a sweep, a cluster array)
    never share a campaign folder."""
    return datetime.now().strftime("%Y%m%d-%H%M%S") + f"-c{cfg.client.concurrency}-{secrets.token_hex(3)}"


def campaign_root(cfg: BenchConfig) -> Path:
    return Path(cfg.results_dir) / cfg.experiment.name / (cfg.campaign or new_campaign_id(cfg))


def check_shard(shard: int | None, plan: list[PlannedRun]) -> None:
    """ConfigError when `shard` names no slot of the plan."""
    count = len(slots(plan))
    if shard is not None and not 0 <= shard < count:
        raise ConfigError(f"shard={shard} does not exist: this campaign has {count} shard(s), shard=0 to "
                          f"shard={count - 1}, one per (base seed, repeat); e.g. -m shard='range(0,{count})'")


def build_campaign(cfg: BenchConfig, config_dict: dict, workload: Workload, console: Console) -> Campaign:
    """The campaign of a config; ConfigError (nothing launched) when a planned request seed is out of range
    or the shard does not exist."""
    check_request_seeds(cfg, workload)
    plan = make_plan(cfg.experiment)
    check_shard(cfg.shard, plan)
    return Campaign(cfg=cfg, config_dict=redact_config(config_dict), workload=workload, plan=plan,
                    root=campaign_root(cfg), console=console, pin=CpuPin(list(cfg.client.cpus)), shard=cfg.shard)


def summary(statuses: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

