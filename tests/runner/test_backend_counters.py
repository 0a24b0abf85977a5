"""Which /metrics counters each backend declares (harness/backends/*.py), read from Prometheus text as each engine
writes it: the embedded server's own registry, and SGLang's names (sglang/srt/observability/metrics_collector.py)."""

from __future__ import annotations

import dataclasses

from harness.backends.embedded import BACKEND as EMBEDDED
from harness.backends.sglang import BACKEND as SGLANG
from harness.engine.metrics import EngineMetrics
from harness.server.config import ServerConfig

SGLANG_TEXT = """# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{is_streaming="False",model_name="m"} 30.0
sglang:generation_tokens_total{is_streaming="True",model_name="m"} 12.0
# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="m"} 9.0
# HELP sglang:spec_accept_length The average acceptance length.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m"} 3.5
"""


def test_the_embedded_server_counters_read_back_from_its_registry() -> None:
    metrics = EngineMetrics()
    metrics.output_tokens.inc(7)
    metrics.verify_step(drafted=4, accepted=3)
    metrics.verify_step(drafted=4, accepted=0)
    got = EMBEDDED.counter_map(ServerConfig()).read(metrics.text().decode())
    assert {k: got[k] for k in EMBEDDED.counters.recorded()} == {
        "output_tokens_total": 7,
        "drafts_total": 2,
        "draft_tokens_total": 8,
        "accepted_tokens_total": 3,
        "verify_steps_total": 2,
        "requests_total": 0,
    }


def test_sglang_counts_output_tokens_and_verify_steps_only_with_its_metrics_on() -> None:
    assert SGLANG.counter_map(ServerConfig()) is None
    counters = SGLANG.counter_map(dataclasses.replace(ServerConfig(), args=["--enable-metrics"]))
    assert counters is not None and "accepted_tokens" not in counters.names
    got = counters.read(SGLANG_TEXT)
    assert got["generation_tokens_total"] == 42 and got["spec_verify_calls_total"] == 9  # summed over labels
