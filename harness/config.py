"""Typed Hydra schemas of the harness, registered in Hydra's ConfigStore.

YAML files under `configs/` (shipped as package data) sit on top of these schemas: a key that is not declared here, or a value
of the wrong type, fails at composition with the key's full name. `__post_init__` checks values that
types cannot (choices, ranges) with a message that names the bad value and the valid ones.
Entry points convert the composed DictConfig into these objects once (`OmegaConf.to_object`).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from workloads.config import WorkloadConfig


def config_dir() -> Path:
    """The Hydra configs: inside the installed package (a wheel ships the top-level configs/ as
    harness/configs), else the checkout's top-level configs/ (a plain checkout, an editable install)."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIG_DIR = config_dir()

HYDRA_VERSION_BASE = "1.3"


class ConfigError(ValueError):
    """A configuration value is wrong; the message names it and says how to fix it."""


def check_choice(what: str, value: Any, choices: list | tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{what}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def check_range(what: str, value: float, low: float, high: float = math.inf, *, low_open: bool = False,
                high_open: bool = False) -> None:
    """ConfigError unless `value` is a finite number in the interval (NaN and infinities never are)."""
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if not math.isfinite(value) or too_low or too_high:
        interval = ("(" if low_open else "[") + f"{low:g}, {high:g}" + (")" if high_open or high == math.inf else "]")
        raise ConfigError(f"{what}={value!r} must be a finite number in {interval}")


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(what: str, value: str) -> None:
    """Names that become directories under results_dir: no separators, no '..', nothing hidden."""
    if not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(f"{what}={value!r} is not a safe directory name: use letters, digits, '.', '_' and '-', "
                          "starting with a letter or digit, without '..' (it names a folder under results_dir)")


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (every CPU where sched_getaffinity is missing)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def check_cpus(what: str, cpus: list[int]) -> None:
    """ConfigError unless every CPU of a pinning list exists for this process, once each."""
    allowed = allowed_cpus()
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise ConfigError(f"{what}={list(cpus)} names CPU(s) {bad} that this process may not run on (allowed: "
                          f"{', '.join(map(str, sorted(allowed)))}); pick from those, or [] for no pinning")
    if len(set(cpus)) != len(cpus):
        raise ConfigError(f"{what}={list(cpus)} lists a CPU twice; list each CPU once")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # a request seed is a 64-bit integer (SGLang's sampling_seed)
SEED_STREAM_STRIDE = 2**32  # request seed = base seed + seed offset + seed_stream * SEED_STREAM_STRIDE


def request_seed(base_seed: int, seed_offset: int, seed_stream: int) -> int:
    """The planned `sampling_seed` of one request; ConfigError when it does not fit 64 bits."""
    seed = base_seed + seed_offset + seed_stream * SEED_STREAM_STRIDE
    if not INT64_MIN <= seed <= INT64_MAX:
        raise ConfigError(f"request seed {base_seed} + {seed_offset} + {seed_stream} * 2**32 = {seed} does not fit "
                          "a 64-bit integer; use smaller experiment.base_seeds or arms[].seed_stream")
    return seed


@dataclass
class LogChecks:
    """Regexes searched in the server log after readiness and again at the end of the run."""

    must: list[str] = field(default_factory=list)
    must_not: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kind, patterns in (("must", self.must), ("must_not", self.must_not)):
            for pattern in patterns:
                try:
                    re.compile(pattern, re.MULTILINE)
                except re.error as exc:
                    raise ConfigError(f"log_checks.{kind} regex {pattern!r} is invalid ({exc}); fix it in the "
                                      "experiment file or on the command line") from None


@dataclass
class ServerConfig:
    """A server backend and the flags every arm shares."""

    backend: str = "embedded"  # embedded | sglang
    python: str | None = None  # interpreter; None = the one running the harness
    module: str = "harness.engine"  # run as `python -m MODULE`
    model_path: str = MISSING
    draft_model_path: str | None = None  # passed as --speculative-draft-model-path when set
    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port per run
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    seed_arg: str | None = "--random-seed"  # passed the run's base seed; null to pass none
    ready_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    log_checks: LogChecks = field(default_factory=LogChecks)
    # backend sglang: check every planned argv with the server interpreter's own SGLang before a dry run
    # says "ok" and before a real run launches anything. require = a refused argv, or one that could not
    # be checked (no SGLang in that interpreter), fails the command; skip = do not check (said so).
    preflight: str = "require"
    cpus: list[int] = field(default_factory=list)  # pin the server (and its children) to these CPUs; [] = no pinning

    def __post_init__(self) -> None:
        check_choice("server.backend", self.backend, ("embedded", "sglang"))
        check_cpus("server.cpus", self.cpus)
        check_choice("server.preflight", self.preflight, ("require", "skip"))
        if not 0 <= self.port < 65536:
            raise ConfigError(f"server.port={self.port} is out of range; use 0 for a free port or 1-65535")
        check_range("server.ready_timeout_s", self.ready_timeout_s, 0, low_open=True)
        check_range("server.stop_timeout_s", self.stop_timeout_s, 0, low_open=True)


@dataclass
class ArmConfig:
    """One server arm: a name and what differs from the common server config."""

    name: str = MISSING
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # a different interpreter / install (before vs after builds)
    log_checks: LogChecks = field(default_factory=LogChecks)
    # request seed = base seed + seed offset + seed_stream * 2**32: arms with different streams draw
    # different seeds (an A/A run that measures sampling noise); 0 = the plain base seed + offset
    seed_stream: int = 0

    def __post_init__(self) -> None:
        if self.seed_stream < 0:
            raise ConfigError(f"experiment.arms[{self.name}].seed_stream={self.seed_stream} must be >= 0 "
                              "(0 = the base seeds as they are)")


MAX_TOP_K = 2**31 - 1  # a 32-bit int, as SGLang's sampling tensors hold it; -1 means the whole vocabulary


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 256
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_range("sampling.temperature", self.temperature, 0)  # 0 = greedy
        check_range("sampling.top_p", self.top_p, 0, 1, low_open=True)
        check_range("sampling.min_p", self.min_p, 0, 1)
        if self.top_k == 0 or self.top_k < -1 or self.top_k > MAX_TOP_K:
            raise ConfigError(f"sampling.top_k={self.top_k} must be -1 (whole vocabulary) or in [1, {MAX_TOP_K}]")
        if self.max_new_tokens < 1:
            raise ConfigError(f"sampling.max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclass
class ClientConfig:
    route: str = "generate"  # generate (native, streaming) | chat (OpenAI chat completions)
    stream: bool = True
    concurrency: int = 8
    request_rate: float | None = None  # requests/s, Poisson arrivals; None = closed loop
    timeout_s: float = 7200.0
    store_output_text: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    cpus: list[int] = field(default_factory=list)  # pin the runner to these CPUs while it drives; [] = no pinning

    def __post_init__(self) -> None:
        check_choice("client.route", self.route, ("generate", "chat"))
        check_cpus("client.cpus", self.cpus)
        if self.concurrency < 1:
            raise ConfigError(f"client.concurrency={self.concurrency} must be >= 1")
        if self.request_rate is not None:
            check_range("client.request_rate (requests/s; null for closed loop)", self.request_rate, 0, low_open=True)
        check_range("client.timeout_s", self.timeout_s, 0, low_open=True)


@dataclass
class WarmupConfig:
    requests: int = 8  # N requests filling N slots before the measured window
    max_new_tokens: int = 16
    flush_cache: bool = True

    def __post_init__(self) -> None:
        if self.requests < 0:
            raise ConfigError(f"experiment.warmup.requests={self.requests} must be >= 0 (0 = no warmup)")
        if self.max_new_tokens < 1:
            raise ConfigError(f"experiment.warmup.max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclass
class ExperimentConfig:
    name: str = MISSING
    description: str = ""
    declared_difference: str = ""  # the one thing the arms differ in, in words
    arms: list[ArmConfig] = field(default_factory=list)
    baseline: str = MISSING
    base_seeds: list[int] = field(default_factory=lambda: [980406, 981406, 982406])
    repeats: int = 1
    seeded_requests: bool = True  # request seed = base seed + the item's numeric id + seed_stream * 2**32
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    order: str = "alternate"  # alternate (seed 1: A,B; seed 2: B,A; ...) | fixed
    placement: str = "sequential"  # sequential | parallel (one GPU per arm)
    gpus: list[int] = field(default_factory=lambda: [0, 1])
    # a run with more errored, aborted or timed-out requests (warmup included) than this is failed
    max_failed_requests: int = 0

    def arm(self, name: str) -> ArmConfig:
        """The arm called `name` (the plan only holds declared names)."""
        return next(a for a in self.arms if a.name == name)

    def validate(self) -> None:
        """Checked once composed (not in __post_init__: the schema's own empty default has no arms)."""
        check_name("experiment.name", self.name)
        if self.max_failed_requests < 0:
            raise ConfigError(f"experiment.max_failed_requests={self.max_failed_requests} must be >= 0")
        check_choice("experiment.order", self.order, ("alternate", "fixed"))
        check_choice("experiment.placement", self.placement, ("sequential", "parallel"))
        names = [a.name for a in self.arms]
        for i, name in enumerate(names):
            check_name(f"experiment.arms[{i}].name", name)
        if len(names) < 2:
            raise ConfigError(f"experiment.arms has {len(names)} arm(s); an experiment needs two or more")
        if len(set(names)) != len(names):
            raise ConfigError(f"experiment.arms names must be unique, got {names}")
        check_choice("experiment.baseline", self.baseline, names)
        if not self.base_seeds:
            raise ConfigError("experiment.base_seeds is empty; give at least one seed")
        if self.repeats < 1:
            raise ConfigError(f"experiment.repeats={self.repeats} must be >= 1")
        for arm in self.arms:
            for base_seed in self.base_seeds:
                request_seed(base_seed, 0, arm.seed_stream)
        if self.placement == "parallel" and len(self.gpus) < len(self.arms):
            raise ConfigError(
                f"experiment.placement=parallel needs one GPU per arm: {len(self.arms)} arms but "
                f"experiment.gpus={self.gpus}"
            )


# top-level keys of BenchConfig that do not change what is measured (a campaign resumes across them)
UNMEASURED_KEYS = ("campaign", "shard", "dry_run", "report", "strict_audit", "load_sample_s")


@dataclass
class BenchConfig:
    """Top level of `python -m harness.bench`."""

    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    results_dir: str = "results"
    campaign: str | None = None  # None = a new timestamped campaign; an existing id resumes it
    # run one slot (base seed x repeat: both arms, in their order) of the plan; None = every slot.
    # Shards of one campaign may run side by side (a Hydra multirun, SLURM jobs) into one folder.
    shard: int | None = None
    dry_run: bool = False
    report: bool = True  # write the analysis report at the end
    strict_audit: bool = True  # exit 1 when the report's audit fails; false: the report still says so, exit 0
    load_sample_s: float = 1.0  # length of the machine-load samples taken before and after each run

    def validate(self) -> BenchConfig:
        self.experiment.validate()
        check_range("load_sample_s", self.load_sample_s, 0.01, 60)
        if self.campaign is not None:
            check_name("campaign", self.campaign)
        if self.shard is not None and self.shard < 0:
            raise ConfigError(f"shard={self.shard} must be >= 0 (a slot of the plan; leave it out to run every slot)")
        shared = sorted(set(self.server.cpus) & set(self.client.cpus))
        if shared:
            raise ConfigError(f"server.cpus={self.server.cpus} and client.cpus={self.client.cpus} share CPU(s) "
                              f"{shared}; give the server and the client separate CPUs (or [] for no pinning)")
        return self


@dataclass
class MicroConfig:
    """The verify-probability builder microbenchmark (`python -m harness.micro`).

    Implementation names are checked against the registry in `harness.micro.impls` at start-up.
    """

    name: str = "cpu_small"
    vocab: int = 32000
    rows: list[int] = field(default_factory=lambda: [16, 64, 256])
    top_k: int = 20
    top_p: float = 0.95
    temperature: float = 1.0
    dtype: str = "float32"  # float32 | bfloat16 | float16
    impls: list[str] = field(default_factory=lambda: ["full_vocab", "topk_first", "topk_first_torch", "sglang"])
    baseline: str = "full_vocab"  # "before": every output is compared with this one
    after: str = "topk_first"  # "after" in the report's before/after table
    padding_fraction: float = 0.0  # fraction of rows whose logits are all equal (the all-ties case)
    device: str = "auto"  # auto | cpu | cuda
    warmup: int = 3
    repeats: int = 20
    min_rotate_bytes: int = 256 * 2**20  # rotate input copies until they exceed this (beats the cache)
    seed: int = 0
    out_dir: str | None = None  # write exactly here (e.g. results/published/...) instead of a timestamped dir

    def __post_init__(self) -> None:
        check_choice("micro.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        check_choice("micro.device", self.device, ("auto", "cpu", "cuda"))
        if not 0 <= self.padding_fraction <= 1:
            raise ConfigError(f"micro.padding_fraction={self.padding_fraction} must be in [0, 1]")
        if self.vocab < 2 or not self.rows or any(r < 1 for r in self.rows):
            raise ConfigError(f"micro.vocab={self.vocab} and micro.rows={self.rows} must be positive (rows non-empty)")
        if self.repeats < 1 or self.warmup < 0:
            raise ConfigError(f"micro.repeats={self.repeats} must be >= 1 and micro.warmup={self.warmup} >= 0")
        if not self.impls:
            raise ConfigError("micro.impls is empty; name at least one implementation")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"micro.temperature={self.temperature} must be >= 0 and micro.top_p={self.top_p} in (0, 1]")


@dataclass
class MicroAppConfig:
    micro: MicroConfig = field(default_factory=MicroConfig)
    results_dir: str = "results"


def register_configs() -> None:
    """Register the schemas; the primary YAML files list them first in their defaults."""
    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(name="microbench_schema", node=MicroAppConfig)
