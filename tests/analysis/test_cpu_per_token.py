"""The server's CPU time per output token (manifest server_cpu -> analysis): a per-run metric with the run-pair
interval and the power row of wall throughput, shown only where recorded (older campaigns read as before)."""

from __future__ import annotations

import json
import math

from analysis.report import build_report
from analysis.summary import summary


def with_server_cpu(root, seconds_per_token):
    """Give every manifest a server_cpu of `seconds_per_token[arm]` x the run's output tokens."""
    for path in sorted(root.glob("runs/*/manifest.json")):
        man = json.loads(path.read_text())
        records = [json.loads(x) for x in (path.parent / "records.jsonl").read_text().splitlines() if x.strip()]
        tokens = sum(r["completion_tokens"] or 0 for r in records if not r["warmup"])
        cpu = seconds_per_token[man["arm"]] * tokens
        man["server_cpu"] = {"pid": 1, "processes": 1, "user_s": cpu, "system_s": 0.0, "cpu_s": cpu, "wall_s": 1.0}
        path.write_text(json.dumps(man))


def test_cpu_per_token_is_a_paired_run_metric_beside_throughput(clean_campaign):
    before = build_report([clean_campaign])
    assert "cpu_per_token" not in before.tables.pooled.index and "CPU time" not in before.pr
    with_server_cpu(clean_campaign, {"token": 0.002, "block": 0.003})
    report = build_report([clean_campaign])
    pooled = report.tables.pooled
    assert math.isclose(pooled.at["cpu_per_token", "token"], 2.0) and math.isclose(
        pooled.at["cpu_per_token", "block"], 3.0
    )
    change = report.comparison.get("pooled", "all", "cpu_per_token", "block")
    assert change.unit == "run pairs" and math.isclose(change.estimate, 0.5, rel_tol=1e-9)
    assert "cpu_per_token" in set(report.power["metric"])
    assert "Server CPU time per output token (ms)" in report.pr
    doc = summary(report)["pooled"]["cpu_per_token"]
    assert math.isclose(doc["changes"]["block"]["estimate"], 0.5, rel_tol=1e-9)
