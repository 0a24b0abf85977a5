"""The embedded server's GET /metrics (harness/engine/metrics.py): Prometheus text that prometheus_client parses back,
whose counters grow by exactly what the requests' own meta_info counts, and are not reset by /flush_cache."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from serverutil import engine_server, generate_concurrently, get, post_raw

from harness.backends.embedded import COUNTERS

ARGS = ["--model-path", "embedded:mini", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "4"]


def counters(url: str) -> dict[str, float]:
    status, text = get(url + "/metrics")
    assert status == 200, text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("embedded:") and s.name.endswith("_total")
    }


def test_metrics_count_what_the_requests_meta_info_counts() -> None:
    bodies = [
        {"input_ids": [i + 3, 7], "sampling_params": {"temperature": 1.0, "max_new_tokens": 20, "ignore_eos": True}}
        for i in range(3)
    ]
    with engine_server(ARGS) as server:
        before = counters(server.url)
        assert set(COUNTERS.recorded()) <= {k.removeprefix("embedded:") for k in before}, before
        replies = generate_concurrently(server.url, bodies, concurrency=3)
        after = counters(server.url)
        assert post_raw(server.url + "/flush_cache", b"")[0] == 200
        assert counters(server.url) == after  # cumulative: a flush does not reset them
    metas = [r["meta_info"] for r in replies]
    grew = {k.removeprefix("embedded:"): after[k] - before[k] for k in after}
    assert grew["requests_total"] == 3
    assert grew["output_tokens_total"] == sum(m["completion_tokens"] for m in metas) == 60
    assert grew["verify_steps_total"] == sum(m["spec_verify_ct"] for m in metas) > 0
    assert grew["drafts_total"] == grew["verify_steps_total"]
    assert grew["draft_tokens_total"] == sum(m["spec_num_proposed_drafts"] for m in metas)
    assert grew["accepted_tokens_total"] == sum(m["spec_num_correct_drafts"] for m in metas) > 0
