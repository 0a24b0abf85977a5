"""What one server launch is: the exact argv, environment, log file and checks of a run of an arm.

The Python backends (embedded, SGLang) are started the same way: `python -m MODULE --model-path M --host H --port
P ...`; llama.cpp's is a binary (harness/runner/server/llamacpp.py). The argv is built as a list. `PlannedLaunch` is a planned run with its launch spec and where each flag of the command
came from (the config key), as the dry run shows it and the SGLang preflight checks it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.contract import PlannedRun, SourceDoc
from harness.runner.server import llamacpp
from harness.runner.server.config import ArmConfig, LogChecks, ServerConfig

PORT_PLACEHOLDER = 0  # the port of a planned launch: the real one is picked when the run starts


@dataclass
class LaunchSpec:
    """Everything needed to start one server; `argv` and `env_overrides` go into the manifest."""

    argv: list[str]
    env_overrides: dict[str, str]
    host: str
    port: int
    log_path: Path
    log_checks: LogChecks
    ready_timeout_s: float
    stop_timeout_s: float
    health_timeout_s: float = 10.0  # /health and /server_info at the end of a run
    cpus: list[int] = field(default_factory=list)  # pin the server to these CPUs; [] = no pinning
    cwd: Path | None = None  # the server's working directory: a source arm's snapshot; None = the runner's
    module: str = "harness.engine"  # the served module (`python -m MODULE`)
    backend: str = "embedded"  # server.backend
    ready_path: str = "/health_generate"  # answers 200 once the server serves

    @property
    def native(self) -> bool:
        """A binary (llama-server), not `python -m MODULE`: no interpreter to ask what code it runs."""
        return self.backend == "llamacpp"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def merge_log_checks(*checks: LogChecks) -> LogChecks:
    return LogChecks(must=[r for c in checks for r in c.must], must_not=[r for c in checks for r in c.must_not])


def build_spec(
    server: ServerConfig,
    arm: ArmConfig,
    *,
    port: int,
    base_seed: int | None,
    gpu: int | None,
    log_path: Path,
    source: SourceDoc | None = None,
    slots: int = 1,
) -> LaunchSpec:
    """The exact command and environment of one run of one arm; an arm with a source runs from its snapshot
    (first on PYTHONPATH, and the working directory, which `python -m` puts first on sys.path). `slots`: the
    requests the server must hold at once (client.concurrency; llama-server's --parallel)."""
    if server.backend == "llamacpp":
        draft = llamacpp.model_file(server.draft_model_path) if server.draft_model_path else None
        argv = llamacpp.launch_argv(
            llamacpp.binary(server.binary), llamacpp.model_file(server.model_path), server.host, port, slots, draft
        )
    else:
        python = arm.python or server.python or sys.executable
        argv = [
            python,
            "-m",
            server.module,
            "--model-path",
            server.model_path,
            "--host",
            server.host,
            "--port",
            str(port),
        ]
        if server.draft_model_path:
            argv += ["--speculative-draft-model-path", server.draft_model_path]
    if server.seed_arg and base_seed is not None:
        argv += [server.seed_arg, str(base_seed)]
    argv += [str(a) for a in server.args] + [str(a) for a in arm.args]
    env = {**{k: str(v) for k, v in server.env.items()}, **{k: str(v) for k, v in arm.env.items()}}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if source is not None:
        first = str(Path(source.snapshot) / source.package_dir)
        rest = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (first, rest) if p)
    return LaunchSpec(
        argv=argv,
        env_overrides=env,
        host=server.host,
        port=port,
        log_path=log_path,
        log_checks=merge_log_checks(server.log_checks, arm.log_checks),
        ready_timeout_s=server.ready_timeout_s,
        stop_timeout_s=server.stop_timeout_s,
        health_timeout_s=server.health_timeout_s,
        cpus=list(server.cpus),
        cwd=Path(source.snapshot) if source else None,
        module=server.module,
        backend=server.backend,
        ready_path=llamacpp.READY_PATH if server.backend == "llamacpp" else "/health_generate",
    )


@dataclass(frozen=True)
class PlannedLaunch:
    """A planned run, the command that will start its server (port: PORT_PLACEHOLDER unless server.port
    is fixed), and the config key each flag of that command comes from."""

    run: PlannedRun
    spec: LaunchSpec
    sources: tuple[tuple[str, str], ...]  # (flag, config key); later keys win (the arm's over the server's)

    def source_of(self, flag: str) -> str:
        return dict(self.sources).get(flag, "the launch command (harness/runner/server/spec.py build_spec)")

    def shown_argv(self) -> list[str]:
        """The argv with a placeholder port shown as PORT."""
        argv = self.spec.argv
        return [
            "PORT" if a == str(PORT_PLACEHOLDER) and prev == "--port" else a
            for prev, a in zip(["", *argv[:-1]], argv, strict=True)
        ]


def token_sources(server: ServerConfig, arm: ArmConfig, arm_index: int) -> tuple[tuple[str, str], ...]:
    """(flag, config key) for the flags of one arm's command; later keys win (the arm's over the server's)."""
    pairs = (
        list(llamacpp.LAUNCH_SOURCES)
        if server.backend == "llamacpp"
        else [
            ("--model-path", "server.model_path"),
            ("--host", "server.host"),
            ("--port", "server.port"),
            ("--speculative-draft-model-path", "server.draft_model_path"),
        ]
    )
    pairs += [(server.seed_arg, "server.seed_arg")] if server.seed_arg else []
    pairs += [(str(t).split("=", 1)[0], "server.args") for t in server.args]
    pairs += [(str(t).split("=", 1)[0], f"experiment.arms.{arm_index}.args") for t in arm.args]
    return tuple(dict(pairs).items())
