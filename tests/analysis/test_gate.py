"""The regression gate (analysis/gate.py, docs/gate.md): its rules, its verdicts over synthetic comparison figures,
its exit codes, and the CLI's files (JUnit, the CI step summary) on the golden campaigns."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest
from conftest import CLEAN, FIXTURES

from analysis import gate
from analysis.report import main
from analysis.stats import pairs_needed
from harness.contract import GATE_METRICS, parse_gate_rule
from harness.validation import ConfigError

NAN = math.nan


def figures(est: float, lo: float, hi: float, n: int = 8, unit: str = "run pairs", sd: float = 0.05) -> gate.Figures:
    return gate.Figures(est, lo, hi, n, unit, 6, sd)


def verdict(rule: str, f: gate.Figures) -> gate.Verdict:
    return gate.decide(parse_gate_rule(rule), "b", "a", f)


@pytest.mark.parametrize(
    ("text", "metric", "op", "threshold"),
    [
        ("acceptance_length < -1%", "acceptance_length", "<", -0.01),
        ("throughput<-3%", "throughput", "<", -0.03),
        ("  cpu_per_token > +3.5 %  ", "cpu_per_token", ">", 0.035),
        ("ttft_p99 > 10%", "ttft_p99", ">", 0.10),
    ],
)
def test_rules_parse(text, metric, op, threshold):
    rule = parse_gate_rule(text)
    assert (rule.metric, rule.op) == (metric, op) and rule.threshold == pytest.approx(threshold)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("acceptance < -1%", "names metric 'acceptance'"),
        ("throughput < -3", "is not of the form"),
        ("throughput <= -3%", "is not of the form"),
        ("throughput < -100%", "cannot be -100% or less"),
    ],
)
def test_a_bad_rule_is_named_with_the_metrics(text, says):
    with pytest.raises(ValueError) as err:
        parse_gate_rule(text)
    assert says in str(err.value) and repr(text) in str(err.value)
    if "metric" in says or "form" in says:
        assert all(name in str(err.value) for name in GATE_METRICS)


def test_the_gate_metrics_are_changes_the_report_computes():
    from analysis.compare import RATIO_METRICS, RUN_METRICS  # noqa: PLC0415

    assert set(GATE_METRICS) <= set(RATIO_METRICS) | set(RUN_METRICS)


def test_fails_only_when_the_interval_lies_entirely_beyond_the_threshold():
    assert verdict("throughput < -3%", figures(-0.06, -0.08, -0.04)).outcome == "failed"
    assert verdict("throughput < -3%", figures(-0.04, -0.06, -0.01)).outcome == "inconclusive"  # holds -3%
    assert verdict("throughput < -3%", figures(-0.01, -0.02, 0.00)).outcome == "passed"  # above -3% entirely
    assert verdict("throughput < -3%", figures(0.10, 0.05, 0.15)).outcome == "passed"
    assert verdict("cpu_per_token > +3%", figures(0.06, 0.04, 0.08)).outcome == "failed"
    assert verdict("cpu_per_token > +3%", figures(0.03, 0.01, 0.05)).outcome == "inconclusive"
    assert verdict("cpu_per_token > +3%", figures(-0.05, -0.07, -0.03)).outcome == "passed"
    # an A/A of bit-identical acceptance: [0, 0] lies above -1%
    assert verdict("acceptance_length < -1%", figures(0.0, 0.0, 0.0, 16, "items")).outcome == "passed"


def test_a_failure_names_the_metric_interval_and_threshold():
    v = verdict("acceptance_length < -1%", figures(-0.05, -0.07, -0.03, 16, "items"))
    assert v.line() == (
        "FAILED acceptance_length < -1% (b vs a): change -5.00% [95% CI -7.00%, -3.00%] over 16 items "
        "lies entirely below -1.00%"
    )


def test_inconclusive_says_how_many_pairs_would_decide():
    v = verdict("throughput < -3%", figures(-0.02, -0.06, 0.02, sd=0.04))
    expected = pairs_needed(math.expm1(abs(math.log1p(-0.02) - math.log1p(-0.03))), 0.04)
    assert v.outcome == "inconclusive" and f"about {expected} run pairs would decide" in v.why
    few = verdict("throughput < -3%", figures(-0.10, NAN, NAN, n=2, sd=NAN))
    assert few.outcome == "inconclusive"
    assert "no 95% interval from 2 run pairs (it needs at least 6)" in few.why and "at least 3 run pairs" in few.why
    some = verdict("throughput < -3%", figures(-0.10, NAN, NAN, n=4, sd=0.05))
    assert "run pairs would decide" in some.why
    missing = verdict("cpu_per_token > +3%", figures(NAN, NAN, NAN, n=0, sd=NAN))
    assert missing.outcome == "inconclusive" and "not recorded" in missing.why


def test_the_outcome_and_exit_code_order():
    rules = [parse_gate_rule("throughput < -3%"), parse_gate_rule("acceptance_length < -1%")]
    ok, bad, open_ = figures(0.0, -0.005, 0.01), figures(-0.1, -0.12, -0.08), figures(-0.03, -0.05, 0.0)

    def result(t, a, audit=True):
        return gate.evaluate(rules, {("throughput", "b"): t, ("acceptance_length", "b"): a}, "a", audit, ["x"])

    assert (result(ok, ok).outcome, result(ok, ok).exit_code) == ("passed", gate.EXIT_PASSED)
    assert result(open_, ok).exit_code == gate.EXIT_INCONCLUSIVE
    assert result(open_, bad).exit_code == gate.EXIT_GATE_FAILED
    audit = result(ok, ok, audit=False)
    assert audit.outcome == "audit failed" and audit.exit_code == gate.EXIT_AUDIT_FAILED
    assert "the audit failed (x)" in audit.lines()[0]
    codes = {gate.EXIT_PASSED, gate.EXIT_AUDIT_FAILED, gate.EXIT_USAGE, gate.EXIT_GATE_FAILED, gate.EXIT_INCONCLUSIVE}
    assert len(codes) == 5


def test_junit_has_one_case_per_gated_metric():
    rules = [parse_gate_rule("throughput < -3%"), parse_gate_rule("acceptance_length < -1%")]
    figs = {("throughput", "b"): figures(-0.03, -0.05, 0.0), ("acceptance_length", "b"): figures(-0.1, -0.12, -0.08)}
    root = gate.junit(gate.evaluate(rules, figs, "a", True)).getroot()
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "audit",
        "throughput < -3% (b vs a)",
        "acceptance_length < -1% (b vs a)",
    ]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    assert cases[1].find("error") is not None and cases[2].find("failure") is not None
    assert "lies entirely below -1.00%" in cases[2].find("failure").get("message")


def test_experiment_gate_is_checked_at_config_time(run_bench):
    """A bad rule in experiment.gate stops the command before anything runs, naming the rule and the metrics."""
    from configs import composed  # noqa: PLC0415

    assert composed("experiment.gate=['throughput < -3%']").experiment.gate == ["throughput < -3%"]
    with pytest.raises(ConfigError) as err:
        composed("experiment.gate=['throughput < -3%','speed < -3%']")
    assert "experiment.gate[1]" in str(err.value) and "'speed'" in str(err.value) and "cpu_per_token" in str(err.value)
    proc = run_bench("experiment.gate=['speed < -3%']", "dry_run=true")
    assert proc.returncode == 2 and "experiment.gate[0]" in proc.stdout + proc.stderr


# ---------------------------------------------------------------------- the CLI, on the golden campaigns


def test_cli_inconclusive_on_too_few_pairs_writes_junit_and_the_step_summary(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "gate.xml"
    code = main([str(CLEAN), "--out", str(tmp_path / "out"), "--fail-on", "throughput < -3%", "--junit", str(junit)])
    assert code == gate.EXIT_INCONCLUSIVE
    err = capsys.readouterr().err
    assert "gate: INCONCLUSIVE (exit 4)" in err and "no 95% interval from 2 run pairs" in err
    (case,) = [c for c in ElementTree.parse(junit).getroot().iter("testcase") if c.get("name") != "audit"]
    assert case.get("name") == "throughput < -3% (block vs token)" and case.find("error") is not None
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "**Gate: INCONCLUSIVE** (exit 4)" in text
    assert text.count("**Gate:") == 1 and (tmp_path / "out" / "pr.md").read_text() in text
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["gate"]["outcome"] == "inconclusive" and doc["gate"]["rules"][0]["metric"] == "throughput"


def test_cli_a_bad_rule_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(CLEAN), "--fail-on", "speed < -3%"])
    assert exc.value.code == gate.EXIT_USAGE
    err = capsys.readouterr().err
    assert "names metric 'speed'" in err and "cpu_per_token" in err


def test_cli_a_failed_audit_fails_the_gate_even_without_strict(tmp_path, capsys):
    camp = next(p for p in (FIXTURES / "missing_duplicate" / "golden").iterdir() if p.is_dir())
    copy = Path(shutil.copytree(camp, tmp_path / camp.name))
    code = main([str(copy), "--no-strict", "--fail-on", "acceptance_length < -90%"])
    assert code == gate.EXIT_AUDIT_FAILED
    assert "gate: AUDIT FAILED (exit 1)" in capsys.readouterr().err


def test_cli_junit_without_a_rule_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([str(CLEAN), "--junit", str(tmp_path / "x.xml")])
    assert exc.value.code == gate.EXIT_USAGE
