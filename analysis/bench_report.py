"""Time the report on a large synthetic campaign: `python -m analysis.bench_report [--records 1000000]`.

Writes a schema-2 campaign in the `docs/records.md` layout (2 arms x seeds x repeats x items, with
warmup records, categories, meta_info with correct-drafts histograms, a short output text, one stream
chunk per verify step in `chunk_us` / `chunk_tokens`, scores.jsonl and the manifests' `machine`) to a
temporary directory, then times `analysis.report.main([campaign, --out ...])` end to end (reading,
audit, metrics, bootstrap, markdown, figures). Generating the records is not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.json as pa_json

from analysis import report as report_mod
from analysis.load import load
from analysis.memory import report_memory

ARMS = ("token", "block")
N_DRAFT = 7  # draft tokens per step: histogram bins 0..7
TEXT = "Let me think step by step about this problem. " * 4


def _pvals(arm: int, category: int) -> np.ndarray:
    """Distribution of the number of correct drafts in a verify step."""
    weights = np.exp(-np.arange(N_DRAFT + 1) / (1.6 + 0.15 * category + 0.08 * arm))
    return weights / weights.sum()


def _campaign_json(n_items: int, seeds: list[int], repeats: int, max_new: int) -> dict:
    items = [
        {"item_id": f"item-{i}", "seed_offset": i, "category": f"cat{i % 8}", "answer": str(i % 1000)}
        for i in range(n_items)
    ]
    plan, index = [], 0
    for s_i, seed in enumerate(seeds):
        for rep in range(repeats):
            order = ARMS if (s_i + rep) % 2 == 0 else ARMS[::-1]
            for arm in order:
                plan.append(
                    {
                        "run_id": f"r{index:03d}-{arm}-s{seed}-r{rep}",
                        "arm": arm,
                        "base_seed": seed,
                        "repeat": rep,
                        "index": index,
                        "gpu": None,
                    }
                )
                index += 1
    return {
        "schema_version": 2,
        "campaign_id": "bench",
        "experiment": "bench_report",
        "created": "2026-01-01T00:00:00Z",
        "config": {"experiment": {"seeded_requests": True, "base_seeds": seeds, "repeats": repeats}},
        "arms": [
            {"name": "token", "args": [], "env": {}, "python": None, "seed_stream": 0},
            {
                "name": "block",
                "args": ["--speculative-use-block-verification"],
                "env": {},
                "python": None,
                "seed_stream": 0,
            },
        ],
        "baseline": "token",
        "declared_difference": "--speculative-use-block-verification",
        "concurrency": 8,
        "request_rate": None,
        "max_new_tokens": max_new,
        "workload": {
            "name": "synthetic",
            "dataset_id": "synthetic",
            "revision": None,
            "sha256": "0" * 64,
            "items": items,
        },
        "plan": plan,
        "order_run": [],
    }


def _snapshot(t: float) -> dict:
    return {"t_unix": t, "load_avg": [0.3, 0.3, 0.3], "cpu_other": 0.01, "steal": None, "gpus": None}


def _manifest(run: dict, port: int) -> dict:
    extra = ["--speculative-use-block-verification"] if run["arm"] == "block" else []
    return {
        "schema_version": 2,
        "campaign_id": "bench",
        "run_id": run["run_id"],
        "arm": run["arm"],
        "base_seed": run["base_seed"],
        "repeat": run["repeat"],
        "gpu": None,
        "status": "finished",
        "error": None,
        "command": [
            "python",
            "-m",
            "harness.engine",
            "--model-path",
            "tiny",
            "--port",
            str(port),
            "--speculative-algorithm",
            "DFLASH",
            *extra,
            "--enable-deterministic-inference",
        ],
        "env": {},
        "env_full_sha256": "x",
        "server_info": {"internal_states": [{"avg_spec_accept_length": 3.0}]},
        "model_info": {"model_path": "tiny"},
        "seeds_honoured": True,
        "versions": {"harness": {"version": "0.1.0", "git_sha": "abc", "dirty": False}, "python": "3.11"},
        "gpu_info": None,
        "host": {"hostname": "h", "cores": 2},
        "dataset": {"id": "synthetic", "sha256": "0" * 64},
        "model_path": "tiny",
        "log_checks": {"passed": True},
        "concurrency": 8,
        "request_rate": None,
        "max_new_tokens": 4096,
        "client": {"stream_mode": "incremental", "arrival": "closed", "cpus": None},
        "scorer": {"name": "boxed+math-verify", "version": "0.8.0"},
        "scoring": {"scored": 0, "seconds": 0.0},
        "machine": {
            "before": _snapshot(0.0),
            "after": _snapshot(1.0),
            "during": {
                "wall_s": 1.0,
                "cpu_total_s": 1.0,
                "cpu_ours_s": 1.0,
                "cpu_other_frac": 0.01,
                "steal_frac": None,
            },
        },
    }


_LINE = (
    '{"schema_version": 2, "campaign_id": "bench", "run_id": "%s", "arm": "%s", "request_index": %d, '
    '"base_seed": %d, "repeat": %d, '
    '"item_id": "item-%d", "seed_offset": %d, "request_seed": %d, "category": "cat%d", "warmup": %s, '
    '"prompt_tokens": 120, "completion_tokens": %d, "spec_verify_ct": %d, "spec_num_correct_drafts": %d, '
    '"max_new_tokens": %d, "finish_reason": "%s", "hit_cap": %s, "t_scheduled": %.6f, "t_sent": %.6f, '
    '"t_first_token": %.6f, "t_end": %.6f, "n_chunks": %d, "chunk_us": [%s], "chunk_tokens": [%s], '
    '"error": null, "output_text": "%s\\\\boxed{%d}", "reference_answer": "%d", '
    '"meta_info": {"id": "req-%d", "finish_reason": {"type": "%s"}, "prompt_tokens": 120, '
    '"completion_tokens": %d, "cached_tokens": 0, "spec_verify_ct": %d, "spec_accept_length": %r, '
    '"spec_num_correct_drafts": %d, "spec_num_proposed_drafts": %d, "spec_correct_drafts_histogram": [%s], '
    '"e2e_latency": %.6f}}\n'
)


_SCORE = (
    '{"request_index": %d, "item_id": "item-%d", "warmup": %s, "answer": "%d", "correct": %s, '
    '"score_fallback": false, "scorer": "boxed+math-verify 0.8.0"}\n'
)


def _chunks(steps: np.ndarray, ttft: float, dur: float) -> tuple[str, str]:
    """One chunk per verify step (the first carries the prefill's token too), evenly spread over the decode."""
    n = len(steps)
    us = np.round((ttft + (dur - ttft) * np.arange(n) / max(n - 1, 1)) * 1e6).astype(np.int64)
    tokens = steps.copy()
    tokens[0] += 1
    return ",".join(map(str, us)), ",".join(map(str, tokens))


def _run_lines(
    run: dict, n_items: int, max_new: int, rng: np.random.Generator, warmup: int
) -> tuple[list[str], list[str]]:
    arm = ARMS.index(run["arm"])
    items = np.concatenate([np.arange(warmup), np.arange(n_items)])
    is_warm = np.arange(len(items)) < warmup
    cat = items % 8
    vct = rng.integers(8, 64, size=len(items))  # verify steps = stream chunks per request
    hist = np.zeros((len(items), N_DRAFT + 1), dtype=np.int64)
    for c in range(8):
        sel = cat == c
        hist[sel] = rng.multinomial(vct[sel], _pvals(arm, c))
    ncd = hist @ np.arange(N_DRAFT + 1)
    ct = ncd + vct
    ttft = rng.uniform(0.02, 0.08, len(items))
    dur = ttft + ct / rng.uniform(150, 250, size=len(items))
    t_sent = 100.0 + np.arange(len(items)) // 8 * dur.mean() + rng.uniform(0, 0.01, len(items))
    lines, scores = [], []
    for i in range(len(items)):
        it, c, v, n = int(items[i]), int(ct[i]) + 1, int(vct[i]), int(ncd[i])  # + 1: the prefill's token
        reason = "length" if c >= max_new else "stop"
        correct = "true" if (it * 7 + arm + run["base_seed"]) % 5 else "false"
        warm = "true" if is_warm[i] else "false"
        step_tokens = np.repeat(np.arange(N_DRAFT + 1) + 1, hist[i])
        rng.shuffle(step_tokens)
        us, tokens = _chunks(step_tokens, ttft[i], dur[i])
        lines.append(
            _LINE
            % (
                run["run_id"],
                run["arm"],
                i,
                run["base_seed"],
                run["repeat"],
                it,
                it,
                run["base_seed"] + it,
                it % 8,
                warm,
                c,
                v,
                n,
                max_new,
                reason,
                "true" if reason == "length" else "false",
                t_sent[i] - 0.001,
                t_sent[i],
                t_sent[i] + ttft[i],
                t_sent[i] + dur[i],
                v,
                us,
                tokens,
                TEXT,
                it % 1000,
                it % 1000,
                i,
                reason,
                c,
                v,
                c / v,
                n,
                v * N_DRAFT,
                ", ".join(map(str, hist[i])),
                dur[i],
            )
        )
        scores.append(_SCORE % (i, it, warm, it % 1000, correct))
    return lines, scores


def write_campaign(root: Path, n_records: int, seeds: int, repeats: int, seed: int = 0) -> Path:
    """A synthetic campaign of about `n_records` measured records under root/bench_report/bench."""
    seed_list = [980406 + 1000 * i for i in range(seeds)]
    n_runs = seeds * repeats * len(ARMS)
    n_items = max(1, n_records // n_runs)
    camp = root / "bench_report" / "bench"
    meta = _campaign_json(n_items, seed_list, repeats, 4096)
    (camp / "runs").mkdir(parents=True)
    (camp / "campaign.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(seed)
    for k, run in enumerate(meta["plan"]):
        run_dir = camp / "runs" / run["run_id"]
        run_dir.mkdir()
        (run_dir / "manifest.json").write_text(json.dumps(_manifest(run, 30000 + k)))
        lines, scores = _run_lines(run, n_items, 4096, rng, warmup=8)
        (run_dir / "records.jsonl").write_text("".join(lines))
        (run_dir / "scores.jsonl").write_text("".join(scores))
    return camp


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _time_report(camp: Path, out: Path, n_boot: int) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), _cpu_seconds()
    rc = report_mod.main([str(camp), "--out", str(out), "--bootstrap", str(n_boot)])
    return time.perf_counter() - t0, _cpu_seconds() - c0, rc


def _time_bare_read(camp: Path, settings: contextlib.AbstractContextManager) -> float:
    """Seconds for pyarrow.json.read_json of every records.jsonl (types inferred, nothing else) under `settings`:
    the floor a JSON reader of these files starts from."""
    with settings:
        t0 = time.perf_counter()
        for path in sorted(camp.glob("runs/*/records.jsonl")):
            pa_json.read_json(path)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.bench_report", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000, help="measured records to generate (default 1M)")
    p.add_argument("--seeds", type=int, default=5, help="base seeds (default 5)")
    p.add_argument("--repeats", type=int, default=2, help="repeats per seed (default 2)")
    p.add_argument("--bootstrap", type=int, default=report_mod.DEFAULT_BOOTSTRAP, help="bootstrap resamples")
    p.add_argument("--times", type=int, default=3, help="timed report runs; the median is the figure (default 3)")
    p.add_argument("--cores", type=int, default=None, help="pin this process to the first N CPUs (Linux)")
    p.add_argument("--keep", metavar="DIR", help="write the campaign under DIR and keep it")
    args = p.parse_args(argv)
    if args.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        t0 = time.perf_counter()
        camp = write_campaign(root, args.records, args.seeds, args.repeats)
        size = sum(f.stat().st_size for f in camp.rglob("records.jsonl"))
        os.sync()  # no write-back of the fresh files during the timed runs
        print(f"generated {camp} ({size / 2**20:.0f} MiB of records) in {time.perf_counter() - t0:.1f} s")
        n = len(load([camp]).records)  # also warms the page cache
        runs, bare, bare_default = [], [], []
        for _ in range(args.times):  # interleaved, so that all see the same machine
            bare_default.append(_time_bare_read(camp, contextlib.nullcontext()))
            bare.append(_time_bare_read(camp, report_memory()))
            runs.append(_time_report(camp, root / "out", args.bootstrap))
    walls = sorted(r[0] for r in runs)
    cpu = float(np.median([r[1] for r in runs]))
    print(
        f"{n} record lines ({size / n:.0f} bytes each); full report (read, audit, metrics, {args.bootstrap} "
        f"bootstrap resamples, markdown, figures): median {float(np.median(walls)):.2f} s wall "
        f"(min {walls[0]:.2f}, max {walls[-1]:.2f}), {cpu:.2f} s CPU, on {_cores()} core(s) "
        f"({platform.processor() or platform.machine()}); exit status {runs[-1][2]}"
    )
    floor, default = float(np.median(bare)), float(np.median(bare_default))
    print(
        f"bare pyarrow.json.read_json of the same files, in the same run, with the report's memory settings "
        f"(analysis.memory): median {floor:.2f} s; the report takes {float(np.median(walls)) / floor:.2f}x that "
        f"(with Arrow's and numpy's defaults: {default:.2f} s, {float(np.median(walls)) / default:.2f}x)"
    )
    print(f"load average {os.getloadavg()[0]:.2f} (other processes on the machine inflate the wall time)")
    return 0 if all(r[2] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
