"""A server's own counters, read from its Prometheus text exposition (`/metrics`) with prometheus_client's parser,
and what each means to the audit: a `CounterMap` names, for each of the harness' counters (COUNTERS), the engine's
metric that holds it. The runner reads them at both ends of each measured window (manifest `server_counters`); the
audit sums the run's records against their deltas (analysis/audit.py check_counter_sums).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from harness.validation import ConfigError

# the harness' counters: (name, what it counts; the record column whose per-run sum it must equal)
COUNTERS = {
    "output_tokens": "tokens generated (completion_tokens)",
    "drafts": "draft proposals (one per speculative verify step that drafted)",
    "draft_tokens": "draft tokens proposed (meta_spec_num_proposed_drafts)",
    "accepted_tokens": "draft tokens accepted (spec_num_correct_drafts)",
    "verify_steps": "the target's decode steps (spec_verify_ct)",
    "decode_calls": "decode calls, the prompt's one included (spec_verify_ct + 1 per request, at concurrency 1)",
}


@dataclass(frozen=True)
class CounterMap:
    """Which metric of the server's /metrics holds each of the harness' counters (COUNTERS keys -> a sample name as
    prometheus_client gives it, `_total` included for counters, `prefix` dropped). Metrics with labels are summed over
    their labels (a server with several engines or models: one total); `labels` keeps only the samples with these
    labels. `also`: more of the engine's counters recorded (before, after, delta), not checked."""

    names: dict[str, str]
    path: str = "/metrics"
    prefix: str = ""  # the engine's own prefix, dropped from the names (llama.cpp's `llamacpp:`)
    labels: dict[str, str] = field(default_factory=dict)
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.names) - set(COUNTERS))
        if unknown:
            raise ConfigError(f"counter(s) {', '.join(unknown)} are not the harness' (valid: {', '.join(COUNTERS)})")

    def read(self, text: str) -> dict[str, float]:
        """One /metrics reply: with a prefix, every sample under it (prefix dropped); else the mapped metrics."""
        samples = parse_metrics(text, self.labels)
        if self.prefix:
            return {k[len(self.prefix) :]: v for k, v in samples.items() if k.startswith(self.prefix)}
        return {name: samples[name] for name in self.recorded() if name in samples}

    def recorded(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.names.values(), *self.also]))

    def delta(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """after - before of each recorded counter present in both."""
        return {k: after[k] - before[k] for k in self.recorded() if k in before and k in after}


def parse_metrics(text: str, labels: dict[str, str] | None = None) -> dict[str, float]:
    """Every sample of a Prometheus text reply, summed over its labels (those matching `labels`), by sample name;
    NaN samples are left out. ConfigError naming the line when the text is not Prometheus'."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                if not math.isnan(sample.value):
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
    except ValueError as exc:
        raise ValueError(f"the server's /metrics is not Prometheus text: {exc}") from None
    return out
