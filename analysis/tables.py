"""The report's tables, as numeric DataFrames (for code and tests) and as display strings.

Shapes follow the seed experiments' published tables: a pooled table (metric | arm ... | change
of each arm against the baseline, with its 95% interval), a per-seed table, a per-category table
where items have categories, and a per-run table with the server's own lifetime figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.compare import RATIO_METRICS, RUN_METRICS, ChangeSet, pooled_run_value
from analysis.itl import PERCENTILES
from analysis.metrics import LATENCIES, MIN_PERCENTILE_VALUES, Metrics
from analysis.stats import Change

_MS = ("ttft", "itl", "tpot")  # shown in milliseconds
DECIMALS = {
    "acceptance_length": 4,
    "al_request_mean": 4,
    "correct_drafts_per_step": 4,
    "throughput": 2,
    "decode_tps": 2,
    "decode_rate_mean": 2,
    "cpu_per_token": 3,
    "queue_mean": 1,
    "queue_p99": 1,
    **{f"{f}_p{p}": 1 if f == "ttft" else 2 if f in _MS else 3 for f in LATENCIES for p in PERCENTILES},
}
SCALE = {
    **{f"{f}_p{p}": 1000.0 for f in _MS for p in PERCENTILES},
    "queue_mean": 1000.0,
    "queue_p99": 1000.0,
    "cpu_per_token": 1000.0,
}
QUEUE_METRICS = ("queue_mean", "queue_p99")


def labels(max_new_tokens: object) -> dict[str, str]:
    cap = f"{int(max_new_tokens):,}-token cap" if isinstance(max_new_tokens, int | float) else "token cap"
    out = {
        "acceptance_length": "Acceptance length (includes bonus)",
        "al_request_mean": "Acceptance length, request-weighted mean (secondary)",
        "correct_drafts_per_step": "Correct drafts per verify step",
        "throughput": "Output throughput (tokens/s)",
        "decode_tps": "Decode throughput, measured (tokens/s while any stream decodes)",
        "decode_rate_mean": "Per-request decode rate, mean (tokens/s, secondary)",
        "cpu_per_token": "Server CPU time per output token (ms, user+sys of its process tree)",
        "queue_mean": "Client queueing time, mean (ms)",
        "queue_p99": "Client queueing time p99 (ms)",
    }
    out.update({f"ttft_p{p}": f"TTFT p{p} (ms)" for p in PERCENTILES})
    out.update({f"e2e_p{p}": f"End-to-end latency p{p} (s)" for p in PERCENTILES})
    out.update({f"itl_p{p}": f"ITL p{p} (ms)" for p in PERCENTILES})
    out.update({f"tpot_p{p}": f"TPOT p{p} (ms)" for p in PERCENTILES})
    out.update(
        {
            "score": "Boxed score over entire response",
            "cap_hits": f"Responses hitting the {cap}",
            "errors": "Errored requests",
            "used": "Requests used / planned",
        }
    )
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
    if c.unit == "run pairs":
        return text + _run_pairs_tail(c)
    if c.has_interval:
        text += f" [{fmt_pct(c.lo)}, {fmt_pct(c.hi)}]"
        return text + ("" if c.significant else " not significant")
    unit = c.unit if c.n != 1 else c.unit.rstrip("s")
    if c.below_minimum:
        return text + f" (no interval: {c.n} {unit}, fewer than {c.min_n})"
    return text + f" (no interval: {c.n} {unit})"


def _run_pairs_tail(c: Change) -> str:
    pairs = f"{c.n} pair" + ("s" if c.n != 1 else "")
    if c.has_interval:
        text = f" [{fmt_pct(c.lo)}, {fmt_pct(c.hi)}] sign-flip p={c.p_value:.3g}" + (
            "" if c.exact else " (random flips)"
        )
        text += "" if c.significant else " not significant"
    elif c.n >= 2:
        text = f" (range of pair ratios [{fmt_pct(c.range_lo)}, {fmt_pct(c.range_hi)}], {pairs}, no interval)"
    else:
        text = f" ({pairs}, no interval)"
    if c.flagged:
        text += f"; {c.flagged} of {c.n} pairs under foreign load"
    return text


def fmt_pairs(n: Any, lo: Any = None, hi: Any = None) -> str:
    """Run pairs needed, with the range that the SD's own 95% interval gives (an SD from few pairs is
    itself uncertain: from 3 pairs, by a factor of about 0.3 to 40 in pairs)."""

    def one(x: Any) -> str:
        return "more than 100,000" if x is None or x != x else f"{int(x):,}"

    text = one(n)
    if lo is None and hi is None:
        return text
    return f"{text} (95%: {one(lo)} to {one(hi)})"


def fmt_count(k: int, n: int, applicable: bool = True) -> str:
    return f"{k}/{n}" if applicable else "n/a"


# ---------------------------------------------------------------------------------------------
# pooled


def build(m: Metrics, comp: ChangeSet, max_new_tokens: object, multi_campaign: bool) -> Tables:
    names = labels(max_new_tokens)
    pooled = pooled_numeric(m)
    footnotes = _footnotes(m, comp, pooled)
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
    """Pooled values: ratios of sums over requests, throughputs as sums over runs, percentiles over all
    used requests (ITL: tokens) of the arm; times in the display unit (ms or s)."""
    ratio, out = _ratio(m, "pooled", "all"), _outcome(m, "pooled", "all")
    rows: dict[str, list[float]] = {k: ratio[k].tolist() for k in RATIO_METRICS}
    for metric in shown_runs(m):
        if metric in m.pooled_latency.index:
            rows[metric] = [float(m.pooled_latency.at[metric, a]) * SCALE.get(metric, 1.0) for a in m.arms]
        elif metric == "decode_rate_mean":
            rate, arm = m.requests["decode_rate"].to_numpy(), m.requests["arm"].to_numpy()
            rows[metric] = [_mean(rate[arm == i]) for i in range(len(m.arms))]
        else:
            rows[metric] = [pooled_run_value(m.runs, a, metric) * SCALE.get(metric, 1.0) for a in m.arms]
    for metric in QUEUE_METRICS:
        rows[metric] = [float(m.pooled_latency.at[metric, a]) * SCALE[metric] for a in m.arms]
    for key in ("correct", "scored", "cap_hits", "errors", "used", "planned"):
        rows[key] = out[key].astype(float).tolist()
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=m.arms)
    frame.index.name = "metric"
    return frame


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _family(metric: str) -> str | None:
    head = metric.rsplit("_p", 1)[0]
    return head if head in LATENCIES and metric != head else None


def _shown_metrics(m: Metrics) -> list[str]:
    """Rows of the pooled table: ITL only with chunk timings, queueing time only in open loop."""
    shown = [
        *RATIO_METRICS,
        *[
            k
            for k in RUN_METRICS
            if (_family(k) != "itl" or m.pooled_counts.loc["itl"].sum() > 0) and k in shown_runs(m)
        ],
    ]
    return shown + (list(QUEUE_METRICS) if m.open_loop else [])


def has_server_cpu(m: Metrics) -> bool:
    """Whether any run recorded its server's CPU time (manifest server_cpu, since 2026-12-06)."""
    return bool(np.isfinite(m.runs["server_cpu_s"].to_numpy(float)).any()) if len(m.runs) else False


