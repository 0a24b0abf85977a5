"""Typed config of the experiment group (`configs/experiment/`) and of the whole `python -m harness.bench`
command (BenchConfig: experiment, server, workload, sampling, client and the campaign's own keys),
registered in Hydra's ConfigStore as `bench_schema`.

YAML files under `configs/` sit on top of these schemas: a key that is not declared here, or a value of the
wrong type, fails at composition with the key's full name. `__post_init__` and `validate()` check values that
types cannot (choices, ranges) with a message that names the bad value and the valid ones. The entry point
converts the composed DictConfig into these objects once (`OmegaConf.to_object`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from omegaconf import MISSING

from harness import contract
from harness.backends import get as get_backend
from harness.client.config import ClientConfig, SamplingConfig
from harness.client.requests import RequestPlan
from harness.contract import parse_gate_rule
from harness.server.config import ArmConfig, ServerConfig
from harness.validation import ConfigError, check_choice, check_name, check_range
from workloads.base import Item
from workloads.config import WorkloadConfig

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # a request seed is a 64-bit integer (SGLang's sampling_seed)
EXPECTATIONS = ("identical_outputs",)  # experiment.expect


def request_seed(base_seed: int, seed_offset: int, seed_stream: int) -> int:
    """The planned `sampling_seed` of one request; ConfigError when it does not fit 64 bits."""
    seed: int = contract.request_seed(base_seed, seed_offset, seed_stream)
    if not INT64_MIN <= seed <= INT64_MAX:
        raise ConfigError(
            f"request seed {base_seed} + {seed_offset} + {seed_stream} * 2**32 = {seed} does not fit "
            "a 64-bit integer; use smaller experiment.base_seeds or arms[].seed_stream"
        )
    return seed


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
    # an intended A/A: arms that launch alike (seed streams aside); titled A/A everywhere. Without it, arms that
    # resolve to one launch are refused (harness.runner.difference)
    aa: bool = False
    # what the outputs must show: identical_outputs = every paired request's completion text and token ids equal
    # across the arms (a builder or kernel change under deterministic inference), else the audit fails
    expect: str | None = None
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
    # the audit's "Each arm ran the code it names": the distributions that may differ between the arms'
    # interpreters (e.g. [sglang] for two installs of SGLang), and whether a run from a dirty checkout is declared
    packages_may_differ: list[str] = field(default_factory=list)
    dirty_declared: bool = False
    # the regression gate applied to the campaign's report (docs/gate.md): rules such as 'acceptance_length < -1%',
    # 'throughput < -3%', 'cpu_per_token > +3%'; the command exits 3 when one fails, 4 when one is inconclusive
    gate: list[str] = field(default_factory=list)

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
        if self.expect is not None:
            check_choice("experiment.expect", self.expect, EXPECTATIONS)
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
        if len(set(self.base_seeds)) != len(self.base_seeds):
            twice = sorted({s for s in self.base_seeds if self.base_seeds.count(s) > 1})
            raise ConfigError(
                f"experiment.base_seeds={self.base_seeds} names {twice} more than once: runs of one "
                "seed would be paired as one; repeat a seed with experiment.repeats"
            )
        if self.repeats < 1:
            raise ConfigError(f"experiment.repeats={self.repeats} must be >= 1")
        for arm in self.arms:
            for base_seed in self.base_seeds:
                request_seed(base_seed, 0, arm.seed_stream)
        for i, rule in enumerate(self.gate):
            try:
                parse_gate_rule(rule)
            except ValueError as err:
                raise ConfigError(f"experiment.gate[{i}]: {err}") from None
        if self.placement == "parallel" and len(self.gpus) < len(self.arms):
            raise ConfigError(
                f"experiment.placement=parallel needs one GPU per arm: {len(self.arms)} arms but "
                f"experiment.gpus={self.gpus}"
            )


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
    # where arms' source snapshots are kept, one folder per commit; None: $XDG_CACHE_HOME (~/.cache)/specbench/sources
    source_cache: str | None = None

    def validate(self) -> BenchConfig:
        self.experiment.validate()
        check_range("load_sample_s", self.load_sample_s, 0.01, 60)
        if self.campaign is not None:
            check_name("campaign", self.campaign)
        if self.shard is not None and self.shard < 0:
            raise ConfigError(f"shard={self.shard} must be >= 0 (a slot of the plan; leave it out to run every slot)")
        check_backend_client(self)
        check_extra_body(self)
        shared = sorted(set(self.server.cpus) & set(self.client.cpus))
        if shared:
            raise ConfigError(
                f"server.cpus={self.server.cpus} and client.cpus={self.client.cpus} share CPU(s) "
                f"{shared}; give the server and the client separate CPUs (or [] for no pinning)"
            )
        return self


def check_backend_client(cfg: BenchConfig) -> None:
    """The backend exists (ConfigError listing the valid names), and serves the client's route and settings, for
    each arm's server (an arm's own url in place of server.url)."""
    backend = get_backend(cfg.server.backend)
    flush = cfg.experiment.warmup.flush_cache
    own = [arm for arm in cfg.experiment.arms if arm.url]
    if not own or len(own) < len(cfg.experiment.arms):
        backend.check_config(cfg.server, cfg.client, flush)
    for arm in own:
        try:
            backend.check_config(replace(cfg.server, url=arm.url), cfg.client, flush)
        except ConfigError as exc:
            raise ConfigError(f"experiment.arms[{arm.name}].url={arm.url} (its server.url): {exc}") from None
    check_attached(cfg)


def check_extra_body(cfg: BenchConfig) -> None:
    """ConfigError when client.extra_body sets a field the harness writes itself (the prompt, the sampling, the
    per-request seed, the token cap, ...): the records would no longer say what was sent."""
    if not cfg.client.extra_body:
        return
    probe = RequestPlan(Item("0", 0, "", [{"role": "user", "content": ""}], None, None), 0, False, 1)
    dialect = get_backend(cfg.server.backend).dialect
    body = dialect.payload(cfg.client.route, cfg.sampling, cfg.client, probe, cfg.server.model_path)
    taken = sorted(set(cfg.client.extra_body) & set(body))
    if taken:
        raise ConfigError(
            f"client.extra_body sets {', '.join(taken)}: the harness writes {'it' if len(taken) == 1 else 'them'} "
            f"in every {cfg.client.route} request to backend {cfg.server.backend} (from sampling.*, the workload, "
            "the request seeds); set them there, and keep client.extra_body for fields the harness does not send"
        )


def check_attached(cfg: BenchConfig) -> None:
    """ConfigError when an arm's server is one already running (its url, or server.url) and the campaign would give
    it what only a launch gives: arguments, environment, interpreter, code, CPUs. None of it reaches a server the
    campaign does not start, and arms that differ only there would measure one server under two names."""
    server = cfg.server
    common = given(
        "server",
        args=list(server.args),
        env=dict(server.env),
        python=server.python,
        seed_arg=server.seed_arg,
        cpus=list(server.cpus),
    )
    for i, arm in enumerate(cfg.experiment.arms):
        if not (arm.url or server.url):
            continue
        own = given(f"experiment.arms.{i}", args=list(arm.args), env=dict(arm.env), python=arm.python)
        own += given(f"experiment.arms.{i}.source", ref=arm.source.ref)
        if common or own:
            raise ConfigError(
                f"arm {arm.name}'s server is already running at {arm.url or server.url}: the campaign does not "
                f"launch it, so {', '.join(common + own)} would not reach it (arms that differ only there would "
                "measure one server twice). Remove them (e.g. server.args=[]); compare servers already running by "
                "giving each arm its own experiment.arms.N.url, or let each run start its server with "
                "server.command=[...]"
            )


def given(prefix: str, **values: object) -> list[str]:
    """`prefix.key=value` for each value that is set (not empty, not None)."""
    return [f"{prefix}.{key}={value!r}" for key, value in values.items() if value]


def register_configs() -> None:
    """Register BenchConfig as `bench_schema`, which configs/bench.yaml lists first in its defaults."""
    from hydra.core.config_store import ConfigStore  # noqa: PLC0415  (the command's, not the schema's)

    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)
