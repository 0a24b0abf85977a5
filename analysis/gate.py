"""The regression gate: `--fail-on 'acceptance_length < -1%'` (and experiment.gate) turned into a verdict a CI job
can act on, from the report's own paired 95% intervals and power figures (docs/gate.md).

A rule `METRIC < T` fails only when the change's interval lies entirely below T (`METRIC > T`: entirely above);
it is inconclusive when the interval holds T, or there is no interval (too few run pairs or items, or the metric
was not recorded), and then says how many run pairs would decide: the pairs a paired t-test on the per-pair log
ratios needs to tell the estimate from the threshold at 80% power, from the run-to-run SD of the power table. It
passes otherwise. A failed audit fails the gate whatever the rules say. Pure: figures in, verdicts out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from xml.etree import ElementTree

import pandas as pd

from analysis.compare import ChangeSet
from analysis.stats import MIN_PAIRS_FOR_SD, POWER, pairs_needed
from harness.contract import GATE_METRICS, GateRule, parse_gate_rule

# the exit status of `specbench-report` (and of the runner with experiment.gate): distinct per outcome
EXIT_PASSED, EXIT_AUDIT_FAILED, EXIT_USAGE, EXIT_GATE_FAILED, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4
Outcome = Literal["passed", "failed", "inconclusive"]

__all__ = ["GATE_METRICS", "GateRule", "parse_gate_rule"]


@dataclass(frozen=True)
class Figures:
    """What a rule reads of one arm's change against the baseline (the report's, never recomputed)."""

    estimate: float  # B/A - 1 (NaN: not recorded)
    lo: float  # the 95% interval (NaN: none)
    hi: float
    n: int  # units the change rests on
    unit: str  # "items" | "run pairs"
    min_n: int  # fewer units than this: no interval
    sd_log_ratio: float  # the run-to-run SD of the per-pair log ratios (power table; NaN: unknown)


@dataclass(frozen=True)
class Verdict:
    rule: GateRule
    arm: str
    baseline: str
    outcome: Outcome
    figures: Figures
    why: str  # the reason in words: where the interval lies, or what is missing and what would decide

    @property
    def name(self) -> str:
        return f"{self.rule} ({self.arm} vs {self.baseline})"

    def line(self) -> str:
        return f"{self.outcome.upper()} {self.name}: {self.why}"


@dataclass(frozen=True)
class GateResult:
    verdicts: list[Verdict]
    audit_passed: bool
    audit_failed: list[str]  # the failed audit checks' names

    @property
    def outcome(self) -> str:
        """audit failed | failed | inconclusive | passed, the first that holds."""
        if not self.audit_passed:
            return "audit failed"
        for outcome in ("failed", "inconclusive"):
            if any(v.outcome == outcome for v in self.verdicts):
                return outcome
        return "passed"

    @property
    def exit_code(self) -> int:
        return {
            "audit failed": EXIT_AUDIT_FAILED,
            "failed": EXIT_GATE_FAILED,
            "inconclusive": EXIT_INCONCLUSIVE,
            "passed": EXIT_PASSED,
        }[self.outcome]

    def lines(self) -> list[str]:
        """The terminal's: the verdict, then one line per rule and arm."""
        head = f"gate: {self.outcome.upper()} (exit {self.exit_code})"
        if not self.audit_passed:
            head += f": the audit failed ({'; '.join(self.audit_failed)}), which fails the gate whatever the figures"
        return [head, *(f"  {v.line()}" for v in self.verdicts)]


def pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def decide(rule: GateRule, arm: str, baseline: str, f: Figures) -> Verdict:
    """One rule on one arm's figures."""
    units = f"{f.n} {f.unit}"
    if not math.isfinite(f.estimate):
        return Verdict(rule, arm, baseline, "inconclusive", f, f"no {rule.metric} figures: not recorded in these runs")
    if not (math.isfinite(f.lo) and math.isfinite(f.hi)):
        why = f"change {pct(f.estimate)} but no 95% interval from {units} (it needs at least {f.min_n}); "
        return Verdict(rule, arm, baseline, "inconclusive", f, why + to_decide(rule, f))
    interval = f"change {pct(f.estimate)} [95% CI {pct(f.lo)}, {pct(f.hi)}] over {units}"
    below, above = f.hi < rule.threshold, f.lo > rule.threshold
    side = "below" if rule.op == "<" else "above"
    if (rule.op == "<" and below) or (rule.op == ">" and above):
        return Verdict(rule, arm, baseline, "failed", f, f"{interval} lies entirely {side} {pct(rule.threshold)}")
    if below or above:  # entirely on the good side
        good = "above" if rule.op == "<" else "below"
        return Verdict(rule, arm, baseline, "passed", f, f"{interval} lies entirely {good} {pct(rule.threshold)}")
    why = f"{interval} holds the threshold {pct(rule.threshold)}; {to_decide(rule, f)}"
    return Verdict(rule, arm, baseline, "inconclusive", f, why)


