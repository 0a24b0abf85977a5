"""`summary.json`: the report's figures as data, for other tools and dashboards (schema: docs/summary.md).

Every value is read from the built `Report` (its numeric tables and its change set), never recomputed, so
the summary, report.md and pr.md cannot disagree. Non-finite numbers are written as null.
"""

from __future__ import annotations

import math
from typing import Any

from analysis import gate as gates
from analysis.model import Report
from analysis.stats import Change
from analysis.tables import labels

SCHEMA = "specbench.summary/1"
SEED_METRICS = ("acceptance_length", "correct_drafts_per_step", "throughput", "decode_tps")
COUNTS = {"score": "correct", "cap_hits": "cap_hits", "errors": "errors", "used": "used"}


def number(x: Any) -> float | None:
    """A finite float, else None (JSON has no NaN)."""
    if x is None:
        return None
    value = float(x)
    return value if math.isfinite(value) else None


def change_doc(c: Change | None) -> dict[str, Any] | None:
    """A change B/A - 1 with its interval, as the report computed it."""
    if c is None:
        return None
    return {
        "estimate": number(c.estimate),
        "lo": number(c.lo),
        "hi": number(c.hi),
        "n": int(c.n),
        "unit": c.unit,
        "p_value": number(c.p_value),
        "significant": bool(c.significant),
        "has_interval": bool(c.has_interval),
        # run pairs with a run taken under foreign load (audit 'Runs taken on a quiet machine'); times may measure
        # other work (0 for changes over items, which pair no runs)
        "foreign_load_pairs": int(c.flagged),
        "foreign_load": bool(c.flagged),
    }


def summary(report: Report) -> dict[str, Any]:
    """The summary document of `report` (JSON-ready)."""
    first = report.data.campaigns[0]
    audit = report.audit
    return {
        "schema": SCHEMA,
        "experiment": first.experiment,
        "campaigns": [
            {"label": c.label, "campaign_id": c.campaign_id, "planned_runs": len(c.plan)} for c in report.data.campaigns
        ],
        "arms": list(report.arms),
        "baseline": report.baseline,
        "declared_difference": first.meta.get("declared_difference") or None,
        "edited_records": report.edited,  # the --allow-edited banner; null when every sealed file is unchanged
        "aa": first.aa,
        "expect": first.expect,
        "output_identity": [i.doc() for i in report.outputs],
        "audit": {
            "passed": bool(audit.passed),
            "checks": len(audit.checks),
            "failed": [c.name for c in audit.failed],
            "warned": [c.name for c in audit.checks if c.status == "warn"],
        },
        "intervals": {"level": 0.95, "bootstrap_resamples": report.n_boot, "seed": report.bootstrap_seed},
        "pooled": pooled(report),
        "counts": counts(report),
        "per_seed": per_seed(report),
        "acceptance_by_position": positions(report),
        "report": "report.md",
        **({"gate": gates.doc(report.gate)} if report.gate is not None else {}),
    }


def pooled(report: Report) -> dict[str, Any]:
    names = labels(report.data.campaigns[0].meta.get("max_new_tokens"))
    frame = report.tables.pooled
    out = {}
    for metric in frame.index:
        if metric not in names or metric in COUNTS:
            continue
        changes = {
            a: change_doc(report.comparison.get("pooled", "all", metric, a))
            for a in report.arms
            if a != report.baseline
        }
        out[str(metric)] = {
            "label": names[metric],
            "values": {a: number(frame.at[metric, a]) for a in report.arms},
            "changes": changes,
        }
    return out


def counts(report: Report) -> dict[str, Any]:
    frame = report.tables.pooled
    out: dict[str, Any] = {}
    for key, row in COUNTS.items():
        out[key] = {a: {"count": int(frame.at[row, a]), "of": int(frame.at["planned", a])} for a in report.arms}
    for a in report.arms:  # a workload without answers has no score
        if frame.at["scored", a] == 0:
            out["score"][a] = None
    return out


def per_seed(report: Report) -> list[dict[str, Any]]:
    rows = []
    for r in report.tables.per_seed.itertuples():
        seed = int(r.base_seed)
        row: dict[str, Any] = {"base_seed": seed, "arm": r.arm, "runs": number(r.runs)}
        row.update({k: number(getattr(r, k)) for k in SEED_METRICS})
        row.update(
            {"correct": int(r.correct), "scored": int(r.scored), "cap_hits": int(r.cap_hits), "planned": int(r.planned)}
        )
        if r.arm != report.baseline:
            row["changes"] = {k: change_doc(report.comparison.get("seed", seed, k, r.arm)) for k in SEED_METRICS}
        rows.append(row)
    return rows


def positions(report: Report) -> dict[str, Any] | None:
    """Acceptance per draft position (None without histograms): per arm with drafts the pooled rates, per other
    arm with drafts the change of each position's rate (when the baseline has drafts), and the arms without
    drafts by name."""
    acc = report.acceptance
    if acc is None:
        return None
    arms = {
        a: {
            "rate_by_position": [number(x) for x in acc.rates[a]],
            "draft_acceptance_rate": number(acc.draft_rate[a]),
            "mean_accepted_per_step": number(acc.mean_accepted[a]),
            "steps_by_accepted": [int(x) for x in acc.histogram[a]],
            "request_al": {k: number(v) for k, v in acc.request_al[a].items()},
        }
        for a in report.arms
        if a in acc.rates
    }
    changes = {a: [change_doc(c) for c in acc.changes[a]] for a in report.arms if a in acc.changes}
    return {"positions": acc.gamma, "arms": arms, "changes": changes, "no_drafts": list(acc.no_drafts)}
