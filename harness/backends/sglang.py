"""SGLang (`python -m sglang.launch_server`, server.backend=sglang): its protocol, its argv checked by the SGLang of
the interpreter that will run it (sglang_argv_probe.py), its code asked of that interpreter."""

from __future__ import annotations

from rich.console import Console

from harness.backends.base import Preflight
from harness.backends.embedded import Embedded, declared_draft_length
from harness.backends.python_preflight import python_preflight
from harness.contract import flag_value
from harness.server.config import ServerConfig
from harness.server.launch import PlannedLaunch

BLOCK_DRAFTERS = ("DFLASH", "DSPARK")


class SGLang(Embedded):
    """Launched and spoken to as the embedded server is (which speaks SGLang's protocol); its own preflight."""

    name = "sglang"
    title = "SGLang"

    def declared_draft_length(self, argv: list[str]) -> int | None:
        """Only for the block drafters (DFLASH, DSPARK), which draft the whole window every step; a tree drafter's
        (EAGLE's) proposals per step are not its --speculative-num-draft-tokens. Without a flag: none declared (its
        default depends on the model)."""
        algorithm = (flag_value(argv, "--speculative-algorithm") or "").upper()
        return declared_draft_length(argv, None) if algorithm in BLOCK_DRAFTERS else None

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        return python_preflight(server, launches, console)


BACKEND = SGLang()
