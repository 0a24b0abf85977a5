"""Changes of each arm against the baseline, with their intervals, and the power table.

- Ratio-of-sums metrics (acceptance length, correct drafts per step, the request-weighted mean AL):
  a paired bootstrap over items: each resample draws items with replacement and keeps all of an item's
  requests (every arm, seed and repeat) together; pooled and per-seed changes share the resamples.
  Per-category changes resample within the category (stratified). No interval below MIN_ITEMS items.
- Per-run metrics (throughput, decode throughput, the server's CPU time per output token, latency percentiles): runs are paired by campaign,
  base seed and repeat; the change is the geometric mean of the pair ratios, with a t-interval on the
  log ratios from MIN_PAIRS pairs (below: the range of the pair ratios) and an exact sign-flip p-value.
- Power: pairs needed to detect 1%, 2% and 5% at 80% power from the per-pair log-ratio SD.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from analysis.itl import PERCENTILES
from analysis.metrics import LATENCIES, Metrics, RequestTables
from analysis.stats import (
    ALPHA,
    MIN_PAIRS,
    MIN_PAIRS_FOR_SD,
    POWER,
    Change,
    bootstrap_sums,
    item_change,
    pair_log_ratios,
    paired_change,
    pairs_needed,
    sd_interval,
)

# quantities summed per item for each partition, and the ratio metrics built from them
_QUANTITIES = {
    "pooled": ("tokens", "verify_steps", "correct_drafts", "al_sum", "requests"),
    "seed": ("tokens", "verify_steps"),
    "category": ("tokens", "verify_steps", "correct_drafts"),
}
RATIO_METRICS = {
    "acceptance_length": ("tokens", "verify_steps"),
    "al_request_mean": ("al_sum", "requests"),
    "correct_drafts_per_step": ("correct_drafts", "verify_steps"),
}
# per-run metrics: (numerator column, denominator column or None for a plain per-run value)
RUN_METRICS = {
    "throughput": ("tokens", "window_s"),
    "decode_tps": ("decode_tokens", "decode_span_s"),
    "decode_rate_mean": ("decode_rate_mean", None),
    "cpu_per_token": ("server_cpu_s", "tokens"),
    **{f"{f}_p{p}": (f"{f}_p{p}", None) for f in LATENCIES for p in PERCENTILES},
}
POWER_METRICS = {
    "throughput": ("tokens", "window_s"),
    "decode_tps": ("decode_tokens", "decode_span_s"),
    "acceptance_length": ("acceptance_length", None),
    "cpu_per_token": ("server_cpu_s", "tokens"),
}
POWER_CHANGES = (0.01, 0.02, 0.05)
PAIR_KEYS = ["campaign_id", "base_seed", "repeat"]

ChangeKey = tuple[str, object, str, str]  # (partition, group, metric, arm)


@dataclass
class ChangeSet:
    changes: dict[ChangeKey, Change]

    def get(self, partition: str, group: object, metric: str, arm: str) -> Change | None:
        return self.changes.get((partition, group, metric, arm))

    def frame(self) -> pd.DataFrame:
        rows = [
            {"partition": k[0], "group": k[1], "metric": k[2], "arm": k[3], **asdict(c), "significant": c.significant}
            for k, c in self.changes.items()
        ]
        return pd.DataFrame(rows)


def compare(m: Metrics, n_boot: int, bootstrap_seed: int, items: dict[ChangeKey, Change] | None = None) -> ChangeSet:
    """Every change; `items`: item_based(m, n_boot, bootstrap_seed) when already computed (from the request tables alone)."""
    changes = dict(item_based(m, n_boot, bootstrap_seed) if items is None else items)
    changes.update(run_changes(m, bootstrap_seed))
    return ChangeSet(changes)


def item_based(t: RequestTables, n_boot: int, bootstrap_seed: int) -> dict[ChangeKey, Change]:
    """The ratio metrics' changes (bootstraps over items): they need the request tables only."""
    matrix, layouts, _ = item_matrix(t)
    changes = item_changes(t, matrix, layouts, n_boot, np.random.default_rng([bootstrap_seed, 0]))
    changes.update(category_changes(t, matrix, layouts, n_boot, bootstrap_seed))
    return changes


# ---------------------------------------------------------------------------------------------
# ratio metrics: bootstrap over items


@dataclass(frozen=True)
class _Layout:
    offset: int
    quantities: tuple[str, ...]
    n_arms: int

    def col(self, group: int, arm: int, quantity: str) -> int:
        q = len(self.quantities)
        return self.offset + (group * self.n_arms + arm) * q + self.quantities.index(quantity)


