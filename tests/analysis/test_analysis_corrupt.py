"""Corrupt records and manifests: the audit fails (or the report refuses, naming the file), never a
traceback, never a figure that silently absorbs an impossible number."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import CLEAN
from test_analysis_report import edit_json

from analysis.report import build_report, main

VALUES_CHECK = "Record values are valid (counts, times)"
RECORDS = "runs/r1-block-100/records.jsonl"


def edit_measured_record(camp: Path, item: str, change) -> None:
    """Apply `change` to the measured (non-warmup) record of `item` in the block arm's seed-100 run."""
    path = camp / RECORDS
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in lines:
        if rec["item_id"] == item and not rec["warmup"]:
            change(rec)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))  # json.dumps writes NaN/Infinity as Python does


def check(report, name):
    return next(c for c in report.audit.checks if c.name == name)


CLEAN_BLOCK_AL = 142 / 42  # the block arm's pooled acceptance length in the clean fixture


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: r.update(completion_tokens=-40), "completion_tokens is negative"),
        (lambda r: r.update(spec_verify_ct=-5), "spec_verify_ct is negative"),
        (lambda r: r.update(spec_verify_ct=2.5), "spec_verify_ct is negative or not an integer"),
        (lambda r: r.update(spec_num_correct_drafts=-1), "spec_num_correct_drafts is negative"),
        (lambda r: r.update(spec_verify_ct=0), "no verify step but more than one completion token"),
        (lambda r: r.update(completion_tokens=61), "completion_tokens exceeds the request's max_new_tokens"),
        (lambda r: r.update(t_end=r["t_sent"] - 1), "t_end is before t_sent"),
        (lambda r: r.update(t_first_token=r["t_end"] + 1), "t_first_token is outside"),
        (lambda r: r.update(t_end=None), "t_sent or t_end is missing"),  # its tokens would count in a shorter window
        (lambda r: r.pop("t_sent"), "t_sent or t_end is missing"),
        (lambda r: r.update(t_end=10104.5), "t_sent or t_end is outside its run"),  # the run's window ends at 500 s
        (lambda r: r.update(t_sent=-500.0), "t_sent or t_end is outside its run"),  # it starts at 0
    ],
)
def test_impossible_values_fail_the_audit_and_stay_out_of_the_figures(tmp_path, change, reason, clean_campaign):
    camp = clean_campaign
    edit_measured_record(camp, "q1", change)
    report = build_report([camp])
    values = check(report, VALUES_CHECK)
    assert values.status == "fail" and len(values.details) == 1, values
    assert "r1-block-100 line" in values.details[0] and reason in values.details[0]
    assert report.audit.coverage.at["block", "errored"] == 1  # counted as errored, so never used
    assert report.tables.pooled.at["acceptance_length", "block"] != pytest.approx(CLEAN_BLOCK_AL)
    assert main([str(camp), "--strict", "--out", str(tmp_path / "out")]) == 1


def test_a_plain_first_token_without_a_verify_step_is_valid(tmp_path, clean_campaign):
    camp = clean_campaign
    edit_measured_record(
        camp, "q1", lambda r: r.update(completion_tokens=1, spec_verify_ct=0, spec_num_correct_drafts=0, meta_info=None)
    )
    assert check(build_report([camp]), VALUES_CHECK).status == "ok"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "completion_tokens=nan is not finite"),
        (float("inf"), "completion_tokens=inf is not finite"),
        (10**400, "completion_tokens=inf is not finite, or too large for a float"),
        ("40", "completion_tokens='40' is not a number"),
    ],
)
def test_non_finite_huge_and_mistyped_numbers_are_bad_lines(tmp_path, capsys, value, reason, clean_campaign):
    camp = clean_campaign
    edit_measured_record(camp, "q1", lambda r: r.update(completion_tokens=value))
    report = build_report([camp])
    readable = check(report, "Records readable")
    assert readable.status == "fail" and any(reason in d for d in readable.details), readable.details
    assert report.tables.pooled.at["acceptance_length", "block"] != pytest.approx(CLEAN_BLOCK_AL)
    assert main([str(camp), "--strict", "--out", str(tmp_path / "out")]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("slow", [False, True])
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: r["meta_info"].update(e2e_latency=float("nan")), "meta_info.e2e_latency=nan is not finite"),
        (
            lambda r: r["meta_info"].update(spec_extra=[1.0, float("-inf")]),
            "meta_info.spec_extra[1]=-inf is not finite",
        ),
        (lambda r: r.update(note="edited"), "unknown key 'note': not a key of a record"),
    ],
)
def test_nan_anywhere_in_meta_info_or_an_unknown_key_fails_the_audit(tmp_path, change, reason, slow, clean_campaign):
    """N61: values inside meta_info that the figures do not read, and keys no record has, are checked too."""
    camp = clean_campaign
    edit_measured_record(camp, "q1", change)
    readable = check(build_report([camp], force_slow_reader=slow), "Records readable")
    assert readable.status == "fail" and len(readable.details) == 1, readable.details
    assert f"{RECORDS}:" in readable.details[0] and reason in readable.details[0], readable.details
    assert main([str(camp), "--strict", "--out", str(tmp_path / "out")]) == 1