def shown_runs(m: Metrics) -> list[str]:
    """The per-run metrics the tables show: the server's CPU time only where it was recorded."""
    return [k for k in RUN_METRICS if k != "cpu_per_token" or has_server_cpu(m)]


def marked_cells(m: Metrics, pooled: pd.DataFrame) -> bool:
    """Whether any shown percentile cell is marked (n=...): a percentile from too few values."""
    return any("(n=" in value_cell(m, pooled, metric, a) for metric in _shown_metrics(m) for a in m.arms)


def value_cell(m: Metrics, pooled: pd.DataFrame, metric: str, arm: str) -> str:
    """A pooled value; a percentile over fewer than MIN_PERCENTILE_VALUES values says how many."""
    text = fmt_num(pooled.at[metric, arm], DECIMALS[metric])
    family = _family(metric) or ("queue" if metric == "queue_p99" else None)
    if family and text != "n/a":
        n = int(m.pooled_counts.at[family, arm])
        if n < MIN_PERCENTILE_VALUES:
            text += f" (n={n})"
    return text


def pooled_display(m: Metrics, comp: ChangeSet, pooled: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    others = [a for a in m.arms if a != m.baseline]
    cols = ["Metric", *[_arm_title(m, a) for a in m.arms], *[f"Change {a} vs {m.baseline} [95% CI]" for a in others]]
    rows = []
    for metric in _shown_metrics(m):
        values = [value_cell(m, pooled, metric, a) for a in m.arms]
        changes = [
            fmt_change(comp.get("pooled", "all", metric, a)) if metric not in QUEUE_METRICS else "-" for a in others
        ]
        if _family(metric):  # a percentile: the change is over per-run percentiles; show the columns' too
            base = pooled.at[metric, m.baseline]
            changes = [
                f"{text}; pooled columns {fmt_pct(pooled.at[metric, a] / base - 1) if base else 'n/a'}"
                for text, a in zip(changes, others, strict=True)
            ]
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


def _footnotes(m: Metrics, comp: ChangeSet, pooled: pd.DataFrame) -> list[str]:
    notes = []
    for arm in m.arms:
        c = comp.get("pooled", "all", "throughput", arm)
        if c is None:
            continue
        if c.n == 0:
            notes.append(
                f"{arm} vs {m.baseline}: no run pair has a measured window (no finished run with "
                "output in both arms): no per-run change."
            )
        elif c.n < c.min_n:
            notes.append(
                f"{arm} vs {m.baseline}: {c.n} run pair(s), fewer than {c.min_n}: per-run changes (throughput, "
                f"decode throughput, latency percentiles) show the geometric mean and the range of the pair ratios, "
                f"no interval; an exact sign-flip test over {c.n} pairs cannot give p below {c.min_p:.3g}. "
                f"More seeds or repeats are needed."
            )
        elif c.p_value is not None and not c.exact:
            notes.append(f"{arm} vs {m.baseline}: {c.n} run pairs; p-values from random sign flips.")
    flagged = m.runs[m.runs["foreign_load"].to_numpy(bool)]
    if len(flagged):
        notes.append(
            f"**{len(flagged)} of {len(m.runs)} runs were taken under foreign load** (see the audit check "
            "'Runs taken on a quiet machine' and the per-run 'Foreign CPU' column): the throughput and "
            "latency changes of pairs holding them may measure that other work, not the arms."
        )
    if marked_cells(m, pooled):
        notes.append(
            f"A percentile marked (n=...) comes from fewer than {MIN_PERCENTILE_VALUES} values and is "
            "a rough estimate (a p99 over fewer than 100 values is close to the maximum)."
        )
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


def per_seed_display(m: Metrics, comp: ChangeSet, ps: pd.DataFrame) -> pd.DataFrame:
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
        ["group", "arm", "requests", "acceptance_length", "correct_drafts_per_step"]
    ]
    o = m.outcomes[m.outcomes["partition"] == "category"][["group", "arm", "correct", "scored", "planned"]]
    return r.merge(o, on=["group", "arm"]).rename(columns={"group": "category"}).reset_index(drop=True)


