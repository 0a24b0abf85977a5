"""Paired statistics: the item bootstrap, the t-interval on per-pair log ratios, the sign-flip test, power.

- Ratio-of-sums metrics over items (acceptance length, drafts per step) get a paired percentile
  bootstrap over items, from MIN_ITEMS items up (below it, no interval).
- Per-run metrics (throughput, decode throughput, latency percentiles) are compared over run pairs:
  the change is the geometric mean of the pair ratios B/A minus one; from MIN_PAIRS pairs up its 95%
  interval is the t-interval on the per-pair log ratios, exp(mean +- t_{0.975,n-1} s / sqrt(n)) - 1,
  which holds the estimate by construction; below MIN_PAIRS only the range of the pair ratios is given.
  The p-value is the exact two-sided sign-flip test of the mean log ratio.
- Power: pairs a paired t-test on log ratios needs to detect a change at 80% power, two-sided 0.05.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy import special  # the distribution functions alone: scipy.stats costs 1.4 s of CPU to import

LEVEL = 0.95
ALPHA = 0.05
POWER = 0.80
# An exact two-sided sign-flip test over n pairs cannot give p below 2**(1-n): n = 5 gives 0.0625, so
# below 6 pairs no per-run change can be significant at 0.05 and no interval is printed.
MIN_PAIRS = 6
# The percentile bootstrap of a ratio of sums over items covers its 95% target only from about this many
# items (simulation in tests/analysis/test_analysis_coverage.py); below it, no interval.
MIN_ITEMS = 10
MIN_PAIRS_FOR_SD = 3  # a run-to-run SD for the power table needs at least this many pairs
MAX_PAIRS_SHOWN = 100_000
EXACT_MAX_PAIRS = 16  # up to 2**16 sign vectors are enumerated; beyond, random sign flips
RANDOM_FLIPS = 20_000
_MAX_CELLS = 1 << 22  # resample indices held at once (chunking bounds memory)


@dataclass(frozen=True)
class Change:
    """B/A - 1 with its 95% interval (NaN when there is none).

    items: a ratio of sums with a bootstrap interval over items. run pairs: the geometric mean of the
    pair ratios, a t-interval on their logs from MIN_PAIRS pairs, the range of the pair ratios
    (range_lo, range_hi) always, and the sign-flip p-value.
    """

    estimate: float
    lo: float
    hi: float
    n: int
    unit: str  # "items" | "run pairs"
    p_value: float | None = None
    exact: bool = True
    range_lo: float = math.nan
    range_hi: float = math.nan
    min_n: int = 0  # fewer units than this: no interval
    flagged: int = 0  # run pairs with a run taken under foreign load

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def below_minimum(self) -> bool:
        return self.n < self.min_n

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
        """The report's one rule: the 95% interval excludes zero. For run pairs that is the two-sided paired
        t-test at ALPHA, the test the Power table's pair counts assume; the sign-flip p-value is shown beside
        it as a distribution-free check and does not decide."""
        return not self.covers_zero

    @property
    def sign_flip_disagrees(self) -> bool:
        """Run pairs: the t-interval and the exact sign-flip test reach different verdicts at ALPHA."""
        return self.has_interval and self.p_value is not None and (self.p_value < ALPHA) == self.covers_zero


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
            out[start : start + len(idx)] = counts[: len(idx)] @ weights
    return out


def ratio_change(num_b: np.ndarray, den_b: np.ndarray, num_a: np.ndarray, den_a: np.ndarray) -> np.ndarray:
    """(sum num_b / sum den_b) / (sum num_a / sum den_a) - 1, elementwise over already-summed arrays."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(num_b) / den_b) / (np.asarray(num_a) / den_a) - 1


def item_change(
    point: np.ndarray, boot: np.ndarray, cols: tuple[int, int, int, int], n_items: int, min_items: int = MIN_ITEMS
) -> Change:
    """Change from the summed columns (num_b, den_b, num_a, den_a) of a bootstrap over items."""
    nb, db, na, da = cols
    estimate = float(ratio_change(point[nb], point[db], point[na], point[da]))
    if n_items < max(2, min_items) or not math.isfinite(estimate):
        return Change(estimate, math.nan, math.nan, n_items, "items", min_n=min_items)
    lo, hi = percentile_interval(ratio_change(boot[:, nb], boot[:, db], boot[:, na], boot[:, da]))
    return Change(estimate, lo, hi, n_items, "items", min_n=min_items)


def pair_log_ratios(pairs: np.ndarray) -> np.ndarray:
    """log((num_b/den_b) / (num_a/den_a)) per pair, for the pairs whose four values are finite and positive."""
    pairs = np.asarray(pairs, dtype=float).reshape(-1, 4)
    ok = np.all(np.isfinite(pairs), axis=1) & np.all(pairs > 0, axis=1)
    p = pairs[ok]
    return np.log(p[:, 0] / p[:, 1]) - np.log(p[:, 2] / p[:, 3])


def t_quantile(q: float, dof: int) -> float:
    """The q quantile of Student's t with `dof` degrees of freedom (scipy.stats.t.ppf)."""
    return float(special.stdtrit(dof, q))


def chi2_quantile(q: float, dof: int) -> float:
    """The q quantile of the chi-square distribution with `dof` degrees of freedom (scipy.stats.chi2.ppf)."""
    return float(2.0 * special.gammaincinv(dof / 2, q))


