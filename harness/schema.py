"""The files a campaign leaves behind (docs/records.md), as typed dataclasses: the runner writes these
objects, and the analysis derives what it parses and checks from the same declarations (the pyarrow
schema of records.jsonl, the JSON types of manifest.json and campaign.json). A field renamed or retyped
here changes both sides at once.

Times named `t_*` are `time.monotonic()` seconds of the runner's process; `wall_anchor` maps them to
Unix time.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 2  # what the runner writes
SCHEMA_VERSIONS = (1, 2)  # what the analysis reads


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
    finish_reason: str  # stop | length | abort | error
    hit_cap: bool
    t_scheduled: float | None  # open loop: the scheduled arrival; closed loop: = t_sent
    t_sent: float | None
    t_first_token: float | None
    t_end: float | None
    n_chunks: int
    chunk_us: list[int]  # arrival of each output-carrying chunk, microseconds after t_sent
    chunk_tokens: list[int] | None  # output tokens of each such chunk; None where the route does not say
    error: str | None
    output_text: str | None  # None unless client.store_output_text
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
    versions: dict[str, Any]  # harness {version, git_sha, dirty}, python, torch, sglang, ...
    gpu_info: dict[str, Any] | None  # nvidia-smi: name, driver_version, count, gpus
    host: dict[str, Any]  # hostname, platform, cpu, cores, memory_gib
    dataset: dict[str, Any]  # id, revision, sha256
    model_path: str
    wall_anchor: dict[str, float]  # {"monotonic", "unix"} read together
    t_start_unix: float
    concurrency: int
    request_rate: float | None
    max_new_tokens: int
    client: dict[str, Any]  # stream_mode, arrival (open | closed), cpus
    server_cpus: list[int] | None
    scorer: dict[str, Any]  # name, version
    status: str = "running"  # running | finished | failed
    error: str | None = None
    server_info: dict[str, Any] | None = None  # /server_info after readiness
    server_info_end: dict[str, Any] | None = None  # /server_info after the last request
    model_info: dict[str, Any] | None = None
    seeds_honoured: bool | None = None
    log_checks: dict[str, Any] | None = None  # after_ready, at_end, passed
    machine: dict[str, Any] = field(default_factory=lambda: {"before": None, "after": None, "during": None})
    scoring: dict[str, Any] | None = None  # scored, seconds
    failed_requests: int | None = None
    t_end_unix: float | None = None


@dataclass(frozen=True)
class CampaignDoc:
    """campaign.json: the campaign as planned (written once) and `order_run` (appended by every run)."""

    schema_version: int
    campaign_id: str
    experiment: str
    created: str  # ISO-8601 UTC
    config: dict[str, Any]  # the whole resolved config, redacted
    arms: list[dict[str, Any]]  # name, args, env, python, seed_stream
    baseline: str
    declared_difference: str
    concurrency: int
    request_rate: float | None
    max_new_tokens: int
    workload: dict[str, Any]  # name, dataset_id, revision, sha256, skipped_placeholders, items
    plan: list[dict[str, Any]]  # harness.campaign.plan.PlannedRun each
    order_run: list[dict[str, Any]] = field(default_factory=list)  # run_id, status, t_start_unix, t_end_unix, host


def to_json(obj: Any) -> dict[str, Any]:
    """A schema object as the JSON object it is written as (field order kept)."""
    return dataclasses.asdict(obj)


def base_type(tp: Any) -> Any:
    """`X | None` -> X; `list[int]` -> list; `dict[...]` -> dict."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return typing.get_origin(tp) or tp


def json_types(cls: type) -> dict[str, tuple[type, ...]]:
    """For each field of a schema class, the JSON value types it may hold (None is always allowed; a JSON
    number may be written as an int where a float is declared)."""
    kinds = {float: (int, float), int: (int,), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}
    return {name: kinds.get(base_type(tp), (object,)) for name, tp in typing.get_type_hints(cls).items()}
