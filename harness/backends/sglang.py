"""SGLang (`python -m sglang.launch_server`, server.backend=sglang): its protocol, its argv checked by the SGLang of
the interpreter that will run it (sglang_argv_probe.py), its code asked of that interpreter."""

from __future__ import annotations

from rich.console import Console

from harness.backends.base import Preflight
from harness.backends.embedded import Embedded
from harness.backends.python_preflight import python_preflight
from harness.server.config import ServerConfig
from harness.server.launch import PlannedLaunch


class SGLang(Embedded):
    """Launched and spoken to as the embedded server is (which speaks SGLang's protocol); its own preflight."""

    name = "sglang"
    title = "SGLang"

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        return python_preflight(server, launches, console)


BACKEND = SGLang()
