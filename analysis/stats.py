"""Paired resampling statistics: bootstrap intervals and the sign-flip permutation test.

Every comparison is a ratio of sums, B over A, minus one: acceptance length is sum(tokens) /
sum(verify steps) per arm, throughput is sum(tokens) / sum(run windows), a mean over runs is
sum(values) / number of runs. Resampling units (items, or run pairs) keep both arms together.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
ALPHA = 0.05
EXACT_MAX_PAIRS = 16  # up to 2**16 sign vectors are enumerated; beyond, random sign flips
RANDOM_FLIPS = 20_000
_MAX_CELLS = 1 << 22  # resample indices held at once (chunking bounds memory)


@dataclass(frozen=True)
class Change:
    """B/A - 1 with its 95% interval; `p_value` only for run pairs (sign-flip test)."""

    estimate: float
    lo: float
    hi: float
    n: int
    unit: str  # "items" | "run pairs"
    p_value: float | None = None
    exact: bool = True

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def covers_zero(self) -> bool:
        return not self.has_interval or (self.lo <= 0 <= self.hi)

    @property
    def min_p(self) -> float | None:
        """Smallest p-value an exact two-sided sign-flip test over n pairs can give."""
        if self.p_value is None:
            return None
        return 1.0 if self.n < 1 else min(1.0, 2.0 ** (1 - self.n))

    @property
    def too_few_pairs(self) -> bool:
        return self.min_p is not None and self.min_p >= ALPHA

    @property
    def significant(self) -> bool:
        if self.covers_zero:
            return False
        return self.p_value is None or self.p_value < ALPHA


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval over axis 0, ignoring non-finite replicates."""
    samples = np.asarray(samples, dtype=float)
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return math.nan, math.nan
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_sums(matrix: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Column sums of `matrix` over `n_boot` resamples of its rows with replacement.

    matrix: [units, columns] -> [n_boot, columns]. Each resample draws `units` row indices; their
    multiplicities (bincount) times the matrix give all column sums in one product.
    """
    n, cols = matrix.shape
    out = np.zeros((n_boot, cols))
    if n == 0:
        return out
    chunk = max(1, min(n_boot, _MAX_CELLS // n))
    starts = list(range(0, n_boot, chunk))
    streams = rng.spawn(len(starts))  # one stream per chunk: the draws do not depend on thread timing
    index_type = np.int32 if n < 2**31 else np.int64

    def draw(k: int) -> np.ndarray:
        return streams[k].integers(0, n, size=(min(chunk, n_boot - starts[k]), n), dtype=index_type)

    # float32 products: exact counts, sums accurate to ~1e-6 relative (intervals print to 1e-4)
    weights = matrix.astype(np.float32)
    counts = np.empty((chunk, n), dtype=np.float32)
    with ThreadPoolExecutor(max_workers=1) as pool:  # draws the next chunk while this one is counted
        pending = pool.submit(draw, 0)
        for k, start in enumerate(starts):
            idx = pending.result()
            if k + 1 < len(starts):
                pending = pool.submit(draw, k + 1)
            for r in range(len(idx)):  # row by row: the count array stays in cache
                counts[r] = np.bincount(idx[r], minlength=n)
            out[start:start + len(idx)] = counts[: len(idx)] @ weights
    return out


def ratio_change(num_b: np.ndarray, den_b: np.ndarray, num_a: np.ndarray, den_a: np.ndarray) -> np.ndarray:
    """(sum num_b / sum den_b) / (sum num_a / sum den_a) - 1, elementwise over already-summed arrays."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(num_b) / den_b) / (np.asarray(num_a) / den_a) - 1


def item_change(point: np.ndarray, boot: np.ndarray, cols: tuple[int, int, int, int], n_items: int) -> Change:
    """Change from the summed columns (num_b, den_b, num_a, den_a) of a bootstrap over items."""
    nb, db, na, da = cols
    estimate = float(ratio_change(point[nb], point[db], point[na], point[da]))
    if n_items < 2 or not math.isfinite(estimate):
        return Change(estimate, math.nan, math.nan, n_items, "items")
    lo, hi = percentile_interval(ratio_change(boot[:, nb], boot[:, db], boot[:, na], boot[:, da]))
    return Change(estimate, lo, hi, n_items, "items")


def paired_change(pairs: np.ndarray, n_boot: int, rng: np.random.Generator) -> Change:
    """Change over run pairs. pairs: [n, 4] = (num_b, den_b, num_a, den_a) per pair.

    Interval: bootstrap over pairs. p-value: sign-flip test on the per-pair log ratios.
    """
    pairs = pairs[np.all(np.isfinite(pairs), axis=1) & np.all(pairs[:, [1, 3]] > 0, axis=1)]
    n = len(pairs)
    total = pairs.sum(axis=0)
    estimate = float(ratio_change(total[0], total[1], total[2], total[3])) if n else math.nan
    if n < 2:
        return Change(estimate, math.nan, math.nan, n, "run pairs", p_value=1.0 if n else None)
    boot = bootstrap_sums(pairs, n_boot, rng)
    lo, hi = percentile_interval(ratio_change(boot[:, 0], boot[:, 1], boot[:, 2], boot[:, 3]))
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log((pairs[:, 0] / pairs[:, 1]) / (pairs[:, 2] / pairs[:, 3]))
    p, exact = sign_flip_pvalue(d, rng)
    return Change(estimate, lo, hi, n, "run pairs", p_value=p, exact=exact)


def sign_flip_pvalue(d: np.ndarray, rng: np.random.Generator) -> tuple[float, bool]:
    """Two-sided paired sign-flip test of mean(d) = 0; exact for up to EXACT_MAX_PAIRS pairs.

    Returns (p, exact). Under the null each pair's difference is as likely to have either sign.
    """
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n == 0:
        return math.nan, True
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, observed)
    if n <= EXACT_MAX_PAIRS:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
        stats = np.abs((1 - 2 * bits) @ d) / n
        return float(np.mean(stats >= observed - tol)), True
    signs = rng.choice(np.array([-1.0, 1.0]), size=(RANDOM_FLIPS, n))
    stats = np.abs(signs @ d) / n
    return float((1 + np.sum(stats >= observed - tol)) / (RANDOM_FLIPS + 1)), False
