"""`make perf`'s path: the experiment embedded_perf swept over client.concurrency gives one campaign per value
and a sweep table whose figures are each campaign report's own."""

from __future__ import annotations

import pytest

from analysis.report import build_report
from analysis.sweep import swept_keys

pytestmark = pytest.mark.slow
TINY = [
    "experiment=embedded_perf",
    "client.concurrency=1,3",
    "workload.n_items=3",
    "sampling.max_new_tokens=12",
    "server.model_path=embedded:mini",
    "experiment.warmup.requests=1",
    "load_sample_s=0.05",
]


def test_a_concurrency_sweep_of_embedded_perf_ends_with_a_sweep_table(tmp_path, run_bench):
    proc = run_bench(*TINY, multirun=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    roots = sorted((tmp_path / "embedded_perf").iterdir(), key=lambda p: "-c3-" in p.name)
    assert len(roots) == 2 and "-c1-" in roots[0].name  # one campaign per concurrency
    (table,) = tmp_path.glob(".multirun/*/sweep-embedded_perf.md")
    rows = [line.split("|")[1:-1] for line in table.read_text().splitlines() if line.startswith("| ")]
    header, body = [c.strip() for c in rows[0]], [[c.strip() for c in r] for r in rows[1:]]
    assert header == [
        "client.concurrency",
        "none tok/s (AL)",
        "token tok/s (AL)",
        "token / none",
        "block tok/s (AL)",
        "block / none",
        "audit",
    ]
    assert [r[0] for r in body] == ["1", "3"]
    for root, row in zip(roots, body, strict=True):
        pooled = build_report([root]).tables.pooled
        cells = dict(zip(header, row, strict=True))
        assert cells["none tok/s (AL)"] == f"{pooled.at['throughput', 'none']:,.1f}"
        assert cells["block tok/s (AL)"] == (
            f"{pooled.at['throughput', 'block']:,.1f} ({pooled.at['acceptance_length', 'block']:.2f})"
        )
        ratio = pooled.at["throughput", "token"] / pooled.at["throughput", "none"]
        assert cells["token / none"] == f"{ratio:.2f}x" and cells["audit"] == "passed"
    assert f"sweep table: {table}" in proc.stdout.replace("\n", "")


def test_swept_keys_name_what_differs_and_prefer_single_values():
    a = {"client": {"concurrency": 1}, "server": {"args": ["--max-running-requests", "1"]}, "campaign": "x"}
    b = {"client": {"concurrency": 8}, "server": {"args": ["--max-running-requests", "8"]}, "campaign": "y"}
    assert swept_keys([a, b]) == ["client.concurrency"]
    assert swept_keys([{"server": {"args": ["a"]}}, {"server": {"args": ["b"]}}]) == ["server.args"]
