"""The regression gate end to end on the embedded server (docs/gate.md): an A/A passes it, a verifier that accepts
less fails it (a code A/B of two branches of a clone, as tests/runner/test_code_under_test.py runs one), and one run
pair is too few to decide a throughput rule. Tiny campaigns: one base seed, 12 items of 16 tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from code_repos import arms, make_repo, squash
from conftest import bench_process

pytestmark = pytest.mark.slow

TINY = [
    "server.model_path=embedded:mini",
    "workload.n_items=12",  # an acceptance-length interval needs 10 items (analysis.stats.MIN_ITEMS)
    "sampling.max_new_tokens=16",
    "experiment.warmup.requests=1",
    "experiment.warmup.max_new_tokens=4",
    "client.concurrency=4",
    "load_sample_s=0.05",
    "experiment.base_seeds=[5]",
]
VERIFIERS = Path("harness/verify/verifiers.py")
FAIR = "accept = u[:, :gamma] * q_tok < p_tok"
STINGY = "accept = u[:, :gamma] * q_tok * 4 < p_tok"  # accepts with min(1, p / 4q): fewer drafts per step


def report(root: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "analysis.report", str(root), "--out", str(root.parent / "out"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_an_aa_passes_and_one_pair_is_inconclusive_for_throughput(tmp_path):
    """An A/A of one seed stream (bit-identical outputs): acceptance length passes; throughput from one run pair has
    no interval, so the campaign's own gate (experiment.gate) says inconclusive, exit 4, and how to decide."""
    gate = "experiment.gate=['acceptance_length < -1%','throughput < -3%']"
    proc = bench_process(tmp_path, "experiment=embedded_aa", "experiment.arms.1.seed_stream=0", *TINY, gate)
    out = squash(proc.stdout + proc.stderr)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert squash("PASSED acceptance_length < -1% (b vs a): change +0.00% [95% CI +0.00%, +0.00%] over 12 items") in out
    assert squash("INCONCLUSIVE throughput < -3% (b vs a)") in out and squash("no 95% interval from 1 run pairs") in out
    (root,) = (tmp_path / "embedded_aa").iterdir()
    for man in (json.loads(m.read_text()) for m in root.glob("runs/*/manifest.json")):
        cpu = man["server_cpu"]  # the server's process tree over the measured window
        assert cpu["cpu_s"] > 0 and cpu["processes"] >= 1 and cpu["wall_s"] > 0, cpu
    again = report(root, "--fail-on", "acceptance_length < -1%", "--junit", str(tmp_path / "gate.xml"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "gate: PASSED (exit 0)" in again.stdout
    cases = list(ElementTree.parse(tmp_path / "gate.xml").getroot().iter("testcase"))
    assert [c.get("name") for c in cases] == ["audit", "acceptance_length < -1% (b vs a)"]
    assert all(c.find("failure") is None and c.find("error") is None for c in cases)


def test_a_stingier_verifier_fails_the_gate(tmp_path):
    """Branch `change` of a clone accepts drafts with min(1, p / 4q): the gate names the metric, its interval and the
    threshold, and exits 3; the audit itself passes (the change is declared)."""
    repo = make_repo(tmp_path, VERIFIERS, FAIR, STINGY)
    summary = tmp_path / "summary.md"
    proc = bench_process(
        tmp_path / "results",
        "experiment=embedded_code_ab",
        *arms(repo),
        *TINY,
        f"source_cache={tmp_path / 'cache'}",
        "report=false",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (root,) = (tmp_path / "results" / "embedded_code_ab").iterdir()
    junit = tmp_path / "gate.xml"
    env_proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "analysis.report",
            str(root),
            "--fail-on",
            "acceptance_length < -1%",
            "--junit",
            str(junit),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert env_proc.returncode == 3, env_proc.stdout + env_proc.stderr
    assert "audit: passed" in env_proc.stdout
    line = next(x for x in env_proc.stderr.splitlines() if "FAILED acceptance_length" in x)
    assert "(change vs base): change -" in line and "[95% CI -" in line and "lies entirely below -1.00%" in line
    (case,) = [c for c in ElementTree.parse(junit).getroot().iter("testcase") if c.get("name") != "audit"]
    assert case.find("failure") is not None and "lies entirely below -1.00%" in case.find("failure").get("message")
    assert "**Gate: FAILED** (exit 3)" in summary.read_text()
    doc = json.loads((root / "summary.json").read_text())
    assert doc["gate"]["outcome"] == "failed" and doc["pooled"]["cpu_per_token"]["values"]["change"] > 0
