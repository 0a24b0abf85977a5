"""PNG figures (matplotlib's Agg canvas through the object API: no pyplot, no global state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.metrics import Metrics
from analysis.positions import Acceptance

PER_SEED = "per_seed.png"
HISTOGRAM = "accept_histogram.png"
POSITIONS = "accept_by_position.png"


def figure_specs(m: Metrics, acc: Acceptance | None = None) -> dict[str, str]:
    """File name -> caption, for the figures the data allow."""
    specs = {}
    if m.partitions["seed"].size:
        specs[PER_SEED] = "Acceptance length and output throughput per base seed, by arm"
    if not m.histogram.empty:
        specs[HISTOGRAM] = "Share of verify steps by number of correct drafts, by arm"
    if acc is not None and acc.rates:  # (an arm without drafts has no curve)
        specs[POSITIONS] = "Acceptance rate per draft position (steps that accepted at least i drafts), by arm"
    return specs


def render(m: Metrics, out_dir: Path, acc: Acceptance | None = None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    specs = figure_specs(m, acc)
    if PER_SEED in specs:
        written.append(_save(_per_seed(m), out_dir / PER_SEED))
    if HISTOGRAM in specs:
        written.append(_save(_histogram(m), out_dir / HISTOGRAM))
    if acc is not None and POSITIONS in specs:
        written.append(_save(_positions(acc), out_dir / POSITIONS))
    return written


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    return path


def _grouped_bars(ax, groups: list[str], series: dict[str, np.ndarray], ylabel: str) -> None:
    x = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _per_seed(m: Metrics) -> Figure:
    seeds = list(m.partitions["seed"].labels)
    ratios = m.ratios[m.ratios["partition"] == "seed"]
    al = {
        a: ratios[ratios["arm"] == a].set_index("group")["acceptance_length"].reindex(seeds).to_numpy(float)
        for a in m.arms
    }
    sr = m.seed_runs
    tput = {a: sr[sr["arm"] == a].set_index("base_seed")["throughput"].reindex(seeds).to_numpy(float) for a in m.arms}
    fig = Figure(figsize=(10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    labels = [str(s) for s in seeds]
    _grouped_bars(ax1, labels, al, "acceptance length (tokens / verify step)")
    finite = np.concatenate([v[np.isfinite(v)] for v in al.values()]) if al else np.array([])
    if finite.size:
        lo, hi = finite.min(), finite.max()
        pad = max((hi - lo) * 0.5, 0.05 * hi, 1e-3)
        ax1.set_ylim(max(lo - pad, 0), hi + pad)
    ax1.set_title("Acceptance length")
    _grouped_bars(ax2, labels, tput, "output tokens / s")
    ax2.set_title("Output throughput")
    for ax in (ax1, ax2):
        ax.set_xlabel("base seed")
    ax2.legend(loc="lower right")
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
    ax.set_title("spec_correct_drafts_histogram")
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
