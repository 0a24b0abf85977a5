"""Acceptance per draft position (analysis.positions), pr.md and summary.json (analysis.pr, analysis.summary).

Golden campaign (tests/fixtures/analysis/ratio_vs_mean; make_fixtures.histogram puts a request's
ncd = completion_tokens - verify steps correct drafts evenly over its steps, 7 proposed per step):

    token seed 100: q1 20 steps x 1, q2 2 x 4     block seed 100: q1 20 x 2, q2 2 x 5
    token seed 200: q1 15 steps x 1, q2 5 x 3     block seed 200: q1 15 x 2, q2 5 x 4

so over 42 steps per arm: token accepts >= 1 in 42, >= 2 and >= 3 in 7, >= 4 in 2; block >= 1 and >= 2 in
42, >= 3 and >= 4 in 7, >= 5 in 2; nothing accepts 6 or 7.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from analysis.report import build_report, main, write_report
from analysis.summary import summary
from harness.verify.verifiers import verify_block, verify_tokenwise

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "ratio_vs_mean" / "golden" / "golden-c1"
P, Q = (Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))  # Sun et al.'s toy example


@pytest.fixture(scope="module")
def golden():
    return build_report([GOLDEN])


def test_rates_per_position_by_hand(golden):
    acc = golden.acceptance
    assert acc is not None and acc.gamma == 7  # 7 proposed per step, though no histogram has 8 bins
    assert acc.rates["token"].tolist() == pytest.approx([1, 7 / 42, 7 / 42, 2 / 42, 0, 0, 0])
    assert acc.rates["block"].tolist() == pytest.approx([1, 1, 7 / 42, 7 / 42, 2 / 42, 0, 0])
    assert acc.draft_rate["token"] == pytest.approx(58 / 294) and acc.draft_rate["block"] == pytest.approx(100 / 294)
    assert acc.mean_accepted["block"] == pytest.approx(golden.tables.pooled.at["correct_drafts_per_step", "block"])
    assert acc.histogram["token"].tolist() == [0, 35, 0, 5, 2, 0, 0, 0]
    assert acc.changes["block"][1].estimate == pytest.approx(5.0)  # position 2: 42/42 vs 7/42
    assert all(not c.has_interval for c in acc.changes["block"])  # 2 items: below the bootstrap's minimum
    seeds = acc.seeds[(acc.seeds["base_seed"] == 100) & (acc.seeds["arm"] == "token")]
    assert seeds["rate"].tolist() == pytest.approx([1, 2 / 22, 2 / 22, 2 / 22, 0, 0, 0])
    # per-request acceptance length: token 2, 5, 2, 4
    assert acc.request_al["token"] == pytest.approx({"mean": 3.25, "p10": 2.0, "p50": 3.0, "p90": 4.7})


def test_the_report_and_pr_show_the_section(golden):
    md = golden.markdown
    assert "## Acceptance per draft position" in md and "| Position 2" in md
    assert "+500.00% (no interval: 2 items, fewer than 10)" in md
    assert "Sun et al." in md  # the arms differ in --speculative-use-block-verification
    pr = golden.pr
    assert len(pr.splitlines()) < 60 and max(map(len, pr.splitlines())) <= 160
    assert "**Audit: passed**" in pr and "[report.md](report.md)" in pr


def test_records_without_histograms_say_so(tmp_path):
    camp = Path(shutil.copytree(GOLDEN, tmp_path / "golden" / "golden-c1"))
    for path in camp.glob("runs/*/records.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for rec in lines:
            if rec.get("meta_info"):
                rec["meta_info"].pop("spec_correct_drafts_histogram")
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    report = build_report([camp])
    assert report.acceptance is None
    assert "No used request carries a `spec_correct_drafts_histogram`" in report.markdown
    assert summary(report)["acceptance_by_position"] is None


def test_summary_numbers_are_the_reports(golden, tmp_path):
    written = write_report(golden, tmp_path)
    assert [p.name for p in written[:3]] == ["report.md", "pr.md", "summary.json"]
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["schema"] == "specbench.summary/1" and doc["audit"]["passed"] is True
    pooled, changes = golden.tables.pooled, golden.comparison
    for metric, entry in doc["pooled"].items():
        for arm, value in entry["values"].items():
            want = pooled.at[metric, arm]
            assert (value is None and not math.isfinite(want)) or value == pytest.approx(want), (metric, arm)
        got, c = entry["changes"]["block"], changes.get("pooled", "all", metric, "block")
        if c is None:  # e.g. queueing time: no change
            assert got is None, metric
            continue
        assert (got["estimate"] is None and not math.isfinite(c.estimate)) or got["estimate"] == pytest.approx(
            c.estimate
        )
        assert got["n"] == c.n and got["significant"] == c.significant
    assert doc["counts"]["score"]["block"] == {
        "count": int(pooled.at["correct", "block"]),
        "of": int(pooled.at["planned", "block"]),
    }
    seed = next(r for r in doc["per_seed"] if r["base_seed"] == 200 and r["arm"] == "block")
    assert seed["acceptance_length"] == pytest.approx(70 / 20)  # (45 + 25) / (15 + 5)
    assert doc["acceptance_by_position"]["arms"]["token"]["rate_by_position"][1] == pytest.approx(7 / 42)
    pr = (tmp_path / "pr.md").read_text()
    al = doc["pooled"]["acceptance_length"]["values"]
    assert f"| {al['token']:.4f}" in pr and f"| {al['block']:.4f}" in pr  # the pooled table's own cells


def test_cli_prints_the_pr_summary(capsys):
    assert main(["--pr", str(GOLDEN)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## golden: `block` vs `token`") and "| Seed " in out


def toy_profile(block: bool) -> tuple[Fraction, Fraction]:
    """P(accepted >= 1), P(accepted >= 2) on the toy example, gamma 2, by enumerating the drafts."""
    at_least = [Fraction(0), Fraction(0)]
    for x1, x2 in itertools.product((0, 1), repeat=2):
        w = Q[x1] * Q[x2]
        a1, r2 = min(1, P[x1] / Q[x1]), P[x2] / Q[x2]
        if block:
            p2 = min(1, a1 * r2)
            res = sum(max(a1 * P[x] - Q[x], 0) for x in (0, 1))
            h1 = res / (res + 1 - a1)
            full, one = p2, (1 - p2) * h1
        else:
            full, one = a1 * min(1, r2), a1 * (1 - min(1, r2))
        at_least[0] += w * (full + one)
        at_least[1] += w * full
    return at_least[0], at_least[1]


def test_the_theory_statement_holds_on_the_toy_example():
    """What the report states: token-wise (2/3, 4/9), block (2/3, 5/9); and the project's verifiers agree
    within 4 standard errors over 20,000 rows."""
    assert toy_profile(False) == (Fraction(2, 3), Fraction(4, 9))
    assert toy_profile(True) == (Fraction(2, 3), Fraction(5, 9))
    rows = 20_000
    g = torch.Generator().manual_seed(7)
    q = torch.tensor([float(x) for x in Q]).expand(rows, 2, 2).contiguous()
    p = torch.tensor([float(x) for x in P]).expand(rows, 3, 2).contiguous()
    drafts = torch.multinomial(q.reshape(-1, 2), 1, generator=g).view(rows, 2)
    u = torch.rand(rows, 3, generator=g)
    for verify, block in ((verify_tokenwise, False), (verify_block, True)):
        n = verify(p, drafts, q, uniforms=u).num_accepted
        for i, want in enumerate(toy_profile(block), start=1):
            got, exact = float((n >= i).double().mean()), float(want)
            assert abs(got - exact) < 4 * math.sqrt(exact * (1 - exact) / rows), (block, i, got, exact)


def test_greedy_drafts_get_a_verdict_on_the_profiles(tmp_path):
    """With greedy drafts the theory says the profiles agree: the report says whether they do, position by
    position, or that it cannot tell (no interval)."""
    from dataclasses import replace  # noqa: PLC0415

    from analysis.markdown import render  # noqa: PLC0415
    from analysis.stats import Change  # noqa: PLC0415

    camp = Path(shutil.copytree(GOLDEN, tmp_path / "golden" / "golden-c1"))
    for path in camp.glob("runs/*/manifest.json"):
        man = json.loads(path.read_text())
        man["command"] += ["--draft-mode", "greedy"]
        path.write_text(json.dumps(man))
    report = build_report([camp])
    assert "Greedy drafts: no position has an interval (too few items)" in report.markdown
    acc = report.acceptance
    agree = [Change(0.01, -0.02, 0.04, 30, "items") for _ in range(acc.gamma)]
    differ = [*agree[:2], Change(0.2, 0.1, 0.3, 30, "items"), *agree[3:]]
    said = render(replace(report, acceptance=replace(acc, changes={"block": agree})))
    assert "the profiles agree within their intervals at every position, as the theory requires" in said
    said = render(replace(report, acceptance=replace(acc, changes={"block": differ})))
    assert "Greedy drafts: the profiles DIFFER at position(s) [3] beyond their intervals" in said
