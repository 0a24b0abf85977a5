"""Coverage simulations of the report's intervals (seeded, so each run gives the same figures).

- The 95% t-interval on per-pair log ratios (analysis.stats.t_interval) at the pair counts the report
  uses, under normal, heavy-tailed (t with 3 degrees of freedom) and skewed (centred exponential)
  log-ratio noise. Measured with 40,000 draws per cell (README): normal 0.951/0.951/0.950/0.949,
  t3 0.963/0.961/0.961/0.957, skewed 0.887/0.893/0.905/0.917 at n = 6/8/12/20. The t-interval holds its
  level under symmetric noise (conservative for heavy tails) and falls short under strong skew at few
  pairs, which the test's band allows and the README states.
- The 95% percentile bootstrap of a ratio of sums over items (acceptance length), which the report
  gives from MIN_ITEMS items up.
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats import MIN_ITEMS, MIN_PAIRS, percentile_interval, ratio_change, t_interval

TRUE_LOG_RATIO = 0.02


def _noise(kind: str, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    if kind == "normal":
        return rng.normal(0.0, 1.0, size)
    if kind == "t3":
        return rng.standard_t(3, size) / np.sqrt(3.0)  # unit variance
    return rng.exponential(1.0, size) - 1.0  # skewness 2, mean 0


@pytest.mark.parametrize("kind", ["normal", "t3", "skewed"])
@pytest.mark.parametrize("n", [MIN_PAIRS, 8, 12, 20])
def test_t_interval_on_log_ratios_covers(kind, n):
    rng = np.random.default_rng([n, len(kind)])
    sims = 4000
    d = TRUE_LOG_RATIO + 0.03 * _noise(kind, rng, (sims, n))
    hits = 0
    for row in d:
        lo, hi = t_interval(row)
        hits += np.log1p(lo) <= TRUE_LOG_RATIO <= np.log1p(hi)
    coverage = hits / sims
    # symmetric noise: the nominal 95% within simulation error (sd 0.0034 at 4000 draws); skewed: at least 0.87
    band = (0.935, 0.975) if kind != "skewed" else (0.87, 0.96)
    assert band[0] <= coverage <= band[1], (kind, n, coverage)


def _items(rng: np.random.Generator, n: int) -> np.ndarray:
    """[n, 4] per-item (tokens_b, steps_b, tokens_a, steps_a): skewed lengths and item acceptance lengths."""
    steps_a = np.maximum(1, np.round(rng.lognormal(4.0, 1.0, n)))
    al = 1.5 + rng.gamma(2.0, 1.0, n)
    steps_b = np.maximum(1, np.round(steps_a * rng.lognormal(-0.1, 0.3, n)))
    return np.stack([steps_b * al * 1.05 * rng.lognormal(0, 0.2, n), steps_b, steps_a * al, steps_a], axis=1)


def _bootstrap_coverage(n: int, sims: int, n_boot: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    s = _items(rng, 400_000).sum(axis=0)
    truth = float(ratio_change(s[0], s[1], s[2], s[3]))
    hits = 0
    for _ in range(sims):
        m = _items(rng, n)
        boot = m[rng.integers(0, n, (n_boot, n))].sum(axis=1)
        lo, hi = percentile_interval(ratio_change(boot[:, 0], boot[:, 1], boot[:, 2], boot[:, 3]))
        hits += lo <= truth <= hi
    return hits / sims


def test_item_bootstrap_covers_from_min_items_and_not_below():
    """Measured (README, 2,000 draws x 1,000 resamples): 0.79 at 5 items, 0.87-0.91 at 8-20 items, 0.90-0.94
    at 30. MIN_ITEMS = 10 is where the bootstrap of a ratio of sums reaches its plateau (about 0.88-0.90)."""
    at_min = _bootstrap_coverage(MIN_ITEMS, 600, 400, seed=1)
    below = _bootstrap_coverage(4, 600, 400, seed=2)
    assert 0.84 <= at_min <= 0.97, at_min
    assert below < at_min - 0.03, (below, at_min)