def test_the_word_nan_in_a_text_is_no_bad_line(clean_campaign):
    edit_measured_record(clean_campaign, "q1", lambda r: r.update(output_text="NaN and Infinity"))
    assert check(build_report([clean_campaign]), "Records readable").status == "ok"


@pytest.mark.parametrize("before", ["\n \n", "not json\n\n"])  # the fast reader's file; the line-by-line one's
@pytest.mark.parametrize(("value", "check_name"), [(-40, VALUES_CHECK), (float("nan"), "Records readable")])
def test_a_flagged_record_is_named_by_its_line_in_the_file(before, value, check_name, clean_campaign):
    """Blank lines and lines that are not records come before it: the message names the file's line, not the
    record's place among the records."""
    camp = clean_campaign
    edit_measured_record(camp, "q1", lambda r: r.update(completion_tokens=value))
    path = camp / RECORDS
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if f'"completion_tokens": {json.dumps(value)}' in line)
    path.write_text(before + "".join(lines))
    details = check(build_report([camp]), check_name).details
    line = at + 1 + before.count("\n")
    assert any(f"line {line} " in d or f"records.jsonl:{line}: completion_tokens" in d for d in details), details


def test_out_of_range_request_seed_is_a_bad_line(tmp_path, clean_campaign):
    camp = clean_campaign
    edit_measured_record(camp, "q1", lambda r: r.update(request_seed=2**70))
    readable = check(build_report([camp]), "Records readable")
    assert readable.status == "fail"
    assert any("request_seed=1180591620717411303424 is out of the 64-bit integer range" in d for d in readable.details)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("base_seed", "abc", "base_seed='abc' is of type str; expected int"),
        ("concurrency", float("nan"), "concurrency=nan is of type float; expected int"),
        ("request_rate", float("inf"), "request_rate=inf is not finite"),
        ("repeat", 2**70, "repeat=1180591620717411303424 is out of the 64-bit integer range"),
        ("status", 3, "status=3 is of type int; expected str"),
        ("log_checks", {"passed": "yes"}, "log_checks.passed='yes' is of type str; expected bool"),
    ],
)
def test_mistyped_manifest_is_refused_naming_file_and_key(tmp_path, capsys, key, value, message, clean_campaign):
    camp = clean_campaign
    manifest = camp / "runs" / "r1-block-100" / "manifest.json"
    edit_json(manifest, lambda m: m.update({key: value}))
    assert main([str(camp)]) == 2
    err = capsys.readouterr().err
    assert str(manifest) in err and message in err and "Traceback" not in err