def item_matrix(m: RequestTables) -> tuple[np.ndarray, dict[str, _Layout], np.ndarray]:
    """Per-item sums [items, columns]; the column layout per partition; items present per column group."""
    req = m.requests
    run, item, arm = req["run"].to_numpy(), req["item"].to_numpy(), req["arm"].to_numpy()
    n_items = int(item.max()) + 1 if len(item) else 0
    n_arms = len(m.arms)
    weights = {
        "tokens": np.where(req["spec"].to_numpy(), req["ct"].to_numpy(), 0.0),
        "verify_steps": req["vct"].to_numpy(),
        "correct_drafts": req["ncd"].to_numpy(),
        "al_sum": np.nan_to_num(req["al"].to_numpy()),
        "requests": req["spec"].to_numpy().astype(float),
    }
    blocks, layouts, offset = [], {}, 0
    ok = arm >= 0
    for name, part in m.partitions.items():
        quantities = _QUANTITIES[name]
        cells = part.size * n_arms
        flat = item[ok] * cells + part.code(run, item)[ok] * n_arms + arm[ok]
        block = np.stack(
            [
                np.bincount(flat, weights=weights[q][ok], minlength=n_items * cells).reshape(n_items, cells)
                for q in quantities
            ],
            axis=2,
        ).reshape(n_items, cells * len(quantities))
        blocks.append(block)
        layouts[name] = _Layout(offset, quantities, n_arms)
        offset += block.shape[1]
    matrix = np.concatenate(blocks, axis=1) if blocks else np.zeros((0, 0))
    return matrix, layouts, item


def item_changes(
    m: RequestTables, matrix: np.ndarray, layouts: dict[str, _Layout], n_boot: int, rng: np.random.Generator
) -> dict[ChangeKey, Change]:
    """The ratio metrics' changes of every partition but the categories, from one bootstrap over items (`matrix`,
    `layouts`: item_matrix's)."""
    if matrix.size == 0:
        return {}
    point = matrix.sum(axis=0)
    boot = bootstrap_sums(matrix, n_boot, rng)
    base = m.arms.index(m.baseline)
    out: dict[ChangeKey, Change] = {}
    for name, part in m.partitions.items():
        if name == "category":
            continue  # stratified: category_changes
        lay = layouts[name]
        for metric, (num, den) in RATIO_METRICS.items():
            if num not in lay.quantities or den not in lay.quantities:
                continue
            for g, label in enumerate(part.labels):
                n_items = _items_in_group(matrix, lay, g, den)
                for a, arm in enumerate(m.arms):
                    if a == base:
                        continue
                    cols = (lay.col(g, a, num), lay.col(g, a, den), lay.col(g, base, num), lay.col(g, base, den))
                    out[(name, label, metric, arm)] = item_change(point, boot, cols, n_items)
    return out


def _items_in_group(matrix: np.ndarray, lay: _Layout, group: int, quantity: str) -> int:
    cols = [lay.col(group, a, quantity) for a in range(lay.n_arms)]
    return int(np.count_nonzero(matrix[:, cols].sum(axis=1)))


def category_changes(
    m: RequestTables, matrix: np.ndarray, layouts: dict[str, _Layout], n_boot: int, bootstrap_seed: int
) -> dict[ChangeKey, Change]:
    """Per-category changes, each from a bootstrap over the category's own items (stratified; `matrix`,
    `layouts`: item_matrix's)."""
    if "category" not in m.partitions:
        return {}
    part, lay = m.partitions["category"], layouts["category"]
    assert part.item_code is not None  # the category partition groups items
    base = m.arms.index(m.baseline)
    out: dict[ChangeKey, Change] = {}
    for g, label in enumerate(part.labels):
        cols = [lay.col(g, a, q) for a in range(len(m.arms)) for q in lay.quantities]
        rows = np.flatnonzero(part.item_code[: len(matrix)] == g)
        sub = matrix[np.ix_(rows, np.asarray(cols, dtype=np.intp))]
        local = _Layout(0, lay.quantities, lay.n_arms)  # the columns of `sub`: arm-major, then quantity
        n_items = _items_in_group(sub, local, 0, "verify_steps")
        point = sub.sum(axis=0)
        boot = bootstrap_sums(sub, n_boot, np.random.default_rng([bootstrap_seed, 2, g]))
        for metric, (num, den) in RATIO_METRICS.items():
            if num not in lay.quantities or den not in lay.quantities:
                continue
            for a, arm in enumerate(m.arms):
                if a == base:
                    continue
                idx = (local.col(0, a, num), local.col(0, a, den), local.col(0, base, num), local.col(0, base, den))
                out[("category", label, metric, arm)] = item_change(point, boot, idx, n_items)
    return out


# ---------------------------------------------------------------------------------------------
# per-run metrics: paired runs