def to_decide(rule: GateRule, f: Figures) -> str:
    """How many run pairs would decide: a paired t-test telling the estimate from the threshold at POWER, from the
    run-to-run SD of the per-pair log ratios (the power table's)."""
    if not math.isfinite(f.sd_log_ratio):
        return f"pairs to decide: unknown (the run-to-run SD needs at least {MIN_PAIRS_FOR_SD} run pairs)"
    gap = abs(math.log1p(f.estimate) - math.log1p(rule.threshold))
    n = pairs_needed(math.expm1(gap), f.sd_log_ratio) if gap > 0 else None
    sd = f"run-to-run SD {f.sd_log_ratio * 100:.2f}%"
    if n is None:
        return f"pairs to decide: beyond reach (the estimate sits at the threshold; {sd})"
    return f"about {n} run pairs would decide ({POWER:.0%} power, {sd})"


def evaluate(
    rules: Sequence[GateRule],
    figures: dict[tuple[str, str], Figures],
    baseline: str,
    audit_passed: bool,
    audit_failed: Sequence[str] = (),
) -> GateResult:
    """Every rule on every arm of `figures` ((metric, arm) -> Figures; arms in the order given)."""
    arms = list(dict.fromkeys(arm for _, arm in figures))
    missing = Figures(math.nan, math.nan, math.nan, 0, "run pairs", 0, math.nan)
    verdicts = [decide(r, a, baseline, figures.get((r.metric, a), missing)) for r in rules for a in arms]
    return GateResult(verdicts, audit_passed, list(audit_failed))


def figures_from(
    rules: Sequence[GateRule], changes: ChangeSet, power: pd.DataFrame, arms: Sequence[str], baseline: str
) -> dict[tuple[str, str], Figures]:
    """The figures the rules read: the pooled change of each non-baseline arm, and its power-table SD."""
    sds = {(str(r.metric), str(r.arm)): float(r.sd_log_ratio) for r in power.itertuples()}
    out = {}
    for metric in dict.fromkeys(r.metric for r in rules):
        for arm in arms:
            if arm == baseline:
                continue
            c = changes.get("pooled", "all", metric, arm)
            if c is None:
                out[(metric, arm)] = Figures(math.nan, math.nan, math.nan, 0, "run pairs", 0, math.nan)
                continue
            sd = sds.get((metric, arm), math.nan)
            out[(metric, arm)] = Figures(c.estimate, c.lo, c.hi, c.n, c.unit, c.min_n, sd)
    return out


def markdown(result: GateResult) -> list[str]:
    """pr.md's gate section (and the CI step summary's)."""
    icon = {"passed": "passed", "failed": "**FAILED**", "inconclusive": "inconclusive"}
    out = [
        f"**Gate: {result.outcome.upper()}** (exit {result.exit_code})"
        + (f": the audit failed ({'; '.join(result.audit_failed)})." if not result.audit_passed else "."),
        "",
    ]
    out += [f"- {icon[v.outcome]}: `{v.rule}` ({v.arm} vs {v.baseline}): {v.why}" for v in result.verdicts]
    return out


def junit(result: GateResult, suite: str = "specbench gate") -> ElementTree.ElementTree:
    """One JUnit test case per gated metric and arm (and one for the audit): failed -> <failure>, inconclusive ->
    <error> (CI must not read it as a pass)."""
    cases = [("audit", "passed" if result.audit_passed else "failed", "; ".join(result.audit_failed) or "passed")]
    cases += [(v.name, v.outcome, v.why) for v in result.verdicts]
    root = ElementTree.Element("testsuites", name=suite)
    tests = ElementTree.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(sum(o == "failed" for _, o, _ in cases)),
        errors=str(sum(o == "inconclusive" for _, o, _ in cases)),
        skipped="0",
    )
    for name, outcome, why in cases:
        case = ElementTree.SubElement(tests, "testcase", classname="specbench.gate", name=name)
        if outcome == "failed":
            ElementTree.SubElement(case, "failure", message=why, type="gate failed").text = why
        elif outcome == "inconclusive":
            ElementTree.SubElement(case, "error", message=why, type="inconclusive").text = why
        else:
            ElementTree.SubElement(case, "system-out").text = why
    ElementTree.indent(root)
    return ElementTree.ElementTree(root)


def doc(result: GateResult) -> dict:
    """summary.json's `gate`."""
    return {
        "outcome": result.outcome,
        "exit_code": result.exit_code,
        "audit_passed": result.audit_passed,
        "rules": [
            {
                "rule": str(v.rule),
                "metric": v.rule.metric,
                "arm": v.arm,
                "outcome": v.outcome,
                "estimate": _num(v.figures.estimate),
                "lo": _num(v.figures.lo),
                "hi": _num(v.figures.hi),
                "n": v.figures.n,
                "unit": v.figures.unit,
                "why": v.why,
            }
            for v in result.verdicts
        ],
    }


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None
