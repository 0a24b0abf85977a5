"""The report end to end on the golden fixtures: CLI, determinism, merging, refusal, A/A, readers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import CLEAN, FIXTURES
from mdtable import squash

from analysis.load import load
from analysis.report import MismatchError, build_report, main

HOLES = FIXTURES / "missing_duplicate" / "golden" / "golden-c1"


def copy_campaign(src: Path, dst: Path, campaign_id: str | None = None) -> Path:
    """A copy of a fixture campaign, optionally under another campaign id (in every file)."""
    shutil.copytree(src, dst)
    if campaign_id:
        for path in dst.rglob("*.json*"):
            path.write_text(path.read_text().replace('"golden-c1"', json.dumps(campaign_id)))
    return dst


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_cli_writes_report_and_figures_next_to_the_campaign(tmp_path, capsys):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    assert main([str(camp)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {camp / 'report.md'}" in out and "audit: passed" in out
    assert (camp / "report.md").read_text().startswith("# A/B report: golden")
    assert sorted(p.name for p in (camp / "figures").iterdir()) == [
        "accept_by_position.png",
        "accept_histogram.png",
        "per_seed.png",
    ]


def test_cli_exit_status_strict_and_refusals(tmp_path, capsys):
    assert main([str(HOLES), "--out", str(tmp_path / "a")]) == 1  # a failed audit fails the command
    assert "AUDIT FAILED: Coverage" in capsys.readouterr().err
    assert (tmp_path / "a" / "report.md").is_file()  # still written, to read what failed
    assert main([str(HOLES), "--strict", "--out", str(tmp_path / "b")]) == 1  # (the default, said)
    assert main([str(HOLES), "--no-strict", "--out", str(tmp_path / "c")]) == 0  # the documented opt-out
    assert "Audit: FAILED" in (tmp_path / "c" / "report.md").read_text()
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as help_exit:
        main(["--help"])
    assert help_exit.value.code == 0
    said = capsys.readouterr().out
    assert "--allow-mismatch" in said and "--no-strict" in said


def test_same_files_give_a_byte_identical_report(tmp_path):
    assert main([str(CLEAN), "--out", str(tmp_path / "one")]) == 0
    assert main([str(CLEAN), "--out", str(tmp_path / "two")]) == 0
    for name in ("report.md", "figures/per_seed.png", "figures/accept_histogram.png"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert str(tmp_path) not in (tmp_path / "one" / "report.md").read_text()  # no output path inside


def test_bootstrap_seed_and_count_change_only_the_intervals(tmp_path):
    a = build_report([CLEAN], n_boot=50, bootstrap_seed=1)
    b = build_report([CLEAN], n_boot=50, bootstrap_seed=2)
    assert a.tables.pooled.equals(b.tables.pooled)
    assert "50 resamples, seed 1" in squash(a.markdown) and "seed 2" in squash(b.markdown)


def test_campaigns_of_one_experiment_merge(tmp_path):
    copy_campaign(CLEAN, tmp_path / "golden" / "cA", "golden-cA")
    copy_campaign(CLEAN, tmp_path / "golden" / "cB", "golden-cB")
    report = build_report([tmp_path / "golden"])
    assert [c.label for c in report.data.campaigns] == ["golden/cA", "golden/cB"]
    assert report.audit.passed, report.audit.failed
    assert report.audit.coverage["planned"].tolist() == [8, 8]
    assert report.tables.pooled.at["acceptance_length", "block"] == pytest.approx(142 / 42)
    c = report.comparison.get("pooled", "all", "throughput", "block")
    assert c.n == 4 and c.p_value == pytest.approx(2 / 16)  # four run pairs, all faster: exact p = 2/2^4
    assert "`golden/cA` (4 planned runs), `golden/cB` (4 planned runs)" in squash(report.markdown)
    assert "| Campaign | Run |" in squash(report.markdown)  # the per-run table names the campaign


def test_checked_metadata_mismatch_is_refused_unless_allowed(tmp_path, capsys):
    copy_campaign(CLEAN, tmp_path / "golden" / "cA", "golden-cA")
    other = copy_campaign(CLEAN, tmp_path / "golden" / "cB", "golden-cB")
    for man in other.glob("runs/*/manifest.json"):
        edit_json(man, lambda m: m.update(gpu_info={"name": "NVIDIA H200", "driver": "580", "clocks": None}))
    with pytest.raises(MismatchError, match="run gpu_name"):
        build_report([tmp_path / "golden"])
    assert main([str(tmp_path / "golden")]) == 2
    assert "refusing to compare" in capsys.readouterr().err
    report = build_report([tmp_path / "golden"], allow_mismatch=True)
    check = next(c for c in report.audit.checks if c.name.startswith("Checked metadata"))
    assert check.status == "warn" and "compared anyway" in check.summary
    assert any("NVIDIA H200" in d for d in check.details)


def test_a_a_campaign_reports_its_noise_floor(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "aa")

    def as_aa(c: dict) -> None:
        c["arms"][1].update(args=[])
        c.setdefault("config", {}).setdefault("experiment", {})["aa"] = True  # an A/A by declaration

    edit_json(camp / "campaign.json", as_aa)
    for man in camp.glob("runs/*-block-*/manifest.json"):
        edit_json(man, lambda m: m.update(command=[t for t in m["command"] if "block-verification" not in t]))
    report = build_report([camp])
    (diff,) = report.audit.arm_diffs
    assert diff.identical and report.audit.passed
    assert "## Noise floor (A/A)" in squash(report.markdown)
    assert "| Acceptance length | +42.00% (no interval: 2 items, fewer than 10) | n/a |" in squash(report.markdown)
    # two run pairs: no interval; the floor shown is the largest pair ratio's distance from 1
    assert (
        "| Output throughput | +61.00% (range of pair ratios [+40.00%, +85.14%], 2 pairs, no interval) | "
        "\u00b185.14% (largest pair ratio, 2 pairs) |" in squash(report.markdown)
    )
    assert "Both arms send the same request seeds" in squash(report.markdown)
    assert "this A/A campaign's pairs: the run-to-run noise" in squash(report.markdown)


def test_truncated_last_line_is_read_line_by_line_and_flagged(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    records = camp / "runs" / "r1-block-100" / "records.jsonl"
    records.write_text(records.read_text() + '{"schema_version": 1, "campaign_id": "gold')
    report = build_report([camp])
    assert report.data.slow_files == [str(records)]
    assert [(b.line, b.reason[:8]) for b in report.data.bad_lines] == [(4, "not JSON")]
    assert report.audit.failed[0].name == "Records readable"
    assert report.tables.pooled.at["acceptance_length", "block"] == pytest.approx(142 / 42)


def test_fast_and_line_by_line_readers_agree():
    fast = build_report([HOLES])
    slow = build_report([HOLES], force_slow_reader=True)
    assert slow.data.slow_files and not fast.data.slow_files
    assert squash(fast.markdown) == squash(slow.markdown.replace("; 4 file(s) read by the line-by-line reader", ""))
    f, s = load([HOLES]).records, load([HOLES], force_slow=True).records
    assert f.astype(str).equals(s.astype(str))


def test_old_histogram_alias_is_read(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    for records in camp.glob("runs/*/records.jsonl"):
        records.write_text(records.read_text().replace("spec_correct_drafts_histogram", "spec_accept_histogram"))
    report = build_report([camp])
    assert report.metrics.histogram["token"].tolist() == [0, 35, 0, 5, 2, 0]


def test_server_accept_length_disagreement_and_unfinished_run_fail(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    records = camp / "runs" / "r0-token-100" / "records.jsonl"
    records.write_text(records.read_text().replace('"spec_accept_length": 5.0', '"spec_accept_length": 4.0'))
    edit_json(camp / "runs" / "r3-token-200" / "manifest.json", lambda m: m.update(status="running"))
    report = build_report([camp])
    failed = {c.name: c for c in report.audit.failed}
    assert failed["Server's spec_accept_length matches the recomputed one"].summary == (
        "8 requests report spec_accept_length; 1 differ from completion_tokens/spec_verify_ct"
    )
    assert failed["Runs finished, log checks passed"].details == ("golden/c1/r3-token-200 (token): status running",)
    assert report.audit.coverage.at["token", "unfinished_run"] == 2
    assert report.tables.pooled.at["acceptance_length", "token"] == pytest.approx(50 / 22)  # seed 100 only


def test_wrong_request_seed_is_flagged(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    records = camp / "runs" / "r1-block-100" / "records.jsonl"
    records.write_text(records.read_text().replace('"request_seed": 102', '"request_seed": 7'))
    check = next(c for c in build_report([camp]).audit.checks if c.name == "Request seeds equal the plan")
    assert check.status == "fail" and check.summary.startswith("7/8")
    assert "request_seed 7, planned 102" in check.details[0]


def without_verify_counts(camp: Path, arm: str) -> None:
    """The records of `arm` as a server that reports no speculative counts writes them."""
    for records in camp.glob(f"runs/*-{arm}-*/records.jsonl"):
        lines = [json.loads(line) for line in records.read_text().splitlines()]
        for rec in lines:
            rec.update(spec_verify_ct=None, spec_num_correct_drafts=None, meta_info=None)
        records.write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_plain_decoding_baseline_has_no_acceptance_length(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    without_verify_counts(camp, "token")
    for manifest in camp.glob("runs/*-token-*/manifest.json"):  # the baseline decodes without speculation
        edit_json(manifest, lambda m: m.update(command=[{"DFLASH": "NONE"}.get(t, t) for t in m["command"]]))
    report = build_report([camp])
    check = next(c for c in report.audit.checks if c.name == "Speculative runs report their verify counts")
    assert check.status == "ok" and check.summary == "4 requests of speculative runs carry spec_verify_ct"
    # (the commands check fails: this edited campaign does not declare NONE vs DFLASH as its difference)
    assert [c.name for c in report.audit.failed] == ["Commands and environments differ only as declared"]
    assert report.tables.pooled.at["throughput", "token"] == pytest.approx(12.5)  # still measured
    assert "| Acceptance length (includes bonus) | n/a | 3.3810 | n/a |" in squash(report.markdown)
    assert report.metrics.histogram.columns.tolist() == ["token", "block"]
    assert report.metrics.histogram["token"].sum() == 0


def test_a_speculative_arm_whose_server_reports_no_verify_counts_fails_the_audit(tmp_path):
    """The token arm runs --speculative-algorithm DFLASH but its server sent no spec_* fields: its acceptance
    length is not "n/a", it was not measured, and the audit says so."""
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    without_verify_counts(camp, "token")
    report = build_report([camp])
    assert [c.name for c in report.audit.failed] == ["Speculative runs report their verify counts"]
    check = report.audit.failed[0]
    assert check.summary.startswith("4 of 8 requests of speculative runs carry no spec_verify_ct")
    assert (
        len(check.details) == 4
        and "--speculative-algorithm DFLASH, but meta_info carries no spec_verify_ct" in check.details[0]
    )
    assert "Audit: FAILED" in report.markdown


def test_three_arms_are_each_compared_with_the_baseline(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    for src in sorted(camp.glob("runs/*-block-*")):
        dst = src.with_name(src.name.replace("block", "block2"))
        shutil.copytree(src, dst)
        for path in dst.iterdir():
            path.write_text(path.read_text().replace(src.name, dst.name).replace('"block"', '"block2"'))

    def add_arm(c):
        c["arms"].append(
            {"name": "block2", "args": ["--speculative-use-block-verification"], "env": {}, "python": None}
        )
        extra = [
            dict(p, run_id=p["run_id"].replace("block", "block2"), arm="block2", index=10 + p["index"])
            for p in c["plan"]
            if p["arm"] == "block"
        ]
        c["plan"] += extra

    edit_json(camp / "campaign.json", add_arm)
    report = build_report([camp])
    assert report.arms == ["token", "block", "block2"] and report.audit.passed, report.audit.failed
    assert (
        "| Metric | token (baseline) | block | block2 | Change block vs token [95% CI] | "
        "Change block2 vs token [95% CI] |" in squash(report.markdown)
    )
    assert report.comparison.get("pooled", "all", "acceptance_length", "block2").estimate == pytest.approx(0.42)


def test_histograms_of_one_length_and_of_mixed_lengths(tmp_path):
    camp = copy_campaign(CLEAN, tmp_path / "golden" / "c1")
    for records in camp.glob("runs/*/records.jsonl"):  # drop the warmup records: every list has one length
        lines = records.read_text().splitlines()
        records.write_text("\n".join(line for line in lines if '"warmup": true' not in line) + "\n")
    one_length = load([camp]).hist
    assert one_length.present.all() and one_length.dense.sum() == 42 + 42
    check = next(c for c in build_report([camp]).audit.checks if c.name.startswith("Correct-drafts"))
    assert check.status == "ok" and check.summary == "8 requests carry a histogram; 0 inconsistent"
    mixed = load([CLEAN]).hist  # token q1 [0, 20], q2 [0, 0, 0, 0, 2], warmups none
    assert mixed.dense.shape == (12, 6)
    assert mixed.dense[1].tolist() == [0, 20, 0, 0, 0, 0] and mixed.dense[2].tolist() == [0, 0, 0, 0, 2, 0]
    assert not mixed.present[0]
