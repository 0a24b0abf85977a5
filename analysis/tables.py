"""The report's tables, as numeric DataFrames (for code and tests) and as display strings.

Shapes follow `shared/reference/block-verification-ab.md`: a pooled table (metric | arm ... | change
of each arm against the baseline, with its 95% interval), a per-seed table, a per-category table
where items have categories, and a per-run table with the server's own lifetime figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.compare import RATIO_METRICS, RUN_METRICS, Comparison, pooled_run_value
from analysis.metrics import PERCENTILES, Metrics
from analysis.stats import Change

DECIMALS = {
    "acceptance_length": 4, "al_request_mean": 4, "correct_drafts_per_step": 4, "throughput": 2,
    "decode_tps": 2, **{f"ttft_p{p}": 1 for p in PERCENTILES}, **{f"e2e_p{p}": 3 for p in PERCENTILES},
}
SCALE = {f"ttft_p{p}": 1000.0 for p in PERCENTILES}  # TTFT shown in milliseconds


def labels(max_new_tokens: object) -> dict[str, str]:
    cap = f"{int(max_new_tokens):,}-token cap" if isinstance(max_new_tokens, int | float) else "token cap"
    out = {
        "acceptance_length": "Acceptance length (includes bonus)",
        "al_request_mean": "Acceptance length, request-weighted mean (secondary)",
        "correct_drafts_per_step": "Correct drafts per verify step",
        "throughput": "Output throughput (tokens/s)",
        "decode_tps": "Decode tok/s (mean request rate x concurrency)",
    }
    out.update({f"ttft_p{p}": f"TTFT p{p} (ms)" for p in PERCENTILES})
    out.update({f"e2e_p{p}": f"End-to-end latency p{p} (s)" for p in PERCENTILES})
    out.update({
        "score": "Boxed score over entire response",
        "cap_hits": f"Responses hitting the {cap}",
        "errors": "Errored requests",
        "used": "Requests used / planned",
    })
    return out


@dataclass
class Tables:
    pooled: pd.DataFrame  # numeric: index metric key, one column per arm
    pooled_display: pd.DataFrame
    per_seed: pd.DataFrame  # numeric, long: base_seed, arm, metrics
    per_seed_display: pd.DataFrame
    per_category: pd.DataFrame | None
    per_category_display: pd.DataFrame | None
    per_run: pd.DataFrame
    per_run_display: pd.DataFrame
    changes: pd.DataFrame  # every change: partition, group, metric, arm, estimate, lo, hi, p_value, ...
    footnotes: list[str]


# ---------------------------------------------------------------------------------------------
# formatting


def fmt_num(x: float, decimals: int) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:,.{decimals}f}"


def fmt_pct(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    value = round(x * 100, 2)
    return f"{value + 0.0 if value else 0.0:+.2f}%"  # no "-0.00%"


def fmt_change(c: Change | None) -> str:
    if c is None or not math.isfinite(c.estimate):
        return "n/a"
    text = fmt_pct(c.estimate)
    if c.has_interval:
        text += f" [{fmt_pct(c.lo)}, {fmt_pct(c.hi)}]"
    else:
        unit = c.unit if c.n != 1 else c.unit.rstrip("s")
        text += f" (no interval: {c.n} {unit})"
    if c.p_value is not None and c.has_interval:
        text += f" p={c.p_value:.3g}" + ("\u2020" if c.too_few_pairs else "")
    if not c.significant:
        text += " not significant"
    return text


def fmt_count(k: int, n: int, applicable: bool = True) -> str:
    return f"{k}/{n}" if applicable else "n/a"


# ---------------------------------------------------------------------------------------------
# pooled


def build(m: Metrics, comp: Comparison, max_new_tokens: object, multi_campaign: bool) -> Tables:
    names = labels(max_new_tokens)
    pooled = pooled_numeric(m)
    footnotes = _footnotes(m, comp)
    per_seed = per_seed_numeric(m)
    per_cat = per_category_numeric(m) if "category" in m.partitions else None
    return Tables(
        pooled=pooled,
        pooled_display=pooled_display(m, comp, pooled, names),
        per_seed=per_seed,
        per_seed_display=per_seed_display(m, comp, per_seed),
        per_category=per_cat,
        per_category_display=per_category_display(m, comp, per_cat) if per_cat is not None else None,
        per_run=m.runs,
        per_run_display=per_run_display(m, multi_campaign),
        changes=comp.frame(),
        footnotes=footnotes,
    )


def _outcome(m: Metrics, partition: str, group: object) -> pd.DataFrame:
    o = m.outcomes
    return o[(o["partition"] == partition) & (o["group"] == group)].set_index("arm").reindex(m.arms)


def _ratio(m: Metrics, partition: str, group: object) -> pd.DataFrame:
    r = m.ratios
    return r[(r["partition"] == partition) & (r["group"] == group)].set_index("arm").reindex(m.arms)


def pooled_numeric(m: Metrics) -> pd.DataFrame:
    ratio, out = _ratio(m, "pooled", "all"), _outcome(m, "pooled", "all")
    rows: dict[str, list[float]] = {k: ratio[k].tolist() for k in RATIO_METRICS}
    for metric in RUN_METRICS:
        rows[metric] = [pooled_run_value(m.runs, a, metric) * SCALE.get(metric, 1.0) for a in m.arms]
    for key in ("correct", "scored", "cap_hits", "errors", "used", "planned"):
        rows[key] = out[key].astype(float).tolist()
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=m.arms)
    frame.index.name = "metric"
    return frame


def pooled_display(m: Metrics, comp: Comparison, pooled: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    others = [a for a in m.arms if a != m.baseline]
    cols = ["Metric", *[_arm_title(m, a) for a in m.arms], *[f"Change {a} vs {m.baseline} [95% CI]" for a in others]]
    rows = []
    for metric in [*RATIO_METRICS, *RUN_METRICS]:
        values = [fmt_num(pooled.at[metric, a], DECIMALS[metric]) for a in m.arms]
        changes = [fmt_change(comp.get("pooled", "all", metric, a)) for a in others]
        rows.append([names[metric], *values, *changes])
    for key, num in (("score", "correct"), ("cap_hits", "cap_hits"), ("errors", "errors"), ("used", "used")):
        values = [_count_cell(pooled, key, num, a) for a in m.arms]
        rows.append([names[key], *values, *[""] * len(others)])
    return pd.DataFrame(rows, columns=cols)


def _count_cell(pooled: pd.DataFrame, key: str, num: str, arm: str) -> str:
    applicable = key != "score" or pooled.at["scored", arm] > 0
    return fmt_count(int(pooled.at[num, arm]), int(pooled.at["planned", arm]), applicable)


def _arm_title(m: Metrics, arm: str) -> str:
    return f"{arm} (baseline)" if arm == m.baseline else arm


def _footnotes(m: Metrics, comp: Comparison) -> list[str]:
    notes = []
    for arm in m.arms:
        c = comp.get("pooled", "all", "throughput", arm)
        if c is None:
            continue
        if c.too_few_pairs:
            notes.append(
                f"\u2020 {arm} vs {m.baseline}: {c.n} run pair(s); an exact sign-flip test over {c.n} pairs "
                f"cannot give a p-value below {c.min_p:.3g}, so no per-run change (throughput, decode tok/s, "
                f"latency) can be significant at 0.05 here. More seeds or repeats are needed."
            )
        elif c.p_value is not None and not c.exact:
            notes.append(f"{arm} vs {m.baseline}: {c.n} run pairs; p-values from random sign flips.")
    if m.concurrency_note:
        notes.append(f"Decode tok/s: {m.concurrency_note}.")
    return notes


# ---------------------------------------------------------------------------------------------
# per seed, per category, per run


def per_seed_numeric(m: Metrics) -> pd.DataFrame:
    r = m.ratios[m.ratios["partition"] == "seed"][["group", "arm", "acceptance_length", "correct_drafts_per_step"]]
    o = m.outcomes[m.outcomes["partition"] == "seed"][["group", "arm", "correct", "scored", "cap_hits", "planned"]]
    out = r.merge(o, on=["group", "arm"]).rename(columns={"group": "base_seed"})
    sr = m.seed_runs[["base_seed", "arm", "throughput", "decode_tps", "runs"]].copy()
    sr["base_seed"] = sr["base_seed"].astype(int)
    out["base_seed"] = out["base_seed"].astype(int)
    return out.merge(sr, on=["base_seed", "arm"], how="left").sort_values(["base_seed", "arm"]).reset_index(drop=True)


def per_seed_display(m: Metrics, comp: Comparison, ps: pd.DataFrame) -> pd.DataFrame:
    others = [a for a in m.arms if a != m.baseline]
    rows = []
    for seed in m.partitions["seed"].labels:
        sub = ps[ps["base_seed"] == seed].set_index("arm").reindex(m.arms)
        row = {"Seed": str(seed)}
        row.update({f"{a} AL": fmt_num(sub.at[a, "acceptance_length"], 4) for a in m.arms})
        row.update({f"{a} tok/s": fmt_num(sub.at[a, "throughput"], 2) for a in m.arms})
        row.update({f"{a} correct": _seed_count(sub, a) for a in m.arms})
        for a in others:
            row[f"AL change {a} [95% CI]"] = fmt_change(comp.get("seed", seed, "acceptance_length", a))
            row[f"tok/s change {a}"] = fmt_change(comp.get("seed", seed, "throughput", a))
        rows.append(row)
    return pd.DataFrame(rows)


def _seed_count(sub: pd.DataFrame, arm: str) -> str:
    scored = sub.at[arm, "scored"]
    if not np.isfinite(scored) or scored == 0:
        return "n/a"
    return fmt_count(int(sub.at[arm, "correct"]), int(sub.at[arm, "planned"]))


def per_category_numeric(m: Metrics) -> pd.DataFrame:
    r = m.ratios[m.ratios["partition"] == "category"][
        ["group", "arm", "requests", "acceptance_length", "correct_drafts_per_step"]]
    o = m.outcomes[m.outcomes["partition"] == "category"][["group", "arm", "correct", "scored", "planned"]]
    return r.merge(o, on=["group", "arm"]).rename(columns={"group": "category"}).reset_index(drop=True)


def per_category_display(m: Metrics, comp: Comparison, pc: pd.DataFrame) -> pd.DataFrame:
    others = [a for a in m.arms if a != m.baseline]
    rows = []
    for cat in m.partitions["category"].labels:
        sub = pc[pc["category"] == cat].set_index("arm").reindex(m.arms)
        row = {"Category": str(cat), "Requests": str(int(sub["planned"].sum()))}
        row.update({f"{a} AL": fmt_num(sub.at[a, "acceptance_length"], 4) for a in m.arms})
        row.update({f"{a} drafts/step": fmt_num(sub.at[a, "correct_drafts_per_step"], 4) for a in m.arms})
        row.update({f"{a} correct": _seed_count(sub, a) for a in m.arms})
        for a in others:
            row[f"AL change {a} [95% CI]"] = fmt_change(comp.get("category", cat, "acceptance_length", a))
        rows.append(row)
    return pd.DataFrame(rows)


def per_run_display(m: Metrics, multi_campaign: bool) -> pd.DataFrame:
    r = m.runs.sort_values(["campaign", "order", "run_id"], kind="stable")
    out = pd.DataFrame({
        **({"Campaign": r["campaign"]} if multi_campaign else {}),
        "Run": r["run_id"],
        "Arm": r["arm"],
        "Seed": r["base_seed"].astype(str),
        "Repeat": r["repeat"].astype(str),
        "Requests": r["used"].astype(int).astype(str),
        "AL (recomputed)": [fmt_num(x, 4) for x in r["acceptance_length"]],
        "AL (server, lifetime)": [fmt_num(x, 4) for x in r["server_accept_length"].astype(float)],
        "tok/s": [fmt_num(x, 2) for x in r["throughput"]],
        "Window (s)": [fmt_num(x, 2) for x in r["window_s"]],
        "Decode tok/s": [fmt_num(x, 2) for x in r["decode_tps"]],
        "TTFT p50 (ms)": [fmt_num(x * 1000, 1) for x in r["ttft_p50"]],
        "E2E p50 (s)": [fmt_num(x, 3) for x in r["e2e_p50"]],
    })
    return out.reset_index(drop=True)
