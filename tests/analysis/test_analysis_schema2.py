"""Schema-2 campaigns (tests/fixtures/analysis/chunks_v2): chunk timings, scores.jsonl, machine load, seed
streams, open loop, and the interval and power rules on merged campaigns.

Chunk arrays of the fixture (make_fixtures.CHUNKS; microseconds after t_sent, tokens):

    token 100 q1 [0.5, 1.5, 4.5] s [1, 19, 20]     block 100 q1 [0.5, 2.0, 3.5] s [1, 30, 29]
    token 100 q2 [0.2, 0.5, 0.7, 1.2] s [2, 0, 4, 4]  block 100 q2 [0.2, 1.2] s [1, 11]
    token 200 q1 [0.5, 2.0, 3.5] s [1, 15, 14]     block 200 q1 [0.5, 2.0, 3.5] s [1, 20, 24]
    token 200 q2 [0.2, 1.2, 2.2] s [1, 10, 9]      block 200 q2 [0.2, 2.2] s [1, 24]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mdtable import squash
from test_analysis_report import copy_campaign, edit_json

from analysis.report import build_report, power_summary

V2 = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "chunks_v2" / "golden" / "golden-c1"


@pytest.fixture(scope="module")
def v2():
    return build_report([V2], n_boot=200)


def check(report, name):
    return next(c for c in report.audit.checks if c.name == name)


def edit_records(path: Path, change) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in lines:
        change(rec)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_itl_is_token_weighted_pooled_over_the_arm_and_skips_empty_chunks(v2):
    lat = v2.metrics.pooled_latency
    # token ITL values x tokens: 1.0/19 x19, 3.0/20 x20 (100 q1); 0.5/4 x4 twice (100 q2: the chunk at 0.5 s
    # carries no token and is skipped, so the next gap is 0.7 - 0.2); 1.5/15 x15, 1.5/14 x14; 1.0/10 x10,
    # 1.0/9 x9. 95 tokens sorted: 0.0526 x19, 0.1 x25, 0.1071 x14, 0.1111 x9, 0.125 x8, 0.15 x20.
    # p50 at position 47 -> 1.5/14; p90 at 84.6 -> 0.15; p99 at 93.06 -> 0.15.
    assert lat.at["itl_p50", "token"] == pytest.approx(1.5 / 14)
    assert lat.at["itl_p90", "token"] == pytest.approx(0.15)
    assert lat.at["itl_p99", "token"] == pytest.approx(0.15)
    assert v2.metrics.pooled_counts.at["itl", "token"] == 95
    # block: 0.05 x30, 0.0517 x29, 0.0625 x24, 0.075 x20, 0.0833 x24, 0.0909 x11 (138 tokens):
    # p50 at 68.5 -> 0.0625; p90 at 123.3 -> 2/24; p99 at 135.63 -> 1/11
    assert lat.at["itl_p50", "block"] == pytest.approx(0.0625)
    assert lat.at["itl_p90", "block"] == pytest.approx(2 / 24)
    assert lat.at["itl_p99", "block"] == pytest.approx(1 / 11)
    md = squash(v2.markdown)
    assert "| ITL p50 (ms) | 107.14 (n=95) | 62.50 |" in md  # 95 tokens < 100: flagged; 138: not


def test_per_run_itl_and_tpot(v2):
    runs = v2.tables.per_run.set_index("run_id")
    # r0: 0.0526 x19, 0.125 x8, 0.15 x20 (47 tokens): p50 at position 23 -> 0.125
    assert runs.at["r0-token-100", "itl_p50"] == pytest.approx(0.125)
    # TPOT = (t_end - t_first_token) / (completion_tokens - 1): r0 q1 4/39, q2 1/9 -> p50 their mean
    assert runs.at["r0-token-100", "tpot_p50"] == pytest.approx((4 / 39 + 1 / 9) / 2)


def test_decode_throughput_uses_first_chunk_tokens_and_the_union_of_intervals(v2):
    runs = v2.tables.per_run.set_index("run_id")
    # r0: (40 - 1) + (10 - 2) tokens after the first chunks, over [100.2, 104.5] = 4.3 s
    assert runs.at["r0-token-100", "decode_tokens"] == 47
    assert runs.at["r0-token-100", "decode_span_s"] == pytest.approx(4.3)
    assert runs.at["r0-token-100", "decode_tps"] == pytest.approx(47 / 4.3)
    pooled = v2.tables.pooled
    assert pooled.at["decode_tps", "token"] == pytest.approx((47 + 48) / (4.3 + 3.3))
    assert pooled.at["decode_tps", "block"] == pytest.approx((70 + 68) / (3.3 + 3.3))
    # per-request rate, secondary: r0 q2 decodes 8 tokens over 1.0 s
    req = v2.metrics.requests
    assert sorted(req["decode_rate"].round(6))[:1] == [round(8 / 1.0, 6)]


def test_scores_come_from_scores_jsonl_and_the_scorer_is_named(v2):
    assert v2.tables.pooled.loc[["correct", "scored"], "token"].tolist() == [3, 4]
    assert check(v2, "Answers scored (scores.jsonl)").status == "ok"
    assert "scored after the measured window" in squash(v2.markdown)
    assert "scorer `boxed+math-verify 0.8.0`" in squash(v2.markdown)


def test_a_run_whose_scores_were_deleted_fails_the_audit(tmp_path):
    """N100: docs/faults.md: a used request without its line in scores.jsonl fails the audit; so does the file gone."""
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")
    (camp / "runs" / "r0-token-100" / "scores.jsonl").unlink()
    report = build_report([camp], n_boot=50)
    c = check(report, "Answers scored (scores.jsonl)")
    assert c.status == "fail" and c.summary.startswith("3/4")
    assert "r0-token-100 (token): records but no runs/r0-token-100/scores.jsonl (deleted or moved" in c.details[0]
    assert not report.audit.passed
    # seed 200 only (q1 and q2 both correct there); seed 100's two requests count as unscored
    assert report.tables.pooled.loc[["correct", "scored"], "token"].tolist() == [2, 2]
    assert "| Boxed score over entire response | 2/4 | 3/4 |  |" in squash(report.markdown)


@pytest.mark.parametrize("damage", ["lose a line", "score twice", "no request_index"])
def test_a_used_request_without_one_score_line_fails_the_audit(tmp_path, damage):
    """A request the score column counts must have exactly one line in its run's scores.jsonl: a lost line would
    count it as not correct, a second line is ambiguous."""
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")
    run = camp / "runs" / "r0-token-100"
    lines = (run / "scores.jsonl").read_text().splitlines(keepends=True)
    if damage == "lose a line":
        (run / "scores.jsonl").write_text("".join(lines[:1] + lines[2:]))  # request_index 1, q1, correct
    elif damage == "score twice":
        (run / "scores.jsonl").write_text("".join(lines + lines[1:2]))
    else:
        edit_records(run / "records.jsonl", lambda r: r.pop("request_index") if r["request_index"] == 1 else None)
    c = check(build_report([camp], n_boot=50), "Answers scored (scores.jsonl)")
    assert c.status == "fail", c
    said = "scored on 2 lines" if damage == "score twice" else "no line in its run's scores.jsonl"
    assert any("r0-token-100 line 2 (item q1)" in d and said in d for d in c.details), c.details


def test_foreign_load_is_flagged_in_the_audit_the_runs_and_the_changes(v2):
    c = check(v2, "Runs taken on a quiet machine")
    assert c.status == "warn" and c.summary.startswith("1 of 4 runs taken under foreign load")
    assert c.details == (
        "golden/golden-c1/r3-token-200 (token): other processes used 30% of all CPUs during the run (> 10%)",
    )
    md = squash(v2.markdown)
    assert "| r3-token-200 | token | 200 | 0 | 2 | 2.5000 | n/a |" in md
    assert "| 30.0% FLAGGED |" in md and "| 2.0% |" in md
    assert "1 of 2 pairs under foreign load" in md
    assert "**1 of 4 runs were taken under foreign load**" in md
    assert v2.comparison.get("pooled", "all", "throughput", "block").flagged == 1


def test_server_lifetime_al_of_zero_is_not_published(v2):
    runs = v2.tables.per_run.set_index("run_id")
    assert pd.isna(runs.at["r0-token-100", "server_accept_length"])
    assert "| r1-block-100 | block | 100 | 0 | 2 | 3.2727 | 3.4000 |" in squash(v2.markdown)


def test_open_loop_latency_counts_from_the_scheduled_arrival(tmp_path):
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")
    edit_json(camp / "campaign.json", lambda c: c.update(request_rate=2.0))
    for path in camp.glob("runs/*/manifest.json"):
        edit_json(path, lambda m: m.update(request_rate=2.0))
    # every request was scheduled 0.1 s (q1) and 0.3 s (q2) before it was sent
    edit_records(
        camp / "runs" / "r0-token-100" / "records.jsonl",
        lambda r: r.update(t_scheduled=r["t_sent"] - (0.1 if r["item_id"] == "q1" else 0.3)),
    )
    report = build_report([camp], n_boot=50)
    runs = report.tables.per_run.set_index("run_id")
    # TTFT r0: q1 0.5 + 0.1, q2 0.2 + 0.3 -> p50 0.55 s; closed loop it was 0.35 s
    assert runs.at["r0-token-100", "ttft_p50"] == pytest.approx(0.55)
    assert runs.at["r3-token-200", "ttft_p50"] == pytest.approx(0.35)  # t_scheduled = t_sent there
    lat = report.metrics.pooled_latency
    # token queueing: 0.1, 0.3, 0, 0 -> mean 0.1 s
    assert lat.at["queue_mean", "token"] == pytest.approx(0.1)
    md = squash(report.markdown)
    assert "| Client queueing time, mean (ms) | 100.0 | 0.0 | - |" in md
    assert "Open loop" in md and "scheduled arrival" in md


def _aa_streams(tmp_path: Path, block_stream: int, shift_seeds: bool) -> Path:
    """chunks_v2 as an A/A campaign: both arms run the same command; `block` declares seed stream 1."""
    camp = copy_campaign(V2, tmp_path / "golden" / f"aa{block_stream}{int(shift_seeds)}")

    def arms(c):
        c["arms"][1].update(args=[], seed_stream=block_stream)
        c["declared_difference"] = "seed stream only (A/A)"

    edit_json(camp / "campaign.json", arms)
    for man in camp.glob("runs/*-block-*/manifest.json"):
        edit_json(man, lambda m: m.update(command=[t for t in m["command"] if "block-verification" not in t]))
    if shift_seeds:
        for records in camp.glob("runs/*-block-*/records.jsonl"):
            edit_records(
                records,
                lambda r: r.update(request_seed=None if r["request_seed"] is None else r["request_seed"] + 2**32),
            )
    return camp


def test_a_a_with_distinct_seed_streams_shows_the_al_noise_floor(tmp_path):
    report = build_report([_aa_streams(tmp_path, 1, True)], n_boot=50)
    (diff,) = report.audit.arm_diffs
    assert diff.identical
    seeds = check(report, "Request seeds equal the plan")
    assert seeds.status == "ok" and "seed_stream x 2^32" in seeds.summary
    md = squash(report.markdown)
    assert "## Noise floor (A/A)" in md
    assert "The arms draw different seed streams (0 and 1" in md
    assert "| Acceptance length | +42.00% (no interval: 2 items, fewer than 10) |" in md
    assert "seed streams: `token` 0, `block` 1" in md


def test_seed_check_uses_the_arms_seed_stream(tmp_path):
    report = build_report([_aa_streams(tmp_path, 1, False)], n_boot=50)
    seeds = check(report, "Request seeds equal the plan")
    assert seeds.status == "fail" and seeds.summary.startswith("4/8")
    assert f"request_seed 201, planned {201 + 2**32}" in " ".join(seeds.details)


def test_six_pairs_give_intervals_and_the_power_table(tmp_path):
    for k in range(3):
        copy_campaign(V2, tmp_path / "golden" / f"c{k}", f"golden-c{k}")
    report = build_report([tmp_path / "golden"], n_boot=50)
    c = report.comparison.get("pooled", "all", "throughput", "block")
    assert c.n == 6 and c.has_interval and c.lo < c.estimate < c.hi
    # three copies of the two pair ratios r100 and r200: geometric mean sqrt(r100 r200)
    r100, r200 = (72 / 3.5) / (50 / 4.5), (70 / 3.5) / (50 / 3.5)
    assert c.estimate == pytest.approx(np.sqrt(r100 * r200) - 1)
    assert c.p_value == pytest.approx(2 / 64) and c.flagged == 3
    power = report.power.set_index(["arm", "metric"])
    sd = np.std(np.log([r100, r200] * 3), ddof=1)
    assert power.at[("block", "throughput"), "pairs"] == 6
    assert power.at[("block", "throughput"), "sd_log_ratio"] == pytest.approx(sd)
    assert "## Power" in squash(report.markdown)
    (line,) = power_summary(report)
    n = [f"{int(power.at[('block', 'throughput'), f'pairs_for_{p}pct']):,}" for p in (1, 2, 5)]
    assert line.startswith(
        "power, block vs token (run pairs for a 1% / 2% / 5% change at 80% power, from 6 pair(s)): "
        f"throughput {' / '.join(n)}; "
    )
    assert "(95%:" in squash(report.markdown)  # the SD's own uncertainty, in the report


def test_schema_2_report_is_byte_identical_and_schema_1_still_reads(tmp_path):
    a = build_report([V2], n_boot=100).markdown
    b = build_report([V2], n_boot=100).markdown
    assert a == b
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")
    shutil.rmtree(camp / "runs" / "r0-token-100")
    report = build_report([camp], n_boot=50)
    assert not report.audit.passed  # a planned run is missing


def test_fast_and_line_by_line_readers_agree_on_chunk_arrays():
    fast = build_report([V2], n_boot=50)
    slow = build_report([V2], n_boot=50, force_slow_reader=True)
    assert slow.data.slow_files and not fast.data.slow_files
    np.testing.assert_array_equal(fast.data.chunks.us, slow.data.chunks.us)
    np.testing.assert_array_equal(fast.data.chunks.tok_offsets, slow.data.chunks.tok_offsets)
    assert squash(fast.markdown) == squash(slow.markdown.replace("; 4 file(s) read by the line-by-line reader", ""))


def test_chunk_lists_flatten_across_sliced_empty_and_null_chunks():
    """The flat chunk arrays (analysis.load._list_parts) of a column in several chunks: a sliced chunk, an empty
    one, null lists (empty, not present), and a null list whose child values are stale (dropped)."""
    import pyarrow as pa  # noqa: PLC0415

    from analysis.load import _list_parts  # noqa: PLC0415

    lists = pa.array([[1, 2], [3], None, [], [4, 5, 6]], pa.list_(pa.int64()))
    stale = pa.ListArray.from_arrays(
        pa.array([0, 2, 4, 5], pa.int32()), pa.array([7, 8, 9, 10, 11], pa.int64()), mask=pa.array([False, True, False])
    )
    column = pa.chunked_array([lists.slice(1, 3), pa.array([], pa.list_(pa.int64())), stale, lists])
    offsets, values, present = _list_parts([column], len(column))
    assert offsets.tolist() == [0, 1, 1, 1, 3, 3, 4, 6, 7, 7, 7, 10]
    assert values.tolist() == [3, 7, 8, 11, 1, 2, 3, 4, 5, 6]
    assert present.tolist() == [True, False, True, True, False, True, True, True, False, True, True]
    # the fast reader's lists are doubles (integers below 2^53): converted exactly as they are copied, also when
    # columns of both types follow each other (a file the line-by-line reader read among fast ones)
    doubles = pa.chunked_array([pa.array([[2.0**53 - 1], None, [-3.0, 0.0]], pa.list_(pa.float64()))])
    offsets, values, present = _list_parts([column, doubles], len(column) + 3)
    assert offsets.tolist()[-4:] == [10, 11, 11, 13]
    assert values.dtype == np.int64 and values.tolist()[-3:] == [2**53 - 1, -3, 0]
    assert present.tolist()[-3:] == [True, False, True]


def test_a_mistyped_chunk_list_is_a_bad_line(tmp_path):
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")
    edit_records(
        camp / "runs" / "r1-block-100" / "records.jsonl",
        lambda r: r.update(chunk_us=[0.5, "x"]) if r["item_id"] == "q2" and not r["warmup"] else None,
    )
    report = build_report([camp], n_boot=50)
    assert report.audit.failed[0].name == "Records readable"
    assert any("chunk_us is not a list of integers" in b.reason for b in report.data.bad_lines)


def test_inconsistent_chunk_arrays_warn(tmp_path):
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")

    def change(r):
        if r["item_id"] == "q1" and not r["warmup"]:
            r.update(chunk_tokens=[1, 30, 20], chunk_us=[500_000, 3_500_000, 2_000_000])

    edit_records(camp / "runs" / "r1-block-100" / "records.jsonl", change)
    c = check(build_report([camp], n_boot=50), "Chunk timings consistent (chunk_us, chunk_tokens)")
    assert c.status == "warn" and "1 inconsistent" in c.summary
    assert c.details[0].endswith("chunk_us decreases; chunk_tokens add up to 51, completion_tokens 60")


def test_greedy_drafts_get_the_equal_in_expectation_note(tmp_path):
    camp = copy_campaign(V2, tmp_path / "golden" / "c1")
    for man in camp.glob("runs/*/manifest.json"):
        edit_json(man, lambda m: m.update(command=[*m["command"], "--draft-mode", "greedy"]))
    md = build_report([camp], n_boot=50).markdown
    assert "block and token-wise verification are equal in expectation" in md
    assert "need not accept the same prefixes" in md
    assert "equal in expectation" not in build_report([V2], n_boot=50).markdown


def test_chunk_checks_equal_a_record_by_record_reading(tmp_path):
    """check_chunks works on the flat arrays; it flags exactly the records a per-record reading flags: a decrease
    inside a record (not one across two records), token counts that do not add up, lists of different lengths;
    records without chunks, at the start, in the middle and at the end."""
    from types import SimpleNamespace  # noqa: PLC0415

    import pandas as pd  # noqa: PLC0415

    from analysis.audit import check_chunks  # noqa: PLC0415
    from analysis.load import Chunks  # noqa: PLC0415

    rng = np.random.default_rng(4)
    n = 300
    us_len = rng.integers(0, 6, n)
    us_len[[0, n - 2, n - 1]] = 0
    tok_len = np.where(rng.random(n) < 0.1, rng.integers(0, 6, n), us_len)
    us_lists = [np.sort(rng.integers(0, 1000, k)) for k in us_len]
    for i in rng.choice(n, 30):  # a decrease somewhere in some records
        if us_len[i] >= 2:
            j = rng.integers(1, us_len[i])
            us_lists[i][j] = us_lists[i][j - 1] - 1
    tok_lists = [rng.integers(0, 4, k) for k in tok_len]
    ct = np.array([t.sum() + (rng.random() < 0.1) for t in tok_lists], dtype=float)
    offsets = lambda lists: np.concatenate([[0], np.cumsum([len(x) for x in lists])])  # noqa: E731
    chunks = Chunks(
        offsets(us_lists),
        np.concatenate(us_lists).astype(np.int64),
        np.ones(n, bool),
        offsets(tok_lists),
        np.concatenate(tok_lists).astype(np.int64),
        np.ones(n, bool),
    )
    records = pd.DataFrame({"completion_tokens": ct, "_run": 0, "_line": np.arange(n), "item_id": "q"})
    path = tmp_path / "records.jsonl"  # the lines a message names: one a record
    path.write_text("{}\n" * n)
    data = SimpleNamespace(
        chunks=chunks,
        records=records,
        slow_files=[],
        runs=pd.DataFrame({"campaign": ["c"], "run_id": ["r"], "records_path": [str(path)]}),
    )
    check = check_chunks(data, SimpleNamespace(used=np.ones(n, bool)))
    flagged = {int(line.split(" line ")[1].split(" ")[0]) - 1 for line in check.details}
    want = {
        i
        for i in range(n)
        if np.any(np.diff(us_lists[i]) < 0)
        or us_len[i] != tok_len[i]
        or (us_len[i] == tok_len[i] and tok_lists[i].sum() != ct[i])
    }
    assert flagged == want and len(want) > 20
