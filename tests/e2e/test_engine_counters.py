"""Engine counters on the embedded server (issue 53): each run's manifest carries its /metrics before and after the
measured window; the audit's counter check passes when the records add up to the deltas, and fails naming the run
when one record's accepted-draft count is raised (past the seal check with --allow-edited)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from campaigns import SMALL, bench, campaign_dir, read_jsonl

pytestmark = pytest.mark.slow

CHECK = "Per-request counts add up to the server's own counters (/metrics deltas)"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("counters")
    proc = bench(tmp, "experiment.base_seeds=[1]", *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return campaign_dir(tmp)


def report(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "analysis.report", "--bootstrap", "50", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def failed_checks(root: Path) -> list[str]:
    return json.loads((root / "summary.json").read_text())["audit"]["failed"]


def test_manifests_carry_counters_equal_to_the_record_sums(finished):
    runs = sorted((finished / "runs").iterdir())
    assert runs
    for run in runs:
        counters = json.loads((run / "manifest.json").read_text())["server_counters"]
        assert counters["names"]["accepted_tokens"] == "accepted_tokens_total", counters
        measured = [r for r in read_jsonl(run / "records.jsonl") if not r["warmup"]]
        delta = counters["delta"]
        assert delta["output_tokens_total"] == sum(r["completion_tokens"] for r in measured) > 0
        assert delta["requests_total"] == len(measured)
        if "block" in run.name:  # the speculative arm
            assert delta["accepted_tokens_total"] == sum(r["spec_num_correct_drafts"] for r in measured) > 0
            assert delta["verify_steps_total"] == sum(r["spec_verify_ct"] for r in measured) > 0
    proc = report(str(finished))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert CHECK not in failed_checks(finished)
    md = (finished / "report.md").read_text()
    assert f"{len(runs)} run(s) checked against their /metrics deltas; 0 mismatch(es)" in md, md
    assert "spec_num_correct_drafts against accepted_tokens" in md, md


def test_a_raised_accepted_count_fails_the_counter_check_naming_the_run(finished, tmp_path):
    root = tmp_path / finished.parent.name / finished.name
    shutil.copytree(finished, root)
    (run,) = [p for p in sorted((root / "runs").iterdir()) if "block" in p.name]
    path = run / "records.jsonl"
    lines = path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if not json.loads(line)["warmup"])
    rec = json.loads(lines[i])
    rec["spec_num_correct_drafts"] += 1
    lines[i] = json.dumps(rec, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n")
    proc = report(str(root), "--allow-edited")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert CHECK in failed_checks(root)
    md = (root / "report.md").read_text()
    detail = next((line for line in md.splitlines() if run.name in line and "accepted_tokens_total" in line), None)
    assert detail is not None and "spec_num_correct_drafts" in detail, md
