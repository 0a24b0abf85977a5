"""The embedded server's own cumulative counters, served as Prometheus text on GET /metrics (prometheus_client, one
CollectorRegistry per server: no global state). The scheduler counts at the place it applies a step: the tokens it
appends to a request, each verify step, the draft tokens the worker proposed and those it accepted. They are never
reset (/flush_cache resets SGLang's lifetime averages only), so a client reads them before and after a window and
takes the difference (harness/backends/embedded.py's CounterMap; the audit sums the records against it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

PREFIX = "embedded:"  # (Prometheus names: the `_total` suffix is added by prometheus_client)


class EngineMetrics:
    """Counters since the server started; each request's own `meta_info` counts the same events."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"{PREFIX}{name}", doc, registry=self.registry)

        self.requests = counter("requests", "requests that finished on a step (length or stop; not aborted ones)")
        self.output_tokens = counter("output_tokens", "tokens appended to requests' outputs (completion_tokens)")
        self.verify_steps = counter("verify_steps", "speculative verify steps, per request (spec_verify_ct)")
        self.drafts = counter("drafts", "draft proposals: verify steps that proposed at least one draft token")
        self.draft_tokens = counter("draft_tokens", "draft tokens proposed (spec_num_proposed_drafts)")
        self.accepted_tokens = counter("accepted_tokens", "draft tokens accepted (spec_num_correct_drafts)")

    def verify_step(self, drafted: int, accepted: int) -> None:
        self.verify_steps.inc()
        self.drafts.inc(1 if drafted else 0)
        self.draft_tokens.inc(drafted)
        self.accepted_tokens.inc(accepted)

    def text(self) -> bytes:
        return generate_latest(self.registry)
