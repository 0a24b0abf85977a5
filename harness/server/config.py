"""Typed config of the server group (`configs/server/`): the backend and the flags every arm shares,
the arms themselves (what differs from that common server), and the log checks of both."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from omegaconf import MISSING

from harness.validation import ConfigError, check_choice, check_cpus, check_range


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
                    raise ConfigError(
                        f"log_checks.{kind} regex {pattern!r} is invalid ({exc}); fix it in the "
                        "experiment file or on the command line"
                    ) from None


@dataclass
class ServerConfig:
    """A server backend and the flags every arm shares."""

    backend: str = "embedded"  # a name of harness.backends.NAMES (embedded | sglang | llamacpp | openai)
    python: str | None = None  # interpreter; None = the one running the harness
    module: str = "harness.engine"  # run as `python -m MODULE`
    # backend llamacpp: the llama-server binary; None = $LLAMA_SERVER, else the one `make llamacpp` built
    binary: str | None = None
    model_path: str = MISSING
    draft_model_path: str | None = None  # passed as --speculative-draft-model-path when set
    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port per run
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    seed_arg: str | None = "--random-seed"  # passed the run's base seed; null to pass none
    ready_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    health_timeout_s: float = 10.0  # a run's server must answer /health and /server_info within this at its end
    log_checks: LogChecks = field(default_factory=LogChecks)
    # backend sglang: check every planned argv with the server interpreter's own SGLang before a dry run
    # says "ok" and before a real run launches anything. require = a refused argv, or one that could not
    # be checked (no SGLang in that interpreter), fails the command; skip = do not check (said so).
    # backend llamacpp: the same, each argv parsed by the binary itself
    preflight: str = "require"
    # a server already running, at this base URL (http://HOST:PORT): not launched, stopped or pinned by the campaign
    # (backends that can attach: openai); null = a fresh server per run
    url: str | None = None
    # the command that starts the server, for backends launched by a command the user gives (openai); {host}, {port}
    # and {model} (server.model_path) are filled in
    command: list[str] = field(default_factory=list)
    # the harness' counter (harness/backends/counters.py COUNTERS) -> the server's Prometheus metric, for backends whose
    # counters the config names (openai; e.g. server=openai_vllm)
    counters: dict[str, str] = field(default_factory=dict)
    cpus: list[int] = field(default_factory=list)  # pin the server (and its children) to these CPUs; [] = no pinning

    def __post_init__(self) -> None:
        check_cpus("server.cpus", self.cpus)
        check_choice("server.preflight", self.preflight, ("require", "skip"))
        if not 0 <= self.port < 65536:
            raise ConfigError(f"server.port={self.port} is out of range; use 0 for a free port or 1-65535")
        check_range("server.ready_timeout_s", self.ready_timeout_s, 0, low_open=True)
        check_range("server.stop_timeout_s", self.stop_timeout_s, 0, low_open=True)
        check_range("server.health_timeout_s", self.health_timeout_s, 0, low_open=True)
        check_base_url("server.url", self.url)


def check_base_url(key: str, url: str | None) -> None:
    """ConfigError unless `url` is None or a server's base URL (http://HOST:PORT, no path)."""
    if url is not None and not re.fullmatch(r"https?://[^/\s]+/?", url):
        raise ConfigError(f"{key}={url!r} is not a server's base URL: give http://HOST:PORT (the routes are added)")


WORKTREE = "WORKTREE"  # a source ref: the repository's checkout as it is now, uncommitted changes included


@dataclass
class SourceConfig:
    """An arm's server code from a git ref: the commit is materialised once into a cache folder (never the
    user's checkout) and `<snapshot>/<package_dir>` goes first on the server's PYTHONPATH. No ref: none (the
    arm runs what its interpreter has installed)."""

    repo: str = ""  # a git repository (a path; relative to the working directory)
    ref: str = ""  # a commit, branch or tag, or WORKTREE (the checkout's current, uncommitted state); "" = no source
    package_dir: str = "."  # the folder holding the served package: `python` for SGLang, `.` for this project

    def __post_init__(self) -> None:
        if self.package_dir.startswith("/") or ".." in self.package_dir.split("/"):
            raise ConfigError(
                f"source.package_dir={self.package_dir!r} must be a folder inside the repository "
                "(e.g. python for SGLang, . for this project)"
            )
        if bool(self.repo) != bool(self.ref):
            given, missing = ("repo", "ref") if self.repo else ("ref", "repo")
            raise ConfigError(
                f"an arm's source has a {given} ({self.repo or self.ref!r}) but no {missing}: set "
                f"experiment.arms.N.source.{missing}=... too (both, or neither for no source)"
            )

    @property
    def given(self) -> bool:
        return bool(self.ref)


@dataclass
class ArmConfig:
    """One server arm: a name and what differs from the common server config."""

    name: str = MISSING
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # a different interpreter / install (before vs after builds)
    source: SourceConfig = field(default_factory=SourceConfig)  # the server's code from a git ref (its interpreter's)
    log_checks: LogChecks = field(default_factory=LogChecks)
    # request seed = base seed + seed offset + seed_stream * 2**32: arms with different streams draw
    # different seeds (an A/A run that measures sampling noise); 0 = the plain base seed + offset
    seed_stream: int = 0
    # this arm's server, already running at this base URL (overrides server.url; backends that can attach: openai):
    # an A/B of two servers the campaign did not launch, e.g. two deployments. It takes no args, env, python or source
    url: str | None = None

    def __post_init__(self) -> None:
        check_base_url(f"experiment.arms[{self.name}].url", self.url)
        if self.seed_stream < 0:
            raise ConfigError(
                f"experiment.arms[{self.name}].seed_stream={self.seed_stream} must be >= 0 "
                "(0 = the base seeds as they are)"
            )