def per_category_display(m: Metrics, comp: ChangeSet, pc: pd.DataFrame) -> pd.DataFrame:
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


def foreign_cell(r: Any) -> str:
    """The share of all CPUs other processes used during the run, flagged when it counts as foreign load.
    `r`: a row of the runs table, from DataFrame.itertuples()."""
    if not r.machine_recorded:
        return "not recorded"
    frac = r.cpu_other_frac
    text = "n/a" if not math.isfinite(frac) else f"{frac * 100:.1f}%"
    return text + (" FLAGGED" if r.foreign_load else "")


def per_run_display(m: Metrics, multi_campaign: bool) -> pd.DataFrame:
    r = m.runs.sort_values(["campaign", "order", "run_id"], kind="stable")
    server_al = [
        fmt_num(x, 4) if x is not None and math.isfinite(x) else "n/a" for x in r["server_accept_length"].astype(float)
    ]
    out = pd.DataFrame(
        {
            **({"Campaign": r["campaign"]} if multi_campaign else {}),
            "Run": r["run_id"],
            "Arm": r["arm"],
            "Seed": r["base_seed"].astype(str),
            "Repeat": r["repeat"].astype(str),
            "Requests": r["used"].astype(int).astype(str),
            "AL (recomputed)": [fmt_num(x, 4) for x in r["acceptance_length"]],
            "AL (server, lifetime)": server_al,
            "tok/s": [fmt_num(x, 2) for x in r["throughput"]],
            "Window (s)": [fmt_num(x, 2) for x in r["window_s"]],
            "Decode tok/s (measured)": [fmt_num(x, 2) for x in r["decode_tps"]],
            "TTFT p50 (ms)": [fmt_num(x * 1000, 1) for x in r["ttft_p50"]],
            "E2E p50 (s)": [fmt_num(x, 3) for x in r["e2e_p50"]],
            "Foreign CPU": [foreign_cell(x) for x in r.itertuples()],
        }
    )
    return out.reset_index(drop=True)
