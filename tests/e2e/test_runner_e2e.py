"""End to end: `python -m harness.bench` drives the embedded server as real subprocesses.

A small campaign runs; the layout and record keys (schema 2) are there; arms alternate; warmup is kept
out; request seeds are base seed + item id; every record is scored once, in scores.jsonl; the machine's
load is recorded; no server survives; a killed server fails its run and a rerun resumes it without
losing or duplicating records; seeds that the server ignores are flagged."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from campaigns import (
    MANIFEST_KEYS,
    SMALL,
    WITH_REPORT,
    bench,
    campaign_dir,
    check_schema2_run,
    engine_processes,
    ports_of,
    read_jsonl,
    running_server_of_first_run,
    wait_for,
)
from mdtable import squash

pytestmark = pytest.mark.slow


def test_small_campaign_and_its_report(tmp_path):
    proc = bench(tmp_path, "experiment.base_seeds=[11,22]", *WITH_REPORT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = campaign_dir(tmp_path)
    campaign = json.loads((root / "campaign.json").read_text())
    items = {i["item_id"]: i["seed_offset"] for i in campaign["workload"]["items"]}
    assert len(items) == 4
    order = [r["run_id"] for r in campaign["order_run"]]
    assert [r.split("-")[1] for r in order] == ["token", "block", "block", "token"]
    assert all(r["status"] == "finished" for r in campaign["order_run"])
    assert [a["seed_stream"] for a in campaign["arms"]] == [0, 0] and campaign["schema_version"] == 4
    for run in campaign["plan"]:
        run_dir = root / "runs" / run["run_id"]
        manifest, records, scores = check_schema2_run(run_dir)
        assert MANIFEST_KEYS <= set(manifest) and manifest["status"] == "finished"
        assert manifest["seeds_honoured"] is True and manifest["log_checks"]["passed"] is True
        assert manifest["client"] == {"stream_mode": "cumulative", "arrival": "closed", "cpus": None}
        assert manifest["server_cpus"] is None
        assert manifest["scorer"]["name"] == "boxed+math-verify" and manifest["scorer"]["version"]
        assert (run_dir / "server.log").stat().st_size > 0
        for rec in records:
            assert rec["request_seed"] == run["base_seed"] + items[rec["item_id"]]
            assert rec["error"] is None and rec["finish_reason"] in ("stop", "length")
        warm = [r for r in records if r["warmup"]]
        measured = [r for r in records if not r["warmup"]]
        assert len(warm) == 2 and all(r["completion_tokens"] <= 4 for r in warm)
        assert sorted(r["item_id"] for r in measured) == sorted(items)
        # warmup finished before the measured window began
        assert max(r["t_end"] for r in warm) <= min(r["t_sent"] for r in measured)
        for r in measured:
            assert r["t_scheduled"] <= r["t_sent"] <= r["t_first_token"] <= r["t_end"]
            assert r["spec_verify_ct"] >= 1 and r["meta_info"]["spec_verify_ct"] == r["spec_verify_ct"]
            assert r["hit_cap"] == (r["completion_tokens"] >= 24)
    assert not engine_processes(ports_of(root))
    assert str(root) in proc.stdout.replace("\n", "")
    check_report_against_records(root)


def check_report_against_records(root: Path) -> None:
    """The report's figures, recomputed here from the raw records alone."""
    from analysis.report import build_report  # noqa: PLC0415

    report_md = squash((root / "report.md").read_text())
    assert "Audit: PASSED" in report_md and (root / "figures").is_dir()
    pooled = build_report([root]).tables.pooled
    summary = json.loads((root / "summary.json").read_text())
    pr_md = (root / "pr.md").read_text()
    assert "Acceptance per draft position" in pr_md and "## Acceptance per draft position" in report_md
    assert len(pr_md.splitlines()) < 70 and max(map(len, pr_md.splitlines())) <= 160  # (a page, not a report)
    records = [r for f in root.glob("runs/*/records.jsonl") for r in read_jsonl(f) if not r["warmup"]]
    for arm in ("token", "block"):
        mine = [r for r in records if r["arm"] == arm]
        al = sum(r["completion_tokens"] for r in mine) / sum(r["spec_verify_ct"] for r in mine)
        drafts = sum(r["spec_num_correct_drafts"] for r in mine) / sum(r["spec_verify_ct"] for r in mine)
        assert pooled.loc["acceptance_length", arm] == pytest.approx(al, rel=1e-12)
        assert pooled.loc["correct_drafts_per_step", arm] == pytest.approx(drafts, rel=1e-12)
        assert f"{al:.4f}" in report_md
        assert summary["pooled"]["acceptance_length"]["values"][arm] == pytest.approx(al, rel=1e-12)
        assert f"| {al:.4f}" in pr_md  # pr.md: the same pooled figure
        rates = summary["acceptance_by_position"]["arms"][arm]["rate_by_position"]
        steps = [0] * (len(rates) + 1)
        for r in mine:
            for k, n in enumerate(r["meta_info"]["spec_correct_drafts_histogram"]):
                steps[k] += n
        assert rates == pytest.approx([sum(steps[i:]) / sum(steps) for i in range(1, len(steps))], rel=1e-12)
        tokens = windows = 0.0
        for run_id in {r["run_id"] for r in mine}:
            run = [r for r in mine if r["run_id"] == run_id]
            tokens += sum(r["completion_tokens"] for r in run)
            windows += max(r["t_end"] for r in run) - min(r["t_sent"] for r in run)
        assert pooled.loc["throughput", arm] == pytest.approx(tokens / windows, rel=1e-9)
        assert pooled.loc["cap_hits", arm] == sum(r["hit_cap"] for r in mine)


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_killed_server_fails_its_run_and_a_rerun_resumes(tmp_path):
    args = [
        "experiment.base_seeds=[5]",
        "campaign=resume-test",
        *SMALL[:-2],
        "client.concurrency=1",
        "sampling.max_new_tokens=256",
        "sampling.ignore_eos=true",
        "workload.n_items=6",
        "report=false",
    ]
    root = tmp_path / "embedded_block_vs_token" / "resume-test"
    runner = subprocess.Popen(
        [sys.executable, "-m", "harness.bench", f"results_dir={tmp_path}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        victim = wait_for(lambda: running_server_of_first_run(root))
        victim.kill()
        out, _ = runner.communicate(timeout=240)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 1, out
    campaign = json.loads((root / "campaign.json").read_text())
    first = campaign["plan"][0]["run_id"]
    status = {r["run_id"]: r["status"] for r in campaign["order_run"]}
    assert status[first] == "failed"
    assert all(s == "finished" for r, s in status.items() if r != first)
    assert "failed" in json.loads((root / "runs" / first / "manifest.json").read_text())["status"]
    kept = {r: file_hash(root / "runs" / r / "records.jsonl") for r in status if r != first}

    proc = bench(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resuming" in proc.stdout
    assert (root / "attempts" / f"{first}.1" / "records.jsonl").exists()  # the partial attempt, set aside
    for run_id, digest in kept.items():  # finished runs untouched
        assert file_hash(root / "runs" / run_id / "records.jsonl") == digest
    for run in campaign["plan"]:
        measured = [r for r in read_jsonl(root / "runs" / run["run_id"] / "records.jsonl") if not r["warmup"]]
        assert sorted(int(r["item_id"]) for r in measured) == list(range(6))  # each item exactly once
        assert all(r["error"] is None for r in measured)
    assert not engine_processes(ports_of(root))

    mismatch = bench(tmp_path, *args, "sampling.top_p=0.5")
    assert mismatch.returncode == 2 and "sampling.top_p" in mismatch.stdout


def test_ctrl_c_leaves_no_server(tmp_path):
    root_parent = tmp_path / "embedded_block_vs_token"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={tmp_path}",
            "campaign=interrupt",
            *SMALL[:-1],
            "client.concurrency=1",
            "sampling.max_new_tokens=256",
            "sampling.ignore_eos=true",
            "report=false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    root = root_parent / "interrupt"
    try:
        wait_for(lambda: running_server_of_first_run(root))
        ports = ports_of(root)
        runner.send_signal(signal.SIGINT)
        out, _ = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 130, out
    assert "Traceback" not in out and re.search(
        r"Resume with \S*python\S* -m harness\.bench results_dir=\S+ .*campaign=interrupt", out.replace("\n", " ")
    )
    time.sleep(0.5)
    assert not engine_processes(ports)
    manifest = json.loads(next((root / "runs").glob("*/manifest.json")).read_text())
    assert manifest["status"] == "failed" and "interrupt" in manifest["error"]


def test_ignored_seeds_are_flagged_chat_route(tmp_path):
    """Also drives the OpenAI chat route (streaming, spec fields from sglext.spec_tokens_details)."""
    args = [
        "experiment=embedded_aa",
        "experiment.base_seeds=[7]",
        "client=chat",
        *SMALL,
        "server.args=[--speculative-algorithm,DFLASH,--speculative-num-draft-tokens,'4']",
    ]
    proc = bench(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "seeds not honoured" in proc.stdout
    root = campaign_dir(tmp_path, "embedded_aa")
    for manifest in [*root.glob("runs/*/manifest.json"), *root.glob("attempts/*/manifest.json")]:
        doc, _, _ = check_schema2_run(manifest.parent)
        assert doc["seeds_honoured"] is False and doc["client"]["stream_mode"] == "chat"
        assert doc["server_info"]["enable_deterministic_inference"] is False
        for rec in read_jsonl(manifest.parent / "records.jsonl"):
            assert rec["error"] is None and rec["completion_tokens"] >= 1 and rec["output_text"]
            assert rec["spec_verify_ct"] >= 1 and rec["finish_reason"] in ("stop", "length")
            assert rec["n_chunks"] >= 2 and rec["t_first_token"] is not None


def test_runner_crash_kills_its_server(tmp_path):
    """SIGKILL of the runner itself: the server gets SIGTERM through PR_SET_PDEATHSIG."""
    if sys.platform != "linux":
        pytest.skip("parent-death signal is Linux only")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={tmp_path}",
            "campaign=crash",
            *SMALL[:-1],
            "client.concurrency=1",
            "sampling.max_new_tokens=256",
            "sampling.ignore_eos=true",
            "report=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = tmp_path / "embedded_block_vs_token" / "crash"
    try:
        wait_for(lambda: running_server_of_first_run(root))
        ports = ports_of(root)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
    wait_for(lambda: not engine_processes(ports), timeout=30)


def test_open_loop_campaign_times_from_the_scheduled_arrival(tmp_path):
    """client.request_rate: t_scheduled is exactly run start + the seeded Poisson offsets (so the gaps
    between scheduled arrivals are the offsets' gaps), queueing = t_sent - t_scheduled >= 0 is recorded,
    and the report says latencies count from the scheduled arrival and shows the queueing time."""
    from harness.client.drive import poisson_offsets  # noqa: PLC0415

    rate = 40.0
    proc = bench(
        tmp_path,
        "experiment=embedded_aa",
        "experiment.base_seeds=[7]",
        *WITH_REPORT,
        f"client.request_rate={rate}",
        "client.concurrency=2",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = campaign_dir(tmp_path, "embedded_aa")
    for run_dir in sorted(root.glob("runs/*")):
        doc, records, _ = check_schema2_run(run_dir)
        assert doc["client"]["arrival"] == "open"
        measured = sorted((r for r in records if not r["warmup"]), key=lambda r: r["request_index"])
        offsets = poisson_offsets(len(measured), rate, 7)
        start = measured[0]["t_scheduled"]
        for rec, offset in zip(measured, offsets, strict=True):
            assert abs(rec["t_scheduled"] - (start + offset)) < 1e-9
            assert rec["t_sent"] >= rec["t_scheduled"] - 1e-6
    report = squash((root / "report.md").read_text())
    assert "Open loop (Poisson arrivals at client.request_rate, from a seeded generator)" in report
    assert "| Client queueing time, mean (ms) |" in report and "| Client queueing time p99 (ms) |" in report


def test_the_dry_run_prints_the_argv_that_the_real_run_launches(tmp_path):
    """The plan is built once and handed on: each run's manifest command is the dry run's argv, but for the port
    (picked when the run starts; the dry run shows PORT)."""
    overrides = [*SMALL, "experiment.base_seeds=[7]"]
    dry = bench(tmp_path / "dry", *overrides, "dry_run=true")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    shown = dict(re.findall(r"^\[\d+\] (\S+) .*\n  argv: (.*)$", dry.stdout, flags=re.MULTILINE))
    assert len(shown) == 2 and "PORT" in next(iter(shown.values())), dry.stdout
    proc = bench(tmp_path / "real", *overrides)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = campaign_dir(tmp_path / "real")
    launched = {}
    for run_id in shown:
        argv = json.loads((root / "runs" / run_id / "manifest.json").read_text())["command"]
        port = argv.index("--port") + 1
        assert argv[port].isdigit() and int(argv[port]) > 0
        launched[run_id] = shlex.join([*argv[:port], "PORT", *argv[port + 1 :]])
    assert launched == shown
