"""SGLang (`python -m sglang.launch_server`, server.backend=sglang): its protocol, its argv checked by the SGLang of
the interpreter that will run it (sglang_argv_probe.py), its code asked of that interpreter."""

from __future__ import annotations

from rich.console import Console

from harness.backends.base import Preflight
from harness.backends.counters import CounterMap
from harness.backends.embedded import Embedded, declared_draft_length
from harness.backends.python_preflight import python_preflight
from harness.contract import flag_value
from harness.server.config import ServerConfig
from harness.server.launch import PlannedLaunch

BLOCK_DRAFTERS = ("DFLASH", "DSPARK")

# SGLang 0.5.23's cumulative counters (sglang/srt/observability/metrics_collector.py, `sglang:` dropped; summed over
# their labels), counted per finished request by its tokenizer manager (managers/tokenizer_manager.py,
# observe_one_finished_request): completion tokens and spec_verify_ct. Accepted and drafted tokens exist only as
# gauges (spec_accept_length, spec_accept_rate, spec_num_draft_tokens): not summable over a window, so not checked.
# Served only with --enable-metrics.
COUNTERS = CounterMap(
    {"output_tokens": "generation_tokens_total", "verify_steps": "spec_verify_calls_total"},
    prefix="sglang:",
    also=("prompt_tokens_total", "num_requests_total"),
)
METRICS_FLAG = "--enable-metrics"


class SGLang(Embedded):
    """Launched and spoken to as the embedded server is (which speaks SGLang's protocol); its own preflight."""

    name = "sglang"
    title = "SGLang"
    cannot_measure = (
        "accepted and drafted tokens from its own counters (its /metrics has them only as gauges; with "
        "--enable-metrics in server.args the audit checks output tokens and verify steps against its counters)",
    )

    def counter_map(self, server: ServerConfig) -> CounterMap | None:
        """Its counters when server.args turns its /metrics on (every arm then serves it), else none."""
        return COUNTERS if METRICS_FLAG in server.args else None

    def declared_draft_length(self, argv: list[str]) -> int | None:
        """Only for the block drafters (DFLASH, DSPARK), which draft the whole window every step; a tree drafter's
        (EAGLE's) proposals per step are not its --speculative-num-draft-tokens. Without a flag: none declared (its
        default depends on the model)."""
        algorithm = (flag_value(argv, "--speculative-algorithm") or "").upper()
        return declared_draft_length(argv, None) if algorithm in BLOCK_DRAFTERS else None

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        return python_preflight(server, launches, console)


BACKEND = SGLang()
