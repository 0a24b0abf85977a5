"""Running small campaigns as real subprocesses and reading what they leave: the record keys each file must have,
the campaign's folders, the engine processes a campaign started (shared by the e2e, runner and host tests)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

from workloads.scoring import Scorer

RECORD_KEYS = {
    "schema_version",
    "campaign_id",
    "run_id",
    "arm",
    "request_index",
    "base_seed",
    "repeat",
    "item_id",
    "seed_offset",
    "request_seed",
    "category",
    "warmup",
    "prompt_tokens",
    "completion_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "max_new_tokens",
    "finish_reason",
    "hit_cap",
    "t_scheduled",
    "t_sent",
    "t_first_token",
    "t_end",
    "n_chunks",
    "chunk_us",
    "chunk_tokens",
    "error",
    "output_text",
    "output_ids",
    "reference_answer",
    "meta_info",
}


SCORE_KEYS = {"request_index", "item_id", "warmup", "answer", "correct", "score_fallback", "scorer"}


MANIFEST_KEYS = {
    "command",
    "env",
    "versions",
    "host",
    "dataset",
    "t_start_unix",
    "t_end_unix",
    "log_checks",
    "status",
    "server_info",
    "model_info",
    "seeds_honoured",
    "wall_anchor",
    "client",
    "server_cpus",
    "machine",
    "scorer",
    "scoring",
}


# load_sample_s: 0.1 s machine-load samples around each run instead of 1 s (the suite runs many campaigns)
SMALL = [
    "server.model_path=embedded:mini",
    "workload.n_items=4",
    "sampling.max_new_tokens=24",
    "experiment.warmup.requests=2",
    "experiment.warmup.max_new_tokens=4",
    "client.concurrency=4",
    "load_sample_s=0.1",
    "report=false",
]


WITH_REPORT = SMALL[:-1]


def bench(tmp: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.bench", f"results_dir={tmp}", *overrides],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_schema2_run(run_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """A finished run's manifest, records and scores agree with docs/records.md (schema 2)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    records = read_jsonl(run_dir / "records.jsonl")
    scores = read_jsonl(run_dir / "scores.jsonl")
    assert manifest["schema_version"] == 4 and manifest["status"] == "finished"
    n_warm = sum(r["warmup"] for r in records)
    assert sorted(r["request_index"] for r in records if r["warmup"]) == list(range(n_warm))  # warmup first
    assert sorted(r["request_index"] for r in records) == list(range(len(records)))
    for rec in records:
        assert rec["schema_version"] == 4 and RECORD_KEYS == set(rec), set(rec) ^ RECORD_KEYS  # no answer/correct
        if rec["error"] is None:
            check_chunks(rec)
    # one score per record, written after the run's last request returned
    assert [s["request_index"] for s in scores] == list(range(len(records)))
    by_index = {r["request_index"]: r for r in records}
    label = " ".join(str(v) for v in manifest["scorer"].values() if v)
    for score in scores:
        assert set(score) == SCORE_KEYS and score["scorer"] == label
        rec = by_index[score["request_index"]]
        assert (score["item_id"], score["warmup"]) == (rec["item_id"], rec["warmup"])
        if rec["output_text"] is not None and manifest["scorer"]["name"] == "boxed+math-verify":
            again = Scorer().score(rec["output_text"], rec["reference_answer"])
            assert (score["answer"], score["correct"], score["score_fallback"]) == (
                again.answer,
                again.correct,
                again.fallback,
            )
    assert manifest["scoring"]["scored"] == len(records) and manifest["scoring"]["seconds"] >= 0
    wall = manifest["wall_anchor"]
    last_end_unix = wall["unix"] + max(r["t_end"] for r in records) - wall["monotonic"]
    assert (run_dir / "scores.jsonl").stat().st_mtime >= last_end_unix - 0.05
    check_machine(manifest["machine"])
    for name, key in (("records.jsonl", "records_seal"), ("scores.jsonl", "scores_seal")):  # sealed as written
        data = (run_dir / name).read_bytes()
        assert manifest[key] == {"sha256": hashlib.sha256(data).hexdigest(), "lines": data.count(b"\n")}
    return manifest, records, scores


def check_chunks(rec: dict) -> None:
    """chunk_us and chunk_tokens agree with n_chunks, completion_tokens and the request's times."""
    us, tokens = rec["chunk_us"], rec["chunk_tokens"]
    assert 1 <= len(us) <= rec["n_chunks"] and us == sorted(us) and us[0] >= 0
    assert us[0] == round((rec["t_first_token"] - rec["t_sent"]) * 1e6)
    assert us[-1] <= round((rec["t_end"] - rec["t_sent"]) * 1e6)
    if tokens is not None:
        assert len(tokens) == len(us) and sum(tokens) == rec["completion_tokens"] and min(tokens) >= 0


def check_machine(doc: dict) -> None:
    for when in ("before", "after"):
        snap = doc[when]
        assert 0 <= snap["cpu_other"] <= 1 and (snap["steal"] is None or 0 <= snap["steal"] <= 1)
        assert len(snap["load_avg"]) == 3 and snap["t_unix"] > 1.7e9
        assert snap["gpus"] is None or all({"index", "sm_clock_mhz"} <= set(g) for g in snap["gpus"])
    during = doc["during"]
    assert during["wall_s"] > 0 and 0 <= during["cpu_other_frac"] <= 1
    assert during["cpu_ours_s"] > 0 and during["cpu_total_s"] > 0  # the server worked during the window
    assert doc["before"]["t_unix"] < doc["after"]["t_unix"]


def campaign_dir(tmp: Path, experiment: str = "embedded_block_vs_token") -> Path:
    (only,) = list((tmp / experiment).iterdir())
    return only


def engine_processes(ports: set[int]) -> list[psutil.Process]:
    """Live processes whose command line starts an embedded server on one of `ports`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "harness.engine" in cmd and "--port" in cmd and int(cmd[cmd.index("--port") + 1]) in ports:
            found.append(proc)
    return found


def ports_of(root: Path) -> set[int]:
    ports = set()
    for manifest in [*root.glob("runs/*/manifest.json"), *root.glob("attempts/*/manifest.json")]:
        cmd = json.loads(manifest.read_text())["command"]
        ports.add(int(cmd[cmd.index("--port") + 1]))
    return ports


def wait_for(predicate, timeout: float = 120.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("timed out waiting")


def running_server_of_first_run(root: Path) -> psutil.Process | None:
    """The first run's server, once that run has written a measured record."""
    runs = sorted((root / "runs").glob("*")) if root.exists() else []
    if not runs or not (runs[0] / "records.jsonl").exists():
        return None
    if not any(not r["warmup"] for r in read_jsonl(runs[0] / "records.jsonl")):
        return None
    procs = engine_processes(ports_of(root))
    return procs[0] if procs else None


def jobs_of(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob(".multirun/*/specbench-jobs/*.json"))]
