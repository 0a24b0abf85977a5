"""PNG figures (matplotlib's Agg canvas through the object API: no pyplot, no global state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.audit import foreign_load
from analysis.metrics import Metrics
from analysis.positions import Acceptance

PER_SEED = "per_seed.png"
HISTOGRAM = "accept_histogram.png"
POSITIONS = "accept_by_position.png"


def figure_specs(m: Metrics, acc: Acceptance | None = None) -> dict[str, str]:
    """File name -> caption, for the figures the data allow."""
    specs = {}
    if m.partitions["seed"].size:
        specs[PER_SEED] = (
            "Acceptance length (with its 95% interval over requests) and output throughput per base seed, by arm; "
            "hatched: a run taken under foreign load"
        )
    if not m.histogram.empty:
        specs[HISTOGRAM] = "Share of verify steps by number of correct drafts, by arm"
    if acc is not None and acc.rates:  # (an arm without drafts has no curve)
        specs[POSITIONS] = "Acceptance rate per draft position (steps that accepted at least i drafts), by arm"
    return specs


def render(m: Metrics, out_dir: Path, acc: Acceptance | None = None, runs: pd.DataFrame | None = None) -> list[Path]:
    """The figures; `runs`: the loaded runs table (base seeds and machine load), for the per-seed intervals and
    the foreign-load marks."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    specs = figure_specs(m, acc)
    if PER_SEED in specs:
        written.append(_save(_per_seed(m, runs), out_dir / PER_SEED))
    if HISTOGRAM in specs:
        written.append(_save(_histogram(m), out_dir / HISTOGRAM))
    if acc is not None and POSITIONS in specs:
        written.append(_save(_positions(acc), out_dir / POSITIONS))
    return written


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    return path


def _grouped_bars(
    ax,
    groups: list[str],
    series: dict[str, np.ndarray],
    ylabel: str,
    errors: dict[str, np.ndarray] | None = None,
    hatched: dict[str, np.ndarray] | None = None,
) -> None:
    """Bars per group and series; `errors`: [2, groups] distances below and above each bar (an interval);
    `hatched`: [groups] True where the bar is marked (foreign load)."""
    x = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        err = (errors or {}).get(name)
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name, yerr=err, capsize=3)
        for bar, marked in zip(bars, (hatched or {}).get(name, np.zeros(len(values), bool)), strict=True):
            if marked:
                bar.set_hatch("//")
                bar.set_edgecolor("black")
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def ratio_interval(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """95% interval of sum(x) / sum(y) over the requests (the ratio estimator's delta-method standard error:
    sqrt(sum((x - R y)^2) / (n (n - 1))) / mean(y)); NaNs for fewer than 2 requests."""
    n, total = len(x), y.sum()
    if n < 2 or total <= 0:
        return np.nan, np.nan
    r = x.sum() / total
    se = np.sqrt(((x - r * y) ** 2).sum() / (n * (n - 1))) / (total / n)
    return r - 1.96 * se, r + 1.96 * se


def _seed_of_requests(m: Metrics, runs: pd.DataFrame | None) -> np.ndarray | None:
    if runs is None or "base_seed" not in runs:
        return None
    return runs["base_seed"].to_numpy(float)[m.requests["run"].to_numpy()]


def _al_errors(m: Metrics, seeds: list, al: dict[str, np.ndarray], runs: pd.DataFrame | None) -> dict[str, np.ndarray]:
    """Per arm: [2, seeds] distances from each seed's AL down and up to its 95% interval (0 where there is none)."""
    seed_of = _seed_of_requests(m, runs)
    if seed_of is None:
        return {}
    req = m.requests
    arm_of, spec = req["arm"].to_numpy(), req["spec"].to_numpy(bool)
    ct, vct = req["ct"].to_numpy(float), req["vct"].to_numpy(float)
    out = {}
    for a, name in enumerate(m.arms):
        err = np.zeros((2, len(seeds)))
        for j, seed in enumerate(seeds):
            mask = (arm_of == a) & spec & (seed_of == float(seed)) & np.isfinite(ct) & np.isfinite(vct)
            lo, hi = ratio_interval(ct[mask], vct[mask])
            if np.isfinite(lo) and np.isfinite(al[name][j]):
                err[:, j] = [max(al[name][j] - lo, 0), max(hi - al[name][j], 0)]
        out[name] = err
    return out


def _foreign(m: Metrics, seeds: list, runs: pd.DataFrame | None) -> dict[str, np.ndarray]:
    """Per arm: [seeds] True where a run of that seed was taken under foreign load (analysis.audit.foreign_load)."""
    needed = {"arm", "base_seed", "cpu_other_frac", "steal_frac", "cpu_other_before", "cpu_other_after"}
    if runs is None or not needed <= set(runs.columns):
        return {}
    flagged = runs[foreign_load(runs)]
    pairs = {(str(a), float(s)) for a, s in zip(flagged["arm"], flagged["base_seed"], strict=True)}
    return {a: np.array([(a, float(s)) in pairs for s in seeds]) for a in m.arms}


def _per_seed(m: Metrics, runs: pd.DataFrame | None = None) -> Figure:
    seeds = list(m.partitions["seed"].labels)
    ratios = m.ratios[m.ratios["partition"] == "seed"]
    al = {
        a: ratios[ratios["arm"] == a].set_index("group")["acceptance_length"].reindex(seeds).to_numpy(float)
        for a in m.arms
    }
    sr = m.seed_runs
    tput = {a: sr[sr["arm"] == a].set_index("base_seed")["throughput"].reindex(seeds).to_numpy(float) for a in m.arms}
    foreign = _foreign(m, seeds, runs)
    fig = Figure(figsize=(10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    labels = [str(s) for s in seeds]
    _grouped_bars(ax1, labels, al, "acceptance length (tokens / verify step)", _al_errors(m, seeds, al, runs), foreign)
    ax1.set_ylim(bottom=0)  # from 0: a change of a few % looks its size
    ax1.set_title("Acceptance length (95% interval over requests)")
    _grouped_bars(ax2, labels, tput, "output tokens / s", hatched=foreign)
    ax2.set_ylim(bottom=0)
    marked = any(v.any() for v in foreign.values())
    ax2.set_title("Output throughput" + (" (hatched: under foreign load)" if marked else ""))
    for ax in (ax1, ax2):
        ax.set_xlabel("base seed")
    handles = [
        Patch(facecolor=c.patches[0].get_facecolor(), label=c.get_label())
        for c in ax2.containers
        if isinstance(c, BarContainer) and c.patches
    ]
    if marked:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="under foreign load"))
    ax2.legend(handles=handles, loc="lower right")
    fig.tight_layout()
    return fig


def _histogram(m: Metrics) -> Figure:
    h = m.histogram
    totals = h.sum(axis=0).replace(0, np.nan)
    share = {a: (h[a] / totals[a]).to_numpy(float) for a in h.columns}
    fig = Figure(figsize=(8, 3.8))
    ax = fig.subplots()
    _grouped_bars(ax, [str(i) for i in h.index], share, "share of verify steps")
    ax.set_xlabel("correct drafts in the verify step")
    ax.set_title("Verify steps by number of correct drafts")
    ax.legend()
    fig.tight_layout()
    return fig


def _positions(acc: Acceptance) -> Figure:
    fig = Figure(figsize=(8, 3.8))
    ax = fig.subplots()
    x = np.arange(1, acc.gamma + 1)
    for arm, rates in acc.rates.items():
        ax.plot(x, rates, marker="o", label=arm)
    ax.set_xticks(x)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("share of verify steps accepting >= i drafts")
    ax.set_title("Acceptance per draft position")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
