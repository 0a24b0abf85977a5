"""What one server launch is: the exact argv, environment, log file and checks of a run of an arm (`Launch`), and a
planned run with its launch and where each flag of the command came from (`PlannedLaunch`), as the dry run shows it,
the argv preflights check it and the run launches it, its port filled in (`PlannedLaunch.at`). The command itself is
the backend's (harness/backends/, `launch_template`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.contract import PlannedRun
from harness.server.config import LogChecks

PORT_PLACEHOLDER = 0  # the port of a planned launch: the real one is picked when the run starts
PORT_FIELD = "{port}"  # where the port stands in a planned argv (filled in by fill_port)


@dataclass
class Launch:
    """Everything needed to start one server; `argv` and `env_overrides` go into the manifest."""

    argv: list[str]
    env_overrides: dict[str, str]
    host: str
    port: int
    log_path: Path
    log_checks: LogChecks
    ready_timeout_s: float
    stop_timeout_s: float
    health_timeout_s: float = 10.0  # /health and the info route at the end of a run
    cpus: list[int] = field(default_factory=list)  # pin the server to these CPUs; [] = no pinning
    cwd: Path | None = None  # the server's working directory: a source arm's snapshot; None = the runner's
    module: str = "harness.engine"  # the served module (`python -m MODULE`)
    backend: str = "embedded"  # server.backend (the registry's name: harness.backends.get)
    ready_path: str = "/health_generate"  # answers 200 once the server serves
    info_path: str = "/server_info"  # what the server runs, asked after readiness and at the end of the run
    native: bool = False  # a binary (llama-server), not `python -m MODULE`: no interpreter to ask what code it runs
    url: str | None = None  # a server already running there (server.url): not started, stopped or pinned by the run

    @property
    def launched(self) -> bool:
        return self.url is None

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/") if self.url else f"http://{self.host}:{self.port}"


def fill_port(template: Launch, port: int, log_path: Path | None = None) -> Launch:
    """The launch of a planned command at `port` (every PORT_FIELD of its argv filled in) and, when given, with its
    log at `log_path`: all a run knows only when it starts."""
    argv = [token.replace(PORT_FIELD, str(port)) for token in template.argv]
    return replace(template, argv=argv, port=port, log_path=log_path or template.log_path)


def merge_log_checks(*checks: LogChecks) -> LogChecks:
    return LogChecks(must=[r for c in checks for r in c.must], must_not=[r for c in checks for r in c.must_not])


@dataclass(frozen=True)
class PlannedLaunch:
    """A planned run, the command that will start its server (`template`: its port a PORT_FIELD), and the config key
    each flag of that command comes from. `launch` is what the dry run shows and the preflights check (port: `port`,
    PORT_PLACEHOLDER unless server.port is fixed); `at` is what the run launches: the same, at its real port."""

    run: PlannedRun
    template: Launch
    flag_keys: tuple[tuple[str, str], ...]  # (flag, config key); later keys win (the arm's over the server's)
    port: int = PORT_PLACEHOLDER

    @property
    def launch(self) -> Launch:
        return fill_port(self.template, self.port)

    def at(self, port: int, log_path: Path) -> Launch:
        """The launch of this run: the planned command at `port` (the planned one when server.port is fixed), its
        log at `log_path`."""
        return fill_port(self.template, port, log_path)

    def source_of(self, flag: str) -> str:
        return dict(self.flag_keys).get(flag, "the launch command (harness/backends/launch.py launch_template)")

    def shown_argv(self) -> list[str]:
        """The argv with a placeholder port shown as PORT."""
        argv = self.launch.argv
        return [
            "PORT" if a == str(PORT_PLACEHOLDER) and prev == "--port" else a
            for prev, a in zip(["", *argv[:-1]], argv, strict=True)
        ]