def t_interval(d: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """exp(mean(d) +- t_{(1+level)/2, n-1} sd(d) / sqrt(n)) - 1 (NaN below two values)."""
    n = len(d)
    if n < 2:
        return math.nan, math.nan
    half = t_quantile((1 + level) / 2, n - 1) * float(np.std(d, ddof=1)) / math.sqrt(n)
    mean = float(np.mean(d))
    return math.expm1(mean - half), math.expm1(mean + half)


def paired_change(
    pairs: np.ndarray, rng: np.random.Generator, flagged: np.ndarray | None = None, min_pairs: int = MIN_PAIRS
) -> Change:
    """Change over run pairs. pairs: [n, 4] = (num_b, den_b, num_a, den_a) per pair (den = 1 for a plain
    value); flagged: [n] pairs with a run under foreign load. Pairs with a missing or non-positive value
    are left out."""
    pairs = np.asarray(pairs, dtype=float).reshape(-1, 4)
    ok = np.all(np.isfinite(pairs), axis=1) & np.all(pairs > 0, axis=1)
    n_flagged = int(np.asarray(flagged, dtype=bool)[ok].sum()) if flagged is not None else 0
    d = pair_log_ratios(pairs)
    n = len(d)
    if n == 0:
        return Change(math.nan, math.nan, math.nan, 0, "run pairs", min_n=min_pairs)
    estimate = math.expm1(float(np.mean(d)))
    lo, hi = t_interval(d) if n >= min_pairs else (math.nan, math.nan)
    p, exact = sign_flip_pvalue(d, rng)
    return Change(
        estimate,
        lo,
        hi,
        n,
        "run pairs",
        p_value=p,
        exact=exact,
        range_lo=math.expm1(float(d.min())),
        range_hi=math.expm1(float(d.max())),
        min_n=min_pairs,
        flagged=n_flagged,
    )


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
    stats = _random_flip_stats(d, rng)
    return float((1 + np.sum(stats >= observed - tol)) / (RANDOM_FLIPS + 1)), False


FLIP_BLOCK = 2_000  # sign vectors drawn at a time (a block of 1,000 pairs: 2 MB of bits, 16 MB as doubles)


def _random_flip_stats(d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """|mean of d with random signs| for RANDOM_FLIPS sign vectors. Each sign is one random bit (+1 for 1, -1 for
    0), so sum(sign * d) = 2 * (bits @ d) - sum(d): bits drawn as bytes, 8 signs a byte, where drawing each sign
    as a float took 12x the CPU time (0.64 s against 0.05 s a test at 1,000 pairs, 2026-12-06)."""
    n, total = len(d), float(d.sum())
    out = np.empty(RANDOM_FLIPS)
    for start in range(0, RANDOM_FLIPS, FLIP_BLOCK):
        rows = min(FLIP_BLOCK, RANDOM_FLIPS - start)
        packed = rng.integers(0, 256, size=(rows, (n + 7) // 8), dtype=np.uint8)
        bits = np.unpackbits(packed, axis=1, count=n)
        out[start : start + rows] = np.abs(2.0 * (bits @ d) - total) / n
    return out


# ---------------------------------------------------------------------------------------------
# power


def t_test_power(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of a two-sided paired t-test over n pairs to detect a mean log ratio `effect` when the per-pair
    log ratios have standard deviation `sd` (noncentral t)."""
    if n < 2 or sd <= 0:
        return math.nan if n < 2 else 1.0
    crit = t_quantile(1 - alpha / 2, n - 1)
    nc = math.sqrt(n) * abs(effect) / sd
    # P(T > crit) + P(T < -crit), T noncentral t with n - 1 degrees of freedom and noncentrality nc
    return float(1.0 - special.nctdtr(n - 1, nc, crit) + special.nctdtr(n - 1, nc, -crit))


def sd_interval(sd: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The chi-square interval of a normal SD estimated from n values (n - 1 degrees of freedom)."""
    if n < 2 or not math.isfinite(sd):
        return math.nan, math.nan
    tail = (1 - level) / 2
    dof = n - 1
    return sd * math.sqrt(dof / chi2_quantile(1 - tail, dof)), sd * math.sqrt(dof / chi2_quantile(tail, dof))


def pairs_needed(
    change: float,
    sd: float,
    power: float = POWER,
    alpha: float = ALPHA,
    floor: int = MIN_PAIRS,
    cap: int = MAX_PAIRS_SHOWN,
) -> int | None:
    """The fewest run pairs (never below `floor`) at which a paired t-test on log ratios detects a
    relative change `change` (0.02 = 2%) with the given power; None beyond `cap` or when sd is unknown."""
    if not math.isfinite(sd) or sd < 0:
        return None
    effect = math.log1p(change)
    if sd == 0:
        return floor
    z = float(special.ndtri(1 - alpha / 2) + special.ndtri(power))
    lo = max(floor, 2, int((z * sd / effect) ** 2) - 1)  # the normal approximation: never above the answer
    if lo > cap:
        return None
    if t_test_power(lo, effect, sd, alpha) >= power:
        return lo
    hi = lo  # power grows with n: double until it is reached, then bisect to the fewest pairs
    while t_test_power(hi, effect, sd, alpha) < power:
        lo, hi = hi, hi * 2
        if lo > cap:
            return None
    while hi - lo > 1:  # power(lo) < target <= power(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if t_test_power(mid, effect, sd, alpha) >= power else (mid, hi)
    return hi if hi <= cap else None