def test_mistyped_campaign_plan_is_refused_naming_file_and_key(tmp_path, capsys, clean_campaign):
    camp = clean_campaign
    edit_json(camp / "campaign.json", lambda c: c["plan"][1].update(base_seed=[1]))
    assert main([str(camp)]) == 2
    err = capsys.readouterr().err
    assert "campaign.json: plan[1].base_seed=[1] is of type list; expected int" in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["plan"][1].update(base_seed=None), "campaign.json: plan[1].base_seed is missing or null"),
        (lambda c: c["plan"][0].pop("repeat"), "campaign.json: plan[0].repeat is missing or null"),
        (lambda c: c.update(baseline="zzz"), "campaign.json: baseline 'zzz' is not one of the campaign's arms"),
    ],
)
def test_a_plan_that_cannot_pair_its_runs_is_refused(capsys, clean_campaign, change, message):
    edit_json(clean_campaign / "campaign.json", change)
    assert main([str(clean_campaign)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_campaign_of_one_arm_says_nothing_is_compared(clean_campaign):
    def one_arm(c):
        c["arms"] = [a for a in c["arms"] if a["name"] == "token"]
        c["plan"] = [r for r in c["plan"] if r["arm"] == "token"]

    edit_json(clean_campaign / "campaign.json", one_arm)
    for run in ("r1-block-100", "r2-block-200"):
        shutil.rmtree(clean_campaign / "runs" / run)
    assert build_report([clean_campaign]).pr.startswith("## golden: `token` alone (no other arm: nothing is compared)")


def test_a_negative_bootstrap_seed_is_refused(capsys, clean_campaign):
    assert main([str(clean_campaign), "--bootstrap-seed", "-1"]) == 2
    assert "--bootstrap-seed must be >= 0, got -1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "workload.items[1].seed_offset=True is a boolean; expected int or null"),
        (2**64, "workload.items[1].seed_offset=18446744073709551616 is out of the 64-bit integer range"),
        (1.5, "workload.items[1].seed_offset=1.5 is of type float; expected int or null"),
        ("7", "workload.items[1].seed_offset='7' is of type str; expected int or null"),
    ],
)
def test_mistyped_workload_item_is_refused_naming_its_index(capsys, clean_campaign, value, message):
    """The item list is checked column-wise first (a campaign lists up to 10^5 items); any doubt falls back to
    the element-wise walk, which names the first bad element."""
    camp = clean_campaign
    edit_json(camp / "campaign.json", lambda c: c["workload"]["items"][1].update(seed_offset=value))
    assert main([str(camp)]) == 2
    assert message in capsys.readouterr().err


def test_missing_manifest_is_named_not_reported_as_a_metadata_mismatch(tmp_path, clean_campaign):
    camp = clean_campaign
    (camp / "runs" / "r1-block-100" / "manifest.json").unlink()
    report = build_report([camp])  # no MismatchError
    runs = check(report, "Runs finished, log checks passed")
    assert runs.status == "fail"
    assert runs.details == ("golden/c1/r1-block-100 (block): runs/r1-block-100/manifest.json is missing",)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**400, "40", [1]])
def test_the_line_by_line_reader_flags_the_same_values(tmp_path, value, clean_campaign):
    camp = clean_campaign
    edit_measured_record(camp, "q1", lambda r: r.update(completion_tokens=value, spec_verify_ct=value))
    report = build_report([camp], force_slow_reader=True)
    readable = check(report, "Records readable")
    assert readable.status == "fail"
    assert [d.split(": ", 1)[1].split("=")[0] for d in readable.details] == ["completion_tokens", "spec_verify_ct"]


