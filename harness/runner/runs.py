"""Run a campaign: every planned run gets a fresh server, a warmup, a cache flush, the measured
requests, and a manifest. Finished runs of an existing campaign are kept; unfinished ones are set
aside (never mixed in) and run again from scratch.

Nothing but sending and recording happens inside the measured window: responses are scored once the
run's server is stopped (scores.jsonl), and the machine's load is sampled before and after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.backends import get as get_backend
from harness.backends.base import Backend
from harness.client.config import ClientConfig
from harness.client.drive import drive
from harness.client.requests import Outcome, RequestPlan
from harness.contract import (
    LogCheckReport,
    Manifest,
    PlannedRun,
    Scoring,
    ServerBinary,
    ServerCode,
    ServerCounters,
    SourceDoc,
    seal_file,
    to_json,
)
from harness.host import machine
from harness.runner.folder import Campaign
from harness.runner.manifest import start_manifest
from harness.runner.plan import planned_requests, slots
from harness.runner.records import RecordWriter, finish_reason, make_record, make_score
from harness.runner.sources import archive_files, snapshot_differences
from harness.runner.stopping import hold
from harness.runner.storage import StorageError, disk_error, save_json
from harness.server.control import flush_cache, get_json, responds
from harness.server.launch import Launch
from harness.server.logs import check_log, describe_failed_checks
from harness.server.process import Attached, Server, ServerError, free_port, server_for
from harness.server.provenance import ProvenanceError
from harness.server.redact import Secrets
from harness.validation import ConfigError


class RunFailed(RuntimeError):
    pass


@dataclass
class Response:
    """What scoring needs of one request, kept in memory until the measured window is over (the text
    too, whether or not the record stores it)."""

    request_index: int
    request: RequestPlan
    text: str
    errored: bool


@dataclass
class RunContext:
    campaign: Campaign
    planned: PlannedRun
    launch: Launch
    manifest: Manifest
    progress: Progress
    failures: list[str] = field(default_factory=list)  # "item: error" of each errored/aborted/timed-out request
    responses: list[Response] = field(default_factory=list)

    @property
    def backend(self) -> Backend:
        return get_backend(self.launch.backend)

    @property
    def secrets(self) -> Secrets:
        """What is masked in everything of this run that the campaign writes or prints."""
        return self.campaign.secrets + Secrets.of_server(self.launch.env_overrides, self.launch.argv)

    def save(self) -> None:
        """Write the manifest (atomically, secrets masked); a StorageError when it cannot be written."""
        save_json(
            self.campaign.run_dir(self.planned.run_id) / "manifest.json",
            self.secrets.scrub_json(to_json(self.manifest)),
        )

    def fail(self, error: str) -> str:
        """Mark the run failed with `error` (secrets masked); the masked message."""
        self.manifest.status, self.manifest.error = "failed", self.secrets.scrub(error)
        return self.manifest.error


def stream_mode(client: ClientConfig, incremental: bool) -> str:
    """How the client reads the stream: none | chat | incremental | cumulative (manifest client.stream_mode)."""
    if not client.stream:
        return "none"
    if client.route == "chat":
        return "chat"
    if client.route == "completions":
        return "incremental"
    return "incremental" if incremental else "cumulative"


async def read_server_facts(ctx: RunContext) -> None:
    """What the server says it runs, after readiness (the backend's routes), and what follows (seeds, stream mode)."""
    c, run, cfg = ctx.campaign, ctx.planned, ctx.campaign.cfg
    man = ctx.manifest
    try:
        await ctx.backend.read_facts(ctx.launch, man, cfg.experiment.seeded_requests)
    except ServerError as exc:
        raise RunFailed(str(exc)) from None
    man.client.stream_mode = stream_mode(cfg.client, ctx.backend.incremental(man.server_info))
    if not man.seeds_honoured:
        c.console.print(
            Panel(
                f"run {run.run_id}: per-request seeds are sent but the server does not run with "
                "--enable-deterministic-inference, so it ignores them; results are NOT reproducible "
                "(recorded as seeds_honoured: false)",
                title="WARNING: seeds not honoured",
                style="bold red",
            )
        )
    ctx.save()


async def drive_run(ctx: RunContext, server_pid: int | None) -> None:
    """Warm up, flush, send the measured requests, appending every record; the runner is pinned to
    client.cpus meanwhile, and the machine's CPU counters and the server's process tree's CPU times (process
    `server_pid`) are read at both ends of the measured window."""
    c, run, cfg = ctx.campaign, ctx.planned, ctx.campaign.cfg
    base, backend = ctx.launch.base_url, ctx.backend
    await read_server_facts(ctx)
    incremental = backend.incremental(ctx.manifest.server_info)
    ids = {
        "campaign_id": c.campaign_id,
        "run_id": run.run_id,
        "arm": run.arm,
        "base_seed": run.base_seed,
        "repeat": run.repeat,
    }
    warm, measured = planned_requests(cfg, c.workload, run.base_seed, cfg.experiment.arm(run.arm).seed_stream)
    index_of = {id(request): i for i, request in enumerate([*warm, *measured])}
    writer = RecordWriter(c.run_dir(run.run_id) / "records.jsonl")
    task = ctx.progress.add_task(f"{run.run_id}", total=None)
    model = (ctx.manifest.model_info or {}).get("model_path") or cfg.server.model_path

    secrets = ctx.secrets

    def on_done(request: RequestPlan, out: Outcome) -> None:
        index = index_of[id(request)]
        if out.error is not None:  # a server's error reply may quote what it was started with
            out.error = secrets.scrub(out.error)
        writer.append(make_record(ids, index, request, out, cfg.client.store_output_text, cfg.client.store_output_ids))
        ctx.responses.append(Response(index, request, out.text, out.error is not None))
        if out.error is not None or finish_reason(out) == "abort":
            ctx.failures.append(
                f"{'warmup ' if request.warmup else ''}item {request.item.item_id}: {out.error or 'aborted'}"
            )
        ctx.progress.advance(task)

    c.pin.acquire()
    try:
        if warm:
            ctx.progress.update(task, total=len(warm), completed=0, description=f"{run.run_id} warmup")
            await asyncio.gather(
                drive(
                    base,
                    warm,
                    sampling=cfg.sampling,
                    client=cfg.client,
                    model=model,
                    concurrency=len(warm),
                    arrival_seed=run.base_seed,
                    on_done=on_done,
                    incremental=incremental,
                    dialect=backend.dialect,
                ),
                hold("warmup"),
            )
        if cfg.experiment.warmup.flush_cache:
            await flush_cache(base)
        ctx.progress.update(task, total=len(measured), completed=0, description=f"{run.run_id}")
        before = await backend.read_counters(cfg.server, base)  # the server's own counters around the window
        start, tree = machine.read_counters(), machine.tree_times(server_pid)
        await asyncio.gather(
            drive(
                base,
                measured,
                sampling=cfg.sampling,
                client=cfg.client,
                model=model,
                concurrency=cfg.client.concurrency,
                arrival_seed=run.base_seed,
                on_done=on_done,
                incremental=incremental,
                dialect=backend.dialect,
            ),
            hold("measure"),
        )
        ctx.manifest.server_cpu = machine.server_cpu(tree, machine.tree_times(server_pid))
        ctx.manifest.machine.during = machine.during(start, machine.read_counters())
        if before is not None and (counters := backend.counter_map(cfg.server)) is not None:
            check_failed_requests(ctx)  # failed requests name the cause (a dead server), not its unread /metrics
            after = await backend.read_counters(cfg.server, base) or {}
            ctx.manifest.server_counters = ServerCounters(
                counters.path, before, after, counters.delta(before, after), dict(counters.names)
            )
    finally:
        c.pin.release()
        writer.close()
        ctx.manifest.records_seal = seal_file(writer.path)  # final: nothing appends to it after the window
        ctx.progress.remove_task(task)


async def score_run(ctx: RunContext) -> None:
    """Score every response of the run (warmup too) into scores.jsonl, after its measured window; the
    manifest gets how many and how long. Any scoring error fails the run (RunFailed), naming the request.
    The loop gets a turn between responses, so that a stop signal lands between two of them."""
    scorer = ctx.campaign.workload.scorer
    writer = RecordWriter(ctx.campaign.run_dir(ctx.planned.run_id) / "scores.jsonl")
    start = time.monotonic()
    try:
        for resp in sorted(ctx.responses, key=lambda r: r.request_index):
            try:
                line = make_score(resp.request_index, resp.request, resp.text, resp.errored, scorer)
            except Exception as exc:  # any failure of the scorer is the run's failure, loudly
                raise RunFailed(
                    f"scoring request_index {resp.request_index} (item {resp.request.item.item_id}) with "
                    f"{scorer.label} failed: {type(exc).__name__}: {exc}"
                ) from exc
            writer.append(line)
            if writer.count == 1:
                await hold("scoring")
            await asyncio.sleep(0)
    finally:
        writer.close()
        ctx.manifest.scores_seal = seal_file(writer.path)
        ctx.manifest.scoring = Scoring(scored=writer.count, seconds=round(time.monotonic() - start, 3))


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


def check_failed_requests(ctx: RunContext) -> None:
    """The run's failure policy, part 1: RunFailed when more requests errored, timed out or were aborted
    than experiment.max_failed_requests allows (default 0)."""
    allowed = ctx.campaign.cfg.experiment.max_failed_requests
    ctx.manifest.failed_requests = len(ctx.failures)
    if len(ctx.failures) > allowed:
        raise RunFailed(
            f"{len(ctx.failures)} request(s) errored, timed out or were aborted (allowed: "
            f"experiment.max_failed_requests={allowed}); first: {ctx.failures[0]}"
        )


async def check_server_health(ctx: RunContext, server: Server | Attached) -> None:
    """The run's failure policy, part 2: RunFailed unless the server is alive and answers /health at the
    end (a dead or hung server, SIGSTOP or deadlock, fails the run even when every request came back)."""
    if not server.alive():
        raise RunFailed(
            f"the server exited (code {server.started().returncode}) during the run; see {ctx.launch.log_path}"
        )
    if not await responds(ctx.launch.base_url, "/health", ctx.launch.health_timeout_s):
        raise RunFailed(
            f"the server did not answer /health within {ctx.launch.health_timeout_s:g} s "
            f"(server.health_timeout_s) at the end of the run (hung or dying); see {ctx.launch.log_path}"
        )


async def run_one(c: Campaign, run: PlannedRun, progress: Progress, gate: SlotGate | None = None) -> str:
    """One run from a fresh server to its manifest and scores. Returns its final status."""
    gate = gate or SlotGate({run.run_id})
    try:
        return await measure_and_score(c, run, progress, gate)
    finally:
        gate.arrive(run.run_id)


def check_snapshot_unchanged(source: SourceDoc | None, code: ServerCode | None) -> None:
    """RunFailed, before the server starts, when the snapshot an arm's source runs from no longer holds the
    files the campaign checked (someone edited it meanwhile): the run would run other code than its commit."""
    where = code.checkout if code is not None else None
    if source is None or source.content_sha256 is None or where is None or where.kind != "snapshot":
        return
    if where.content_sha256 != source.content_sha256:
        try:
            differ = "; ".join(snapshot_differences(Path(where.root), archive_files(Path(source.repo), source.commit)))
        except (ConfigError, OSError) as exc:
            differ = f"(which files, unknown: {exc})"
        raise RunFailed(
            f"the snapshot {where.root} no longer holds commit {source.commit} (its files changed after "
            f"the campaign checked them: {differ}); the server was not started. Remove the snapshot "
            "(rm -rf it: it is made again from the commit) and resume"
        )


async def measure_and_score(c: Campaign, run: PlannedRun, progress: Progress, gate: SlotGate) -> str:
    if c.run_status(run.run_id) == "finished":
        c.console.print(f"[dim]{run.run_id}: finished earlier, kept[/]")
        return "finished"
    if (moved := c.set_aside(run.run_id)) is not None:
        c.console.print(f"[yellow]{run.run_id}: an unfinished earlier attempt was set aside in {moved}[/]")
    port = c.cfg.server.port or free_port(c.cfg.server.host)  # the planned command, at its port
    launch = c.planned_launch(run.run_id).at(port, c.run_dir(run.run_id) / "server.log")
    ctx = RunContext(c, run, launch, start_manifest(c, run, launch), progress)
    checks = LogCheckReport()
    storage: StorageError | None = None
    try:
        ctx.save()
        code: ServerCode | None = None
        described = await asyncio.to_thread(ctx.backend.describe_code, launch)  # (a binary: read from the file)
        if isinstance(described, ServerBinary):
            ctx.manifest.server_binary = described
        else:
            code = ctx.manifest.server_code = described
        ctx.save()
        check_snapshot_unchanged(c.sources.get(run.arm), code)
        ctx.manifest.machine.before = await machine.sample(c.cfg.load_sample_s)
        async with server_for(launch) as server:
            await hold("startup")
            await server.wait_ready()
            checks.after_ready = check_log(launch.log_path, launch.log_checks)
            if not checks.after_ready.passed:
                raise RunFailed(f"log check after readiness failed: {describe_failed_checks(checks.after_ready)}")
            await drive_run(ctx, server.pid())
            ctx.manifest.machine.after = await machine.sample(c.cfg.load_sample_s)
            check_failed_requests(ctx)
            ctx.manifest.server_info_end = await get_json(launch.base_url, launch.info_path, launch.health_timeout_s)
            checks.at_end = check_log(launch.log_path, launch.log_checks)
            await check_server_health(ctx, server)
            if not checks.at_end.passed:
                raise RunFailed(f"log check at the end failed: {describe_failed_checks(checks.at_end)}")
        gate.arrive(run.run_id)
        await gate.wait()
        await score_run(ctx)
        ctx.manifest.status = "finished"
    except StorageError as exc:  # the disk: every later run would fail the same way, the campaign stops
        storage = exc
        c.console.print(f"[bold red]{run.run_id} failed:[/] {ctx.fail(str(exc))}", soft_wrap=True)
    except (
        ServerError,
        RunFailed,
        ProvenanceError,
        OSError,
        aiohttp.ClientError,
    ) as exc:  # the run fails, the campaign goes on
        storage = disk_error(exc, c.run_dir(run.run_id))  # (unless the disk is full or read-only: then it stops)
        c.console.print(f"[bold red]{run.run_id} failed:[/] {ctx.fail(str(storage or exc))}", soft_wrap=True)
    except asyncio.CancelledError:  # a stop signal (harness.runner.stopping): the server is already stopped
        ctx.fail(c.stops.reason if c.stops else "interrupted (cancelled)")
        raise
    except BaseException as exc:  # a crash: record it, the server is already stopped
        ctx.fail(f"interrupted: {type(exc).__name__}: {exc}")
        raise
    finally:
        ran = [r for r in (checks.after_ready, checks.at_end) if r is not None]
        checks.passed = bool(ran) and all(r.passed for r in ran)
        ctx.manifest.log_checks = checks
        ctx.manifest.t_end_unix = time.time()
        unwritten = record_end(ctx)  # (always called: it writes what the disk still takes)
        storage = storage or unwritten
    if storage is not None:
        raise storage
    return ctx.manifest.status


def record_end(ctx: RunContext) -> StorageError | None:
    """The run's final manifest and its line in campaign.json's order_run, as far as the disk allows: what
    cannot be written is printed (one line naming the file) and returned, never raised over the run's own
    outcome. A manifest left at `running` makes a resume redo the run."""
    c, man = ctx.campaign, ctx.manifest
    end = man.t_end_unix if man.t_end_unix is not None else time.time()
    failed: StorageError | None = None
    for write in (ctx.save, lambda: c.log_order(ctx.planned.run_id, man.status, man.t_start_unix, end)):
        try:
            write()
        except StorageError as exc:
            c.console.print(f"[bold red]{ctx.planned.run_id}:[/] {exc}", soft_wrap=True)
            failed = failed or exc
    return failed


async def run_campaign(c: Campaign) -> dict[str, str]:
    """Every slot in order; the runs of a slot together when placement is parallel."""
    statuses: dict[str, str] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=c.console) as progress:
        overall = progress.add_task("runs", total=len(c.todo))
        for slot in slots(c.todo):
            if c.cfg.experiment.placement == "parallel":
                gate = SlotGate({r.run_id for r in slot})
                results = await together([run_one(c, r, progress, gate) for r in slot])
            else:
                results = [await run_one(c, r, progress) for r in slot]
            for run, status in zip(slot, results, strict=True):
                statuses[run.run_id] = status
                progress.advance(overall)
    return statuses


async def together(coros: list[Coroutine[Any, Any, str]]) -> list[str]:
    """The runs of a slot side by side; when one raises (a StorageError stops the campaign) the others are
    cancelled (each marks itself failed and stops its server) before the error goes on."""
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def summary(statuses: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
