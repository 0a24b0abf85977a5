"""The figures tell the truth about their numbers: acceptance length from 0 with its interval, titles in words,
runs under foreign load marked."""

from __future__ import annotations

import numpy as np
from matplotlib.container import BarContainer, ErrorbarContainer

from analysis import plots
from analysis.report import build_report


def test_per_seed_acceptance_starts_at_zero_with_intervals_and_marks_foreign_load(clean_campaign):
    report = build_report([clean_campaign], n_boot=50)
    runs = report.data.runs.copy()
    loaded = runs.index[(runs["arm"] == "block")][0]
    runs.loc[loaded, "cpu_other_frac"] = 0.9  # other processes took 90% of the CPUs during this run
    fig = plots._per_seed(report.metrics, runs)
    al, tput = fig.axes
    assert al.get_ylim()[0] == 0 and tput.get_ylim()[0] == 0
    assert any(isinstance(c, ErrorbarContainer) for c in al.containers)  # the intervals
    seed = runs.loc[loaded, "base_seed"]
    block = [c for c in tput.containers if isinstance(c, BarContainer) and c.get_label() == "block"][0]
    seeds = [float(s) for s in report.metrics.partitions["seed"].labels]
    hatches = [bar.get_hatch() for bar in block]
    assert hatches == ["//" if s == float(seed) else None for s in seeds]
    assert "foreign load" in tput.get_title()
    assert plots._histogram(report.metrics).axes[0].get_title() == "Verify steps by number of correct drafts"


def test_the_ratio_interval_holds_the_ratio():
    x, y = np.array([3.0, 4, 5, 2, 6]), np.array([1.0, 2, 2, 1, 2])
    lo, hi = plots.ratio_interval(x, y)
    assert lo < x.sum() / y.sum() < hi
    assert np.isnan(plots.ratio_interval(x[:1], y[:1])[0])