def test_unwritable_out_folder_is_refused_with_a_message(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main([str(CLEAN), "--out", str(blocker / "report")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the report to {blocker / 'report'}" in err and "give a writable folder with --out" in err
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").write_text("a file where the figures go")
    assert main([str(CLEAN), "--out", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["figures"]  # exit 2 means nothing written


NO_FIGURE = re.compile(r"\b(nan|inf)\b", re.IGNORECASE)


def figures_are_numbers(camp: Path) -> None:
    """No "nan" or "inf" printed as a figure in report.md or pr.md (the audit may quote a bad value it read:
    "completion_tokens=nan is not finite"); summary.json keeps null for what has no value."""
    for name in ("report.md", "pr.md"):
        lines = [line for line in (camp / name).read_text().splitlines() if "is not finite" not in line]
        shown = [line for line in lines if NO_FIGURE.search(line)]
        assert not shown, (name, shown[:5])
    json.loads((camp / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"summary.json has {c}"))


def every_record(camp: Path, change, arms: tuple[str, ...] | None = None) -> None:
    for path in camp.glob("runs/*/records.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for rec in lines:
            if arms is None or rec["arm"] in arms:
                change(rec)
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def no_drafts(rec: dict) -> None:
    """A speculative request that proposed nothing: an all-zero histogram, spec_num_proposed_drafts 0."""
    meta = rec.get("meta_info") or {}
    if "spec_correct_drafts_histogram" in meta:
        meta.update(
            spec_correct_drafts_histogram=[0] * len(meta["spec_correct_drafts_histogram"]), spec_num_proposed_drafts=0
        )


def test_a_speculative_arm_that_proposed_no_drafts_fails_the_audit(tmp_path, capsys, clean_campaign):
    camp = clean_campaign
    every_record(camp, no_drafts, arms=("block",))
    drafts = check(build_report([camp]), "Speculative arms proposed drafts")
    assert drafts.status == "fail" and len(drafts.details) == 1, drafts
    assert (
        drafts.details[0].startswith("arm block: its 4 used request(s)") and "proposed no drafts" in drafts.details[0]
    )
    assert main([str(camp)]) == 1 and main([str(camp), "--strict"]) == 1
    figures_are_numbers(camp)
    assert "AUDIT FAILED: Speculative arms proposed drafts" in capsys.readouterr().err
    assert "`block`: n/a: no drafts" in (camp / "report.md").read_text()
    assert check(build_report([CLEAN]), "Speculative arms proposed drafts").status == "ok"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_infinity_in_every_record_fails_the_report_and_prints_no_nan(tmp_path, capsys, value, clean_campaign):
    camp = clean_campaign

    def poison(rec: dict) -> None:
        rec.update({k: value for k, v in rec.items() if isinstance(v, int | float) and not isinstance(v, bool)})

    every_record(camp, poison)
    assert main([str(camp)]) == 1  # without --strict: a failed audit is a failed command
    assert "AUDIT FAILED" in capsys.readouterr().err
    figures_are_numbers(camp)
    assert main([str(camp), "--no-strict", "--out", str(tmp_path / "lenient")]) == 0  # the documented opt-out
    assert "; exit 0 (--no-strict)" in capsys.readouterr().err
    assert "Audit: FAILED" in (tmp_path / "lenient" / "report.md").read_text()


def test_the_arm_without_speculation_has_no_per_position_rates(tmp_path, clean_campaign):
    """The baseline `token` made an arm without speculation (NONE, no spec counts): absent from the per-position
    tables and summary.json's rates, named as "n/a: no drafts"; block's rates as before."""
    camp = clean_campaign
    for run in ("r0-token-100", "r3-token-200"):
        edit_json(
            camp / "runs" / run / "manifest.json",
            lambda m: m.update(command=["NONE" if a == "DFLASH" else a for a in m["command"]]),
        )

    def plain(rec: dict) -> None:
        rec.update(spec_verify_ct=None, spec_num_correct_drafts=None)
        if rec.get("meta_info"):
            rec["meta_info"] = {k: v for k, v in rec["meta_info"].items() if not k.startswith("spec_")}

    every_record(camp, plain, arms=("token",))
    assert main([str(camp), "--no-strict"]) in (0, 1)
    doc = json.loads((camp / "summary.json").read_text())["acceptance_by_position"]
    assert list(doc["arms"]) == ["block"] and doc["no_drafts"] == ["token"] and doc["changes"] == {}
    assert None not in doc["arms"]["block"]["rate_by_position"]
    report = (camp / "report.md").read_text()
    section = report[report.index("## Acceptance per draft position") :]
    section = section[: section.index("\n## ", 1)]
    assert "| Position 1 " in section and "| token" not in section and "`token`: n/a: no drafts" in section
    pr = (camp / "pr.md").read_text()
    assert "(`token`: n/a: no drafts)" in pr
    figures_are_numbers(camp)
