"""Golden tests of the analysis: hand-made campaigns (tests/fixtures/analysis) against hand-computed figures.

The numbers of each fixture are listed in tests/fixtures/analysis/make_fixtures.py. Per run (two items,
q1 and q2, one record each; completion_tokens / spec_verify_ct):

    token seed 100: q1 40/20, q2 10/2     block seed 100: q1 60/20, q2 12/2
    token seed 200: q1 30/15, q2 20/5     block seed 200: q1 45/15, q2 25/5
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mdtable import squash

from analysis.compare import item_matrix
from analysis.report import build_report
from analysis.stats import MIN_ITEMS, bootstrap_sums, item_change

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "analysis"


def campaign(case: str) -> Path:
    return FIXTURES / case / "golden" / "golden-c1"


@pytest.fixture(scope="module")
def clean():
    return build_report([campaign("ratio_vs_mean")])


@pytest.fixture(scope="module")
def holes():
    return build_report([campaign("missing_duplicate")])


@pytest.fixture(scope="module")
def mismatched():
    return build_report([campaign("mismatched_commands")])


def change(report, metric, partition="pooled", group="all", arm="block"):
    return report.comparison.get(partition, group, metric, arm)


# ---------------------------------------------------------------------------------------------
# ratio_vs_mean: the clean campaign


def test_pooled_acceptance_length_is_a_ratio_of_sums_not_a_mean_of_ratios(clean):
    pooled = clean.tables.pooled
    # token: (40+10+30+20) / (20+2+15+5) = 100/42; block: (60+12+45+25) / 42 = 142/42
    assert pooled.at["acceptance_length", "token"] == pytest.approx(100 / 42)
    assert pooled.at["acceptance_length", "block"] == pytest.approx(142 / 42)
    # mean of per-request ratios: token (2 + 5 + 2 + 4) / 4, block (3 + 6 + 3 + 5) / 4
    assert pooled.at["al_request_mean", "token"] == pytest.approx(3.25)
    assert pooled.at["al_request_mean", "block"] == pytest.approx(4.25)
    assert pooled.at["acceptance_length", "token"] != pytest.approx(pooled.at["al_request_mean", "token"])
    # correct drafts = completion - verify steps: token 58, block 100, over 42 steps each
    assert pooled.at["correct_drafts_per_step", "token"] == pytest.approx(58 / 42)
    assert pooled.at["correct_drafts_per_step", "block"] == pytest.approx(100 / 42)


def test_acceptance_length_change_has_no_interval_below_min_items(clean):
    c = change(clean, "acceptance_length")
    assert c.estimate == pytest.approx(142 / 100 - 1)
    assert c.unit == "items" and c.n == 2 < MIN_ITEMS
    assert not c.has_interval and c.below_minimum and not c.significant
    assert change(clean, "al_request_mean").estimate == pytest.approx(17 / 13 - 1)
    assert change(clean, "correct_drafts_per_step").estimate == pytest.approx(100 / 58 - 1)


def test_item_bootstrap_interval_by_hand(clean):
    """The bootstrap itself, with the minimum lowered to 2 items: a resample holds {q1,q1}, {q1,q2} or
    {q2,q2}: q1 alone gives 105/70 - 1 = +50%, q2 alone 37/30 - 1 = +23.33%; each has probability 1/4, so
    they are the 2.5% and 97.5% points."""
    m = clean.metrics
    matrix, layouts, _ = item_matrix(m)
    boot = bootstrap_sums(matrix, 2000, np.random.default_rng(0))
    lay = layouts["pooled"]
    cols = (
        lay.col(0, 1, "tokens"),
        lay.col(0, 1, "verify_steps"),
        lay.col(0, 0, "tokens"),
        lay.col(0, 0, "verify_steps"),
    )
    c = item_change(matrix.sum(axis=0), boot, cols, 2, min_items=2)
    assert (c.estimate, c.lo, c.hi) == (pytest.approx(0.42), pytest.approx(37 / 30 - 1), pytest.approx(0.5))
    assert c.significant


def test_throughput_is_sum_of_tokens_over_sum_of_windows(clean):
    runs = clean.tables.per_run.set_index("run_id")
    # windows: max t_end - min t_sent over measured requests (the warmup record at t=1 is excluded)
    assert runs.at["r0-token-100", "window_s"] == pytest.approx(4.5)
    assert runs.at["r0-token-100", "throughput"] == pytest.approx(50 / 4.5)
    assert runs.at["r1-block-100", "throughput"] == pytest.approx(72 / 3.5)
    pooled = clean.tables.pooled
    assert pooled.at["throughput", "token"] == pytest.approx(100 / 8)  # not mean(50/4.5, 50/3.5)
    assert pooled.at["throughput", "block"] == pytest.approx(142 / 7)
    c = change(clean, "throughput")
    # the change is the geometric mean of the pair ratios: seed 100 (72/3.5)/(50/4.5), seed 200 (70/3.5)/(50/3.5)
    r100, r200 = (72 / 3.5) / (50 / 4.5), (70 / 3.5) / (50 / 3.5)
    assert c.estimate == pytest.approx(np.sqrt(r100 * r200) - 1)
    assert (c.range_lo, c.range_hi) == (pytest.approx(r200 - 1), pytest.approx(r100 - 1))
    # two run pairs (< 6): no interval; the exact sign-flip p is 2/4
    assert not c.has_interval and c.n == 2 and c.p_value == pytest.approx(0.5) and c.exact
    assert c.too_few_pairs and not c.significant


def test_decode_throughput_is_measured_and_latency_percentiles_are_pooled(clean):
    pooled = clean.tables.pooled
    # schema 1: the first chunk counts as 1 token; a request decodes over [t_first_token, t_end].
    # token seed 100: (39 + 9) tokens over [100.2, 104.5] (the union of [100.5, 104.5] and [100.2, 101.2]);
    # seed 200: (29 + 19) over [300.2, 303.5]. block: (59 + 11) over 3.3 s and (44 + 24) over 3.3 s.
    runs = clean.tables.per_run.set_index("run_id")
    assert runs.at["r0-token-100", "decode_tps"] == pytest.approx(48 / 4.3)
    assert pooled.at["decode_tps", "token"] == pytest.approx(96 / 7.6)
    assert pooled.at["decode_tps", "block"] == pytest.approx(138 / 6.6)
    # per-request rate, mean over the arm's requests: token 39/4, 9/1, 29/3, 19/2
    assert pooled.at["decode_rate_mean", "token"] == pytest.approx(np.mean([39 / 4, 9, 29 / 3, 19 / 2]))
    assert "decode_tps" in pooled.index and "Decode tok/s (mean request rate x concurrency)" not in squash(
        clean.markdown
    )
    # TTFT pooled over the arm's four requests: 0.5, 0.2, 0.5, 0.2 s -> p50 0.35 s
    assert pooled.at["ttft_p50", "token"] == pytest.approx(350.0)
    # e2e token: 4.5, 1.2, 3.5, 2.2 -> p50 (2.2 + 3.5) / 2, p90 at 2.7 of 3: 3.5 + 0.7 x 1.0
    assert pooled.at["e2e_p50", "token"] == pytest.approx(2.85)
    assert pooled.at["e2e_p90", "token"] == pytest.approx(4.2)
    # block: 3.5, 1.2, 3.5, 2.2 -> p50 2.85
    assert pooled.at["e2e_p50", "block"] == pytest.approx(2.85)
    # TPOT = (t_end - t_first_token) / (completion_tokens - 1): token 4/39, 1/9, 3/29, 2/19 -> p50 (3/29 + 2/19) / 2
    assert pooled.at["tpot_p50", "token"] == pytest.approx((3 / 29 + 2 / 19) / 2 * 1000)
    # every percentile here comes from 4 values: flagged; ITL needs chunk arrays (schema 2)
    assert "| TTFT p99 (ms) | 500.0 (n=4) | 500.0 (n=4) |" in squash(clean.markdown)
    assert "ITL p50" not in squash(clean.markdown)
    assert clean.metrics.pooled_counts.loc["itl"].sum() == 0


def test_counts_score_cap_and_errors(clean):
    pooled = clean.tables.pooled
    assert pooled.loc[["correct", "planned", "cap_hits", "errors"], "token"].tolist() == [3, 4, 0, 0]
    assert pooled.loc[["correct", "planned", "cap_hits", "errors"], "block"].tolist() == [3, 4, 1, 0]


def test_per_seed_table(clean):
    ps = clean.tables.per_seed.set_index(["base_seed", "arm"])
    assert ps.at[(100, "token"), "acceptance_length"] == pytest.approx(50 / 22)
    assert ps.at[(100, "block"), "acceptance_length"] == pytest.approx(72 / 22)
    assert ps.at[(200, "token"), "acceptance_length"] == pytest.approx(2.5)
    assert ps.at[(200, "block"), "throughput"] == pytest.approx(20.0)
    assert ps.at[(100, "token"), "correct"] == 1 and ps.at[(100, "block"), "correct"] == 2
    seed100 = change(clean, "acceptance_length", "seed", 100)
    assert seed100.estimate == pytest.approx(0.44) and not seed100.has_interval


def test_per_category_table(clean):
    pc = clean.tables.per_category.set_index(["category", "arm"])
    assert pc.at[("algebra", "token"), "acceptance_length"] == pytest.approx(2.0)
    assert pc.at[("algebra", "block"), "acceptance_length"] == pytest.approx(3.0)
    assert pc.at[("geometry", "token"), "acceptance_length"] == pytest.approx(30 / 7)
    assert pc.at[("geometry", "block"), "acceptance_length"] == pytest.approx(37 / 7)
    one_item = change(clean, "acceptance_length", "category", "geometry")
    assert one_item.estimate == pytest.approx(37 / 30 - 1) and not one_item.has_interval


def test_histogram_of_correct_drafts(clean):
    h = clean.metrics.histogram
    # every step of a request has (completion - verify) / verify correct drafts, e.g. token q1: 20 steps of 1
    assert h["token"].tolist() == [0, 35, 0, 5, 2, 0]
    assert h["block"].tolist() == [0, 0, 35, 0, 5, 2]


def test_clean_audit_passes_with_only_the_declared_difference(clean):
    assert clean.audit.passed, [c for c in clean.audit.checks if c.status == "fail"]
    (diff,) = clean.audit.arm_diffs
    assert [str(h) for h in diff.hunks] == ["+ `--speculative-use-block-verification`"]
    assert diff.clean and not diff.identical and not diff.env
    runs = clean.tables.per_run.set_index("run_id")
    assert runs.at["r0-token-100", "server_accept_length"] == 2.5  # the server's lifetime figure, shown beside
    assert runs.at["r0-token-100", "acceptance_length"] == pytest.approx(50 / 22)


def test_markdown_tables_match_the_shape_of_the_published_ab(clean):
    md = squash(clean.markdown)
    assert "## Audit: PASSED" in md
    assert "| Metric | token (baseline) | block | Change block vs token [95% CI] |" in md
    assert (
        "| Acceptance length (includes bonus) | 2.3810 | 3.3810 | +42.00% (no interval: 2 items, fewer than 10) |" in md
    )
    assert (
        "| Output throughput (tokens/s) | 12.50 | 20.29 | +61.00% (range of pair ratios [+40.00%, +85.14%], "
        "2 pairs, no interval) |"
    ) in md
    assert "| Boxed score over entire response | 3/4 | 3/4 |  |" in md
    assert "| Responses hitting the 60-token cap | 0/4 | 1/4 |  |" in md
    assert "| 100 | 2.2727 | 3.2727 | 11.11 | 20.57 | 1/2 | 2/2 | +44.00% (no interval: 2 items, fewer than 10) |" in md
    assert "| geometry | 4 | 4.2857 | 5.2857 |" in md
    assert "cannot give p below 0.5" in md
    assert "scored in the client's event loop" in md and "Closed loop" in md
    assert "Foreign CPU" in md and "| not recorded |" in md
    assert (
        md.index("## Audit")
        < md.index("## Results")
        < md.index("## Power")
        < md.index("## Per seed")
        < md.index("## Setup")
        < md.index("## Method")
    )


# ---------------------------------------------------------------------------------------------
# missing_duplicate


def test_missing_duplicated_and_errored_requests_are_counted_and_listed(holes):
    cov = holes.audit.coverage
    assert cov.loc["token"].to_dict() == {
        "planned": 4,
        "used": 3,
        "missing": 0,
        "duplicated": 1,
        "extra_records": 1,
        "errored": 1,
        "unfinished_run": 0,
        "unplanned_records": 0,
    }
    assert cov.loc["block", ["planned", "used", "missing", "duplicated", "errored"]].tolist() == [4, 3, 1, 0, 0]
    assert holes.audit.missing[["arm", "base_seed", "item_id"]].values.tolist() == [["block", 200, "q2"]]
    assert holes.audit.duplicated[["arm", "base_seed", "item_id", "records"]].values.tolist() == [
        ["token", 100, "q1", 2]
    ]
    assert holes.audit.errored[["arm", "base_seed", "item_id", "error"]].values.tolist() == [
        ["token", 200, "q2", "HTTP 500: boom"]
    ]
    assert not holes.audit.passed
    assert [c.name for c in holes.audit.failed] == ["Coverage (each planned request once, finished, outside warmup)"]


def test_metrics_use_the_first_copy_of_a_duplicate_and_skip_errors(holes):
    pooled = holes.tables.pooled
    # token uses seed-100 q1 (first copy: 40 tokens, not 44), seed-100 q2 and seed-200 q1
    assert pooled.at["acceptance_length", "token"] == pytest.approx((40 + 10 + 30) / (20 + 2 + 15))
    assert pooled.at["acceptance_length", "block"] == pytest.approx((60 + 12 + 45) / (20 + 2 + 15))
    assert pooled.loc[["used", "errors", "planned"], "token"].tolist() == [3, 1, 4]
    # throughput counts every measured record the run sent: seed 100 (40 + 10 + 44) / 4.5, seed 200 30 / 3.5
    assert pooled.at["throughput", "token"] == pytest.approx((94 + 30) / (4.5 + 3.5))


def test_markdown_is_loud_about_a_failed_audit(holes):
    md = squash(holes.markdown)
    assert md.startswith("# A/B report: golden")
    assert "## Audit: FAILED (1 of 25 checks)" in md
    assert "> **AUDIT FAILED.**" in md
    assert "- missing: arm block, seed 200, repeat 0, item q2 (golden/golden-c1/r2-block-200)" in md
    assert "- duplicated (2 records): arm token, seed 100, repeat 0, item q1" in md
    assert "- errored (error; HTTP 500: boom): arm token, seed 200, repeat 0, item q2" in md
    assert md.index("AUDIT FAILED") < md.index("## Results")


# ---------------------------------------------------------------------------------------------
# mismatched_commands


def test_undeclared_command_and_env_differences_fail_the_audit(mismatched):
    (diff,) = mismatched.audit.arm_diffs
    assert [str(h) for h in diff.hunks] == [
        "after `--max-running-requests`: `8` -> `16`",
        "+ `--speculative-use-block-verification`",
    ]  # the ports (31000-31003) are not a difference
    assert diff.undeclared_removed == ("8",) and diff.undeclared_added == ("16",)
    assert [(e.key, e.baseline, e.arm) for e in diff.undeclared_env] == [("SGLANG_RAGGED_VERIFY_MODE", None, "dynamic")]
    assert not diff.clean
    (failed,) = mismatched.audit.failed
    assert failed.name == "Commands and environments differ only as declared"
    assert any("removed ['8'], added ['16']" in d for d in failed.details)


def test_markdown_shows_the_undeclared_differences(mismatched):
    md = squash(mismatched.markdown)
    assert "`block` vs `token` (**UNDECLARED differences**; 2 run(s) compared):" in md
    assert "- after `--max-running-requests`: `8` -> `16`" in md
    assert "- env `SGLANG_RAGGED_VERIFY_MODE`: (unset) -> `dynamic` (UNDECLARED)" in md
    assert "--port <port>" in md and "31000" not in md


def test_a_percentile_change_shows_the_change_between_its_columns(clean):
    """The change of a latency percentile is over per-run percentiles; its cell also gives the pooled
    columns' own change, so that a reader can trace both."""
    from analysis.tables import fmt_pct, labels  # noqa: PLC0415

    shown = clean.tables.pooled_display.set_index("Metric")
    pooled = clean.tables.pooled
    names = labels(clean.data.campaigns[0].meta.get("max_new_tokens"))
    differ = 0
    for metric in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p90", "tpot_p50"):
        cell = shown.at[names[metric], "Change block vs token [95% CI]"]
        columns = pooled.at[metric, "block"] / pooled.at[metric, "token"] - 1
        assert cell.endswith(f"; pooled columns {fmt_pct(columns)}"), (metric, cell)
        differ += abs(columns) > 1e-3
    assert differ  # some percentile's columns do differ
    assert "; pooled columns" not in shown.at["Acceptance length (includes bonus)", "Change block vs token [95% CI]"]


def test_the_few_values_footnote_only_when_a_shown_cell_is_marked(clean):
    from dataclasses import replace  # noqa: PLC0415

    from analysis.tables import marked_cells  # noqa: PLC0415

    m = clean.metrics
    assert marked_cells(m, clean.tables.pooled)  # 4 requests per arm: every percentile is marked
    counts = m.pooled_counts.copy()
    counts.loc[["ttft", "e2e", "tpot"]] = 1000  # enough values; ITL (0 values, schema 1) and queueing are not shown
    assert not marked_cells(replace(m, pooled_counts=counts), clean.tables.pooled)