def run_pairs(runs: pd.DataFrame, arm: str, baseline: str) -> pd.DataFrame:
    """Runs of `arm` joined with the baseline's run of the same campaign, base seed and repeat."""
    a = runs[runs["arm"] == baseline].drop_duplicates(PAIR_KEYS)
    b = runs[runs["arm"] == arm].drop_duplicates(PAIR_KEYS)
    return b.merge(a, on=PAIR_KEYS, suffixes=("_b", "_a")).sort_values(PAIR_KEYS, kind="stable")


def _pair_array(pairs: pd.DataFrame, num: str, den: str | None) -> np.ndarray:
    ones = np.ones(len(pairs))
    return np.column_stack(
        [
            pairs[f"{num}_b"].to_numpy(float),
            pairs[f"{den}_b"].to_numpy(float) if den else ones,
            pairs[f"{num}_a"].to_numpy(float),
            pairs[f"{den}_a"].to_numpy(float) if den else ones,
        ]
    )


def _pair_flagged(pairs: pd.DataFrame) -> np.ndarray:
    return pairs["foreign_load_b"].to_numpy(bool) | pairs["foreign_load_a"].to_numpy(bool)


def run_changes(m: Metrics, bootstrap_seed: int) -> dict[ChangeKey, Change]:
    out: dict[ChangeKey, Change] = {}
    stream = 0
    for arm in m.arms:
        if arm == m.baseline:
            continue
        pairs = run_pairs(m.runs, arm, m.baseline)
        flagged = _pair_flagged(pairs)
        for metric, (num, den) in RUN_METRICS.items():
            stream += 1
            out[("pooled", "all", metric, arm)] = paired_change(
                _pair_array(pairs, num, den), np.random.default_rng([bootstrap_seed, 1, stream]), flagged
            )
        for label in m.partitions["seed"].labels:
            stream += 1
            sub = pairs[pairs["base_seed"] == label]
            out[("seed", label, "throughput", arm)] = paired_change(
                _pair_array(sub, "tokens", "window_s"),
                np.random.default_rng([bootstrap_seed, 1, stream]),
                _pair_flagged(sub),
            )
    return out


def pooled_run_value(runs: pd.DataFrame, arm: str, metric: str) -> float:
    """The pooled value of a per-run ratio metric (sum of numerators / sum of denominators over runs), or
    the mean over runs of a plain per-run value."""
    num, den = RUN_METRICS[metric]
    sub = runs[runs["arm"] == arm]
    if den is None:
        vals = sub[num].to_numpy(float)
        return float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    ok = np.isfinite(sub[den].to_numpy(float)) & np.isfinite(sub[num].to_numpy(float))
    total = sub[den].to_numpy(float)[ok].sum()
    return float(sub[num].to_numpy(float)[ok].sum() / total) if total > 0 else float("nan")


def power_table(m: Metrics) -> pd.DataFrame:
    """Run pairs a paired t-test on log ratios needs to detect each change in POWER_CHANGES at 80% power
    (two-sided 0.05; never fewer than MIN_PAIRS), from the per-pair log-ratio SD of this campaign.

    One row per (arm, metric). In an A/A campaign the SD is the run-to-run noise; in an A/B campaign it
    also holds any pair-to-pair variation of the effect. sd and the counts are NaN / None below
    MIN_PAIRS_FOR_SD pairs.
    """
    rows = []
    for arm in m.arms:
        if arm == m.baseline:
            continue
        pairs = run_pairs(m.runs, arm, m.baseline)
        for metric, (num, den) in POWER_METRICS.items():
            if num not in m.runs or not np.isfinite(m.runs[num].to_numpy(float)).any():
                continue  # not recorded (the server's CPU time before 2026-12-06)
            d = pair_log_ratios(_pair_array(pairs, num, den))
            sd = float(np.std(d, ddof=1)) if len(d) >= MIN_PAIRS_FOR_SD else float("nan")
            sd_lo, sd_hi = sd_interval(sd, len(d))
            row = {"arm": arm, "metric": metric, "pairs": len(d), "sd_log_ratio": sd, "sd_lo": sd_lo, "sd_hi": sd_hi}
            for change in POWER_CHANGES:
                key = f"pairs_for_{round(change * 100)}pct"
                known = np.isfinite(sd)
                row[key] = pairs_needed(change, sd) if known else None
                row[f"{key}_lo"] = pairs_needed(change, sd_lo) if known else None
                row[f"{key}_hi"] = pairs_needed(change, sd_hi) if known else None
            rows.append(row)
    columns = [
        "arm",
        "metric",
        "pairs",
        "sd_log_ratio",
        "sd_lo",
        "sd_hi",
        *[f"pairs_for_{round(c * 100)}pct{tail}" for c in POWER_CHANGES for tail in ("", "_lo", "_hi")],
    ]
    return pd.DataFrame(rows, columns=columns)


POWER_NOTE = (
    f"paired t-test on per-pair log ratios, two-sided alpha {ALPHA}, power {POWER:.0%}, "
    f"never fewer than {MIN_PAIRS} pairs"
)
