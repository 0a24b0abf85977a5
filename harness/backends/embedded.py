"""The embedded reference server (`python -m harness.engine`, server.backend=embedded): SGLang's protocol, its own
argv preflight (harness.engine.args through harness/engine/argv_probe.py), its code asked of its interpreter."""

from __future__ import annotations

from rich.console import Console

from harness.backends.base import Backend, Preflight
from harness.backends.counters import CounterMap
from harness.backends.python_preflight import ENGINE_MODULE, python_preflight
from harness.client.dialect import Dialect
from harness.client.drive import SGLANG
from harness.contract import flag_value
from harness.server.config import ArmConfig, ServerConfig
from harness.server.launch import PlannedLaunch

DEFAULT_WINDOW = 8  # the embedded server's verify window without a draft-length flag (harness/engine/args.py)


# the flags that declare the draft length, in the order they are read, and what to add to a flag's value to get the
# draft tokens per step: the verify window (gamma + 1) of --speculative-num-draft-tokens and of DFLASH's block size,
# gamma itself for DSPARK's (harness/engine/args.py; SGLang's names)
DRAFT_LENGTH_FLAGS = (
    ("--speculative-num-draft-tokens", -1),
    ("--speculative-dflash-block-size", -1),
    ("--speculative-dspark-block-size", 0),
)


def declared_draft_length(argv: list[str], default_window: int | None) -> int | None:
    """The draft tokens per verify step the command declares: the first draft-length flag it gives; without one, the
    server's default window (when it speculates: --speculative-algorithm); None when it does not speculate."""
    algorithm = flag_value(argv, "--speculative-algorithm")
    if algorithm is None or algorithm.upper() == "NONE":
        return None
    for flag, offset in DRAFT_LENGTH_FLAGS:
        value = flag_value(argv, flag)
        if value is not None:
            try:
                return int(value) + offset
            except ValueError:
                return None  # (the server's parser refuses it)
    return default_window - 1 if default_window else None


# the embedded server's /metrics (harness/engine/metrics.py, `embedded:` dropped) for the harness' counters
COUNTERS = CounterMap(
    {
        "output_tokens": "output_tokens_total",
        "drafts": "drafts_total",
        "draft_tokens": "draft_tokens_total",
        "accepted_tokens": "accepted_tokens_total",
        "verify_steps": "verify_steps_total",
    },
    prefix="embedded:",
    also=("requests_total",),
)


class Embedded(Backend):
    name = "embedded"
    title = "the embedded server"
    counters = COUNTERS

    def declared_draft_length(self, argv: list[str]) -> int | None:
        return declared_draft_length(argv, DEFAULT_WINDOW)

    def launch_argv(self, server: ServerConfig, arm: ArmConfig, port: int | str, slots: int) -> list[str]:
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
