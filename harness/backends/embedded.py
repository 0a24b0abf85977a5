"""The embedded reference server (`python -m harness.engine`, server.backend=embedded): SGLang's protocol, its own
argv preflight (harness.engine.args through engine_argv_probe.py), its code asked of its interpreter."""

from __future__ import annotations

from rich.console import Console

from harness.backends.base import Backend, Preflight
from harness.backends.python_preflight import ENGINE_MODULE, python_preflight
from harness.client.dialect import Dialect
from harness.client.drive import SGLANG
from harness.server.config import ArmConfig, ServerConfig
from harness.server.launch import PlannedLaunch


class Embedded(Backend):
    name = "embedded"
    title = "the embedded server"

    def launch_argv(self, server: ServerConfig, arm: ArmConfig, port: int, slots: int) -> list[str]:
        argv = [self.python(server, arm), "-m", server.module, "--model-path", server.model_path]
        argv += ["--host", server.host, "--port", str(port)]
        if server.draft_model_path:
            argv += ["--speculative-draft-model-path", server.draft_model_path]
        return argv

    def flag_keys(self) -> list[tuple[str, str]]:
        return [*super().flag_keys(), ("--speculative-draft-model-path", "server.draft_model_path")]

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        if server.module != ENGINE_MODULE:
            console.print(
                f"argv preflight: not applicable to server.module={server.module} (it checks the embedded "
                f"server's own flags, {ENGINE_MODULE})",
                highlight=False,
            )
            return None
        return python_preflight(server, launches, console)

    @property
    def dialect(self) -> Dialect:
        return SGLANG


BACKEND = Embedded()
