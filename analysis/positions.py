"""Acceptance per draft position, from each record's `spec_correct_drafts_histogram` (verify steps by the
number of drafts accepted in the step, bins 0..gamma).

- rate of position i (i = 1..gamma) = verify steps that accepted at least i drafts / verify steps: the
  chance that a step's i-th draft was accepted (a draft is only accepted when every draft before it was);
- draft acceptance rate = accepted drafts / proposed drafts, proposed = gamma per verify step (what SGLang's
  `spec_num_proposed_drafts` counts);
- mean accepted drafts per step and the steps-by-accepted histogram, per arm;
- the per-request acceptance length (completion tokens / verify steps) distribution: mean, p10, p50, p90.

An arm without a verify step in its histograms (no speculation, or a speculative arm that proposed nothing) has
no rates: it is left out of every table and named in `no_drafts`; changes need drafts in both arms.

The change of each position's rate (arm vs baseline) has a 95% paired bootstrap interval over items (all
of an item's requests resampled together, the same resampling as the acceptance-length intervals), pooled
and per base seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.load import Loaded
from analysis.metrics import RequestTables
from analysis.stats import Change, bootstrap_sums, item_change

REQUEST_QUANTILES = {"p10": 10, "p50": 50, "p90": 90}


@dataclass(frozen=True)
class Acceptance:
    gamma: int  # draft positions (histogram bins - 1)
    histogram: dict[str, np.ndarray]  # arm -> verify steps by accepted drafts, [gamma + 1]
    rates: dict[str, np.ndarray]  # arm -> rate of positions 1..gamma, pooled
    draft_rate: dict[str, float]
    mean_accepted: dict[str, float]
    request_al: dict[str, dict[str, float]]  # arm -> mean, p10, p50, p90 of per-request AL
    requests: dict[str, int]  # arm -> used requests that carry a histogram
    without: int  # used requests without one
    changes: dict[str, list[Change]]  # other arm -> change of each position's rate, pooled (both arms with drafts)
    seeds: pd.DataFrame  # base_seed, arm, position, rate, change (Change or None)
    # arms none of whose used requests carries a verify step with drafts (no speculation, or none proposed):
    # absent from every dict above, shown as "n/a: no drafts"
    no_drafts: tuple[str, ...] = ()


def at_least(hist: np.ndarray) -> np.ndarray:
    """[rows, gamma + 1] steps by accepted drafts -> [rows, gamma] steps that accepted at least 1..gamma."""
    return np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]


def draft_positions(hist: np.ndarray, proposed: np.ndarray, steps: np.ndarray) -> int:
    """gamma: the histogram's last bin, or more where spec_num_proposed_drafts / spec_verify_ct says so (a
    server may leave out the bins above the largest count it saw)."""
    ok = np.isfinite(proposed) & (steps > 0)
    per_step = int(np.rint((proposed[ok] / steps[ok]).max())) if ok.any() else 0
    return max(hist.shape[1] - 1, per_step)


def compute(data: Loaded, used: np.ndarray, m: RequestTables, n_boot: int, bootstrap_seed: int) -> Acceptance | None:
    """`used`: the audit's used-record mask (the rows of m.requests, in order). None when no used request
    carries a histogram."""
    req = m.requests
    rows = np.flatnonzero(used)
    present = data.hist.present[rows] & req["spec"].to_numpy()
    if not present.any():
        return None
    hist = data.hist.dense[rows][present]
    steps = hist.sum(axis=1)
    proposed = data.records["meta_spec_num_proposed_drafts"].to_numpy(dtype=float)[rows][present]
    gamma = draft_positions(hist, proposed, steps)
    if gamma < 1:
        return None
    hist = np.pad(hist, ((0, 0), (0, gamma + 1 - hist.shape[1])))
    arm, item, run = (req[c].to_numpy()[present] for c in ("arm", "item", "run"))
    ge = at_least(hist)
    al = req["al"].to_numpy()[present]
    names = m.arms
    out_hist, rates, draft, mean, dist, count = {}, {}, {}, {}, {}, {}
    no_drafts = []
    for a, name in enumerate(names):
        mine = arm == a
        h = hist[mine].sum(axis=0)
        s = int(h.sum())
        if not s:
            no_drafts.append(name)
            continue
        out_hist[name] = h
        rates[name] = ge[mine].sum(axis=0) / s
        accepted = float(h @ np.arange(gamma + 1))
        draft[name] = accepted / (s * gamma)
        mean[name] = accepted / s
        finite = al[mine][np.isfinite(al[mine])]
        dist[name] = {
            "mean": float(finite.mean()) if finite.size else float("nan"),
            **{
                k: float(np.percentile(finite, q)) if finite.size else float("nan")
                for k, q in REQUEST_QUANTILES.items()
            },
        }
        count[name] = int(mine.sum())
    group = m.partitions["seed"].code(run, item) if "seed" in m.partitions else np.zeros(len(run), dtype=np.int64)
    changes, seeds = _changes(ge, steps, arm, item, group, m, n_boot, bootstrap_seed, set(rates))
    return Acceptance(
        gamma, out_hist, rates, draft, mean, dist, count, int((~present).sum()), changes, seeds, tuple(no_drafts)
    )


def _changes(
    ge: np.ndarray,
    steps: np.ndarray,
    arm: np.ndarray,
    item: np.ndarray,
    group: np.ndarray,
    m: RequestTables,
    n_boot: int,
    bootstrap_seed: int,
    drafted: set[str],
) -> tuple[dict[str, list[Change]], pd.DataFrame]:
    """Paired item-bootstrap changes of each position's rate: pooled (column block 0) and per seed (1..), for
    the `drafted` arms (those with verify steps) against the baseline when it is one of them."""
    n_arms, gamma = len(m.arms), ge.shape[1]
    n_items = int(item.max()) + 1
    labels = list(m.partitions["seed"].labels) if "seed" in m.partitions else []
    n_groups = 1 + len(labels)  # column block 0: pooled; 1..: seeds
    width = gamma + 1  # steps, then at least 1..gamma
    values = np.column_stack([steps, ge]).astype(float)
    sums = np.zeros((n_groups, n_arms, n_items, width))  # integer counts: float sums are exact in any order
    cell = arm * n_items + item
    blocks = [(0, 1, cell, np.ones(len(arm), bool))]  # (first group, groups, bincount key, rows): pooled
    if labels:  # then one group per seed
        blocks.append((1, len(labels), group * (n_arms * n_items) + cell, (group >= 0) & (group < len(labels))))
    for first, groups, key, sel in blocks:
        for q in range(width):
            sums[first : first + groups, ..., q] = np.bincount(
                key[sel], weights=values[sel, q], minlength=groups * n_arms * n_items
            ).reshape(groups, n_arms, n_items)
    matrix = sums.transpose(2, 0, 1, 3).reshape(n_items, n_groups * n_arms * width)  # column (g, arm, q)
    point = matrix.sum(axis=0)
    boot = bootstrap_sums(matrix, n_boot, np.random.default_rng([bootstrap_seed, 5]))
    b = m.arms.index(m.baseline)

    def col(g: int, a: int, q: int) -> int:
        return (g * n_arms + a) * width + q

    def change(g: int, a: int, i: int) -> Change:
        items = int(np.count_nonzero(matrix[:, [col(g, x, 0) for x in range(n_arms)]].sum(axis=1)))
        return item_change(point, boot, (col(g, a, i), col(g, a, 0), col(g, b, i), col(g, b, 0)), items)

    paired = m.baseline in drafted
    pooled = {
        name: [change(0, a, i) for i in range(1, gamma + 1)]
        for a, name in enumerate(m.arms)
        if a != b and name in drafted and paired
    }
    rows = []
    for s, label in enumerate(labels):
        for a, name in enumerate(m.arms):
            if name not in drafted:
                continue
            for i in range(1, gamma + 1):
                den = point[col(s + 1, a, 0)]
                rows.append(
                    {
                        "base_seed": label,
                        "arm": name,
                        "position": i,
                        "rate": point[col(s + 1, a, i)] / den if den else float("nan"),
                        "change": change(s + 1, a, i) if a != b and paired else None,
                    }
                )
    return pooled, pd.DataFrame(rows, columns=["base_seed", "arm", "position", "rate", "change"])
