"""Unit tests of analysis.stats: bootstrap sums, intervals, the sign-flip test and the verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis.itl import weighted_percentile, weighted_percentiles
from analysis.metrics import union_length
from analysis.stats import (
    MIN_PAIRS,
    Change,
    bootstrap_sums,
    chi2_quantile,
    paired_change,
    pairs_needed,
    percentile_interval,
    sd_interval,
    sign_flip_pvalue,
    t_quantile,
    t_test_power,
)
from analysis.tables import fmt_pairs


def test_bootstrap_sums_equal_brute_force_resampling():
    rng_matrix = np.random.default_rng(3)
    matrix = rng_matrix.integers(0, 100, size=(7, 3)).astype(float)
    got = bootstrap_sums(matrix, 50, np.random.default_rng(11))
    (stream,) = np.random.default_rng(11).spawn(1)  # one chunk: the first child stream draws everything
    idx = stream.integers(0, 7, size=(50, 7), dtype=np.int32)
    want = matrix[idx].sum(axis=1)
    np.testing.assert_allclose(got, want)


def test_bootstrap_sums_in_chunks_are_reproducible_resamples(monkeypatch):
    import analysis.stats as stats  # noqa: PLC0415

    matrix = np.arange(40, dtype=float).reshape(10, 4)
    monkeypatch.setattr(stats, "_MAX_CELLS", 25)  # chunks of 2 resamples, drawn by a helper thread
    first = stats.bootstrap_sums(matrix, 31, np.random.default_rng(5))
    again = stats.bootstrap_sums(matrix, 31, np.random.default_rng(5))
    np.testing.assert_array_equal(first, again)
    streams = np.random.default_rng(5).spawn(16)
    want = np.concatenate([matrix[s.integers(0, 10, size=(2, 10), dtype=np.int32)].sum(axis=1) for s in streams])
    np.testing.assert_allclose(first, want[:31])


def test_percentile_interval_ignores_non_finite_replicates():
    samples = np.concatenate([np.arange(101, dtype=float), [np.nan, np.inf]])
    assert percentile_interval(samples) == pytest.approx((2.5, 97.5))
    assert all(math.isnan(x) for x in percentile_interval(np.array([np.nan])))


@pytest.mark.parametrize(
    ("d", "p"),
    [
        ([1.0, 2.0, 3.0], 2 / 8),  # only all-plus and all-minus reach |mean| = 2
        ([1.0, -1.0], 1.0),  # mean 0: every sign vector is as extreme
        ([1.0] * 6, 2 / 64),
        # |sum| >= 0.8 of magnitudes 0.5, 0.1, 0.2, 0.4: none flipped (1.2), 0.1 flipped (1.0), 0.2 flipped
        # (0.8, the observed one); each also all negated: 6 of 16
        ([0.5, 0.1, -0.2, 0.4], 6 / 16),
    ],
)
def test_sign_flip_exact_p_values(d, p):
    got, exact = sign_flip_pvalue(np.array(d), np.random.default_rng(0))
    assert exact and got == pytest.approx(p)


def test_sign_flip_uses_random_flips_beyond_sixteen_pairs():
    p, exact = sign_flip_pvalue(np.ones(20), np.random.default_rng(0))
    assert not exact and p < 1e-3


@pytest.mark.parametrize(("n", "too_few"), [(1, True), (5, True), (6, False), (10, False)])
def test_too_few_pairs_for_p_below_five_percent(n, too_few):
    c = Change(0.1, 0.05, 0.15, n, "run pairs", p_value=2.0 ** (1 - n))
    assert c.min_p == pytest.approx(2.0 ** (1 - n))
    assert c.too_few_pairs is too_few
    assert c.significant  # the interval decides; the sign-flip p only says whether it agrees
    assert c.sign_flip_disagrees is too_few


def test_verdicts():
    assert Change(0.02, 0.01, 0.03, 30, "items").significant
    assert not Change(0.02, -0.01, 0.03, 30, "items").significant  # interval covers zero
    assert not Change(0.02, math.nan, math.nan, 1, "items").significant  # no interval
    assert Change(0.02, 0.01, 0.03, 8, "run pairs", p_value=0.07).significant  # the t-interval decides
    assert Change(0.02, 0.01, 0.03, 8, "run pairs", p_value=0.07).sign_flip_disagrees
    assert not Change(0.02, -0.01, 0.03, 8, "run pairs", p_value=0.03).significant


def simulated_power(n: int, effect: float, sd: float, sims: int, both: bool) -> float:
    """Share of simulated campaigns (n normal log pair ratios) the report calls significant; `both`: the old
    rule (t-interval excludes zero AND exact sign-flip p < 0.05)."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(sims):
        d = rng.normal(effect, sd, n)
        pairs = np.column_stack([np.exp(d), np.ones(n), np.ones(n), np.ones(n)])
        c = paired_change(pairs, rng)
        hits += c.significant and (not both or c.p_value < 0.05)
    return hits / sims


def test_the_significance_rule_has_the_power_the_power_table_states():
    """At the pairs the Power table gives for a 5% change (80% power), the report's rule rejects in 80% of
    simulated campaigns (within 4 standard errors of 2,000 draws); the old two-test rule fell short (about
    61%: at 6 pairs the sign-flip test needs all six pairs to agree in sign)."""
    sd = 0.034  # 80.02% power at 6 pairs
    n = pairs_needed(0.05, sd)
    assert n == MIN_PAIRS
    sims, effect = 2000, math.log1p(0.05)
    want = t_test_power(n, effect, sd)
    got = simulated_power(n, effect, sd, sims, both=False)
    assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / sims), (got, want)
    assert simulated_power(n, effect, sd, sims, both=True) < want - 0.1


def test_paired_change_of_identical_arms_is_zero_and_not_significant():
    pairs = np.array([[10.0, 2.0, 10.0, 2.0], [12.0, 3.0, 12.0, 3.0], [9.0, 1.0, 9.0, 1.0]] * 2)
    c = paired_change(pairs, np.random.default_rng(0))
    assert c.n == 6 and (c.estimate, c.lo, c.hi) == (0.0, 0.0, 0.0)
    assert c.p_value == 1.0 and not c.significant


def test_paired_change_is_the_geometric_mean_of_pair_ratios():
    # throughput pairs: (tokens_b, window_b, tokens_a, window_a)
    pairs = np.array([[72.0, 3.5, 50.0, 4.5], [70.0, 3.5, 50.0, 3.5]])
    c = paired_change(pairs, np.random.default_rng(1))
    r1, r2 = (72 / 3.5) / (50 / 4.5), (70 / 3.5) / (50 / 3.5)
    assert c.estimate == pytest.approx(math.sqrt(r1 * r2) - 1)
    assert (c.range_lo, c.range_hi) == (pytest.approx(r2 - 1), pytest.approx(r1 - 1))
    assert not c.has_interval and c.p_value == pytest.approx(0.5) and c.n == 2


def test_five_pairs_give_the_range_and_no_interval():
    ratios = np.array([1.10, 1.02, 1.05, 1.08, 1.04])
    pairs = np.column_stack([ratios, np.ones(5), np.ones(5), np.ones(5)])
    c = paired_change(pairs, np.random.default_rng(0))
    assert c.n == 5 < MIN_PAIRS and c.below_minimum
    assert not c.has_interval and not c.significant  # all five faster, yet p = 2/32 = 0.0625 at best
    assert c.p_value == pytest.approx(2 / 32)
    assert (c.range_lo, c.range_hi) == (pytest.approx(0.02), pytest.approx(0.10))
    assert c.estimate == pytest.approx(np.exp(np.mean(np.log(ratios))) - 1)


def test_six_pairs_give_a_t_interval_on_log_ratios_holding_the_estimate():
    ratios = np.array([1.10, 1.02, 1.05, 1.08, 1.04, 1.06])
    pairs = np.column_stack([ratios, np.ones(6), np.ones(6), np.ones(6)])
    c = paired_change(pairs, np.random.default_rng(0))
    d = np.log(ratios)  # by hand: mean +- t(0.975, 5) sd / sqrt(6), t(0.975, 5) = 2.5706
    half = 2.570582 * d.std(ddof=1) / math.sqrt(6)
    assert (c.lo, c.hi) == (
        pytest.approx(math.expm1(d.mean() - half), rel=1e-6),
        pytest.approx(math.expm1(d.mean() + half), rel=1e-6),
    )
    assert c.lo < c.estimate < c.hi
    assert c.p_value == pytest.approx(2 / 64) and c.significant  # all six faster: the exact p is 2/2^6


def test_paired_change_drops_pairs_with_missing_values():
    pairs = np.array([[1.0, 1.0, 1.0, 1.0], [np.nan, 1.0, 1.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    c = paired_change(pairs, np.random.default_rng(0), flagged=np.array([True, True, False]))
    assert c.n == 1 and not c.has_interval and c.flagged == 1


@pytest.mark.parametrize(("effect_size", "pairs"), [(1.0, 10), (0.8, 15), (0.5, 34)])
def test_pairs_needed_match_the_textbook_paired_t_test_table(effect_size, pairs):
    """Cohen's table for a two-sided one-sample (paired) t-test at 0.05 and 80% power: d = 1 needs 10,
    d = 0.8 needs 15, d = 0.5 needs 34. Here d = log(1.02) / sd."""
    sd = math.log1p(0.02) / effect_size
    assert pairs_needed(0.02, sd) == pairs
    assert t_test_power(pairs, math.log1p(0.02), sd) >= 0.8 > t_test_power(pairs - 1, math.log1p(0.02), sd)


@pytest.mark.parametrize("sd", [0.0412, 0.0925, 0.1337, 0.2718, 0.5])
def test_pairs_needed_is_the_fewest_also_above_a_thousand_pairs(sd):
    """Exact at any size (the old search stepped by n // 200 above 1,000 pairs and overshot, e.g. 2,669
    printed where 2,660 was the fewest): scipy's power reaches 80% at n and not at n - 1."""
    for change in (0.01, 0.02, 0.05):
        n = pairs_needed(change, sd)
        if n is None or n == MIN_PAIRS:
            continue
        effect = math.log1p(change)
        assert t_test_power(n, effect, sd) >= 0.8 > t_test_power(n - 1, effect, sd), (change, sd, n)
    assert pairs_needed(0.01, 0.1337) > 1000  # the range the old search got wrong


def test_an_sd_from_three_pairs_leaves_pairs_needed_uncertain_by_0_3_to_40():
    lo, hi = sd_interval(1.0, 3)  # chi-square with 2 degrees of freedom
    assert lo == pytest.approx(math.sqrt(2 / sps.chi2.ppf(0.975, 2))) and hi == pytest.approx(
        math.sqrt(2 / sps.chi2.ppf(0.025, 2))
    )
    assert lo**2 == pytest.approx(0.271, abs=1e-3) and hi**2 == pytest.approx(39.5, abs=0.1)
    n, n_lo, n_hi = (pairs_needed(0.02, 0.05 * x) for x in (1.0, lo, hi))
    assert n_lo < n < n_hi  # fmt_pairs shows all three: the report never prints the middle one alone
    assert fmt_pairs(n, n_lo, n_hi) == f"{n:,} (95%: {n_lo:,} to {n_hi:,})"


def test_power_by_hand_from_the_noncentral_t():
    # n = 10, effect/sd = 1: nc = sqrt(10), crit = t(0.975, 9) = 2.2622; power = P(T' > 2.2622) + P(T' < -2.2622)
    crit = sps.t.ppf(0.975, 9)
    want = sps.nct.sf(crit, 9, math.sqrt(10)) + sps.nct.cdf(-crit, 9, math.sqrt(10))
    assert t_test_power(10, 0.01, 0.01) == pytest.approx(want) == pytest.approx(0.8031, abs=1e-4)


@pytest.mark.parametrize("dof", [1, 2, 5, 9, 30, 1000])
def test_the_quantiles_are_scipy_stats_own_and_the_power_within_float_rounding(dof):
    """analysis.stats calls scipy.special (scipy.stats costs 1.4 s to import in every report process): the same
    functions scipy.stats.t / chi2 call, so the quantiles are bitwise scipy.stats'; the power is 1 - cdf where
    scipy.stats uses its sf, equal to rounding."""
    for q in (0.025, 0.5, 0.8, 0.975):
        assert t_quantile(q, dof) == sps.t.ppf(q, dof) and chi2_quantile(q, dof) == sps.chi2.ppf(q, dof)
    for nc in (0.3, 2.8, 6.0):
        crit = sps.t.ppf(0.975, dof)
        want = sps.nct.sf(crit, dof, nc) + sps.nct.cdf(-crit, dof, nc)
        assert t_test_power(dof + 1, nc / math.sqrt(dof + 1), 1.0) == pytest.approx(want, abs=1e-15)


def test_pairs_needed_never_below_min_pairs_and_none_beyond_the_cap():
    assert pairs_needed(0.05, 0.0001) == MIN_PAIRS
    assert pairs_needed(0.01, 0.0) == MIN_PAIRS
    assert pairs_needed(0.01, 5.0) is None
    assert pairs_needed(0.01, math.nan) is None


def test_weighted_percentile_equals_the_percentile_of_the_repeated_values():
    rng = np.random.default_rng(4)
    for _ in range(20):
        values = rng.normal(size=7)
        weights = rng.integers(0, 5, size=7).astype(float)
        if weights.sum() == 0:
            continue
        for q in (0, 10, 50, 90, 99, 100):
            want = np.percentile(np.repeat(values, weights.astype(int)), q)
            assert weighted_percentile(values, weights, q) == pytest.approx(want)
    assert math.isnan(weighted_percentile(np.array([]), np.array([]), 50))


def test_union_length_counts_overlaps_once_and_skips_gaps():
    # [0, 2] and [1, 3] merge to [0, 3]; [5, 6] adds 1; [5.5, 5.8] is inside; [7, 7] is empty
    start = np.array([1.0, 0.0, 5.0, 5.5, 7.0])
    end = np.array([3.0, 2.0, 6.0, 5.8, 7.0])
    assert union_length(start, end) == pytest.approx(4.0)
    assert union_length(np.array([np.nan]), np.array([1.0])) == 0.0


def test_itl_sort_packed_keys_and_float_fallback_give_the_weighted_percentiles():
    from analysis.itl import PERCENTILES, Itl, group_by_run, weighted_percentiles  # noqa: PLC0415

    rng = np.random.default_rng(5)
    run = np.repeat(np.arange(3, dtype=np.int32), 50)
    gap = rng.integers(1, 10**6, 150)
    for tokens, packed in ((rng.integers(1, 9, 150), True), (np.r_[2**20, rng.integers(1, 9, 149)], False)):
        s = group_by_run(Itl(run, gap, tokens), 3)
        assert (s.keys is not None) is packed
        value = gap / 1e6 / tokens
        for r in range(3):
            mine = run == r
            want = weighted_percentiles(value[mine], tokens[mine].astype(float), PERCENTILES)
            assert s.run_percentiles(r, PERCENTILES) == pytest.approx(want, abs=1e-9)  # to the nanosecond
        both = (run == 0) | (run == 2)
        got, count = s.pooled([0, 2], PERCENTILES)
        assert count == tokens[both].sum()
        assert got == pytest.approx(
            weighted_percentiles(value[both], tokens[both].astype(float), PERCENTILES), abs=1e-9
        )


def test_sign_flip_p_value_equals_scipys_exact_permutation_test():
    """The exact two-sided sign-flip p-value is scipy.stats.permutation_test's (one sample, signs flipped,
    all 2^n flips enumerated) on paired log ratios of various sizes and signs."""
    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 6, 8, 11):
        for shift in (0.0, 0.02, -0.05):
            d = rng.normal(shift, 0.03, size=n)
            ours, exact = sign_flip_pvalue(d, np.random.default_rng(0))
            ref = sps.permutation_test(
                (d,), np.mean, permutation_type="samples", alternative="two-sided", n_resamples=np.inf
            ).pvalue
            assert exact and ours == pytest.approx(ref, abs=1e-12), (n, shift, ours, ref)


def test_itl_in_one_pass_equals_the_general_path_and_selection_equals_sorting(monkeypatch):
    """itl_by_run (run by run, packed keys, percentiles by selection) gives what group_by_run(itl_values) gives,
    and its percentiles are those of the sorted keys: records of several runs, some unused, some without token
    counts, chunks without tokens, a negative gap, a run with no ITL at all, keys that tie; a value that does not
    pack takes the general path."""
    from analysis import itl  # noqa: PLC0415
    from analysis.itl import PERCENTILES, group_by_run, itl_by_run, itl_values, select_keys  # noqa: PLC0415
    from analysis.load import Chunks  # noqa: PLC0415

    monkeypatch.setattr(itl, "_SMALL", 16)  # selections that narrow several times before they sort
    rng = np.random.default_rng(11)
    n = 4000
    lengths = rng.integers(0, 12, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    us = np.concatenate([np.sort(rng.integers(0, 10**5, k)) for k in lengths]).astype(np.int64)
    k = int(np.flatnonzero(lengths >= 2)[0])
    us[offsets[k] + 1] = us[offsets[k]] - 7  # a clock that went back
    tok = rng.integers(0, 5, len(us)).astype(np.int64)  # zeros: chunks without tokens
    tok_present = rng.random(n) > 0.1
    tok[offsets[k] + 1], tok_present[k] = 3, True
    chunks = Chunks(offsets, us, np.ones(n, bool), offsets, tok, tok_present)
    run_of_record = np.repeat(np.arange(5), n // 5)
    run_of_record[run_of_record == 3] = 4  # run 3: nothing
    rows = np.union1d(np.flatnonzero(rng.random(n) > 0.2), [k])
    fast = itl_by_run(chunks, rows, run_of_record[rows], 6)
    slow = group_by_run(itl_values(chunks, rows, run_of_record[rows]), 6)
    assert fast.keys is not None and slow.keys is not None and np.array_equal(fast.bounds, slow.bounds)
    assert np.array_equal(fast.keys, slow.keys)
    mask = (1 << 20) - 1
    for runs in ([0], [1], [3], [0, 2, 4], [0, 1, 2, 3, 4, 5]):
        keys = np.sort(np.concatenate([slow.keys[slow.bounds[r] : slow.bounds[r + 1]] for r in runs]))
        value, weight = (keys >> 20) / 1e9, (keys & mask).astype(float)
        want = weighted_percentiles(value, weight, PERCENTILES, presorted=True)
        got, count = fast.pooled(runs, PERCENTILES)
        assert count == int(weight.sum())
        np.testing.assert_array_equal(got, want)  # exactly: the same keys, found without sorting them all
        if len(runs) == 1:
            np.testing.assert_array_equal(fast.run_percentiles(runs[0], PERCENTILES), want)
        if len(keys):
            every = np.arange(0, int(weight.sum()), 997)
            parts = [fast.keys[fast.bounds[r] : fast.bounds[r + 1]] for r in runs]
            np.testing.assert_array_equal(select_keys(parts, every), np.repeat(keys, keys & mask)[every])
    big = Chunks(offsets, us, np.ones(n, bool), offsets, np.where(tok > 0, 2**20, 0), tok_present)
    fallback = itl_by_run(big, rows, run_of_record[rows], 6)
    assert fallback.keys is None and fallback.values is not None


def test_selection_of_tied_keys_and_of_keys_within_one_bucket(monkeypatch):
    from analysis import itl  # noqa: PLC0415

    monkeypatch.setattr(itl, "_SMALL", 4)
    rng = np.random.default_rng(2)
    for keys in (
        (5 << 20) + rng.integers(1, 100, 1000),  # one ns value: every bucket is one key
        np.r_[np.full(300, (7 << 20) + 3), (rng.integers(-9, 9, 200) << 20) + 1],
    ):  # ties, negatives
        ordered = np.sort(keys)
        repeated = np.repeat(ordered, ordered & ((1 << 20) - 1))
        positions = np.arange(len(repeated))
        np.testing.assert_array_equal(itl.select_keys([keys[:400], keys[400:]], positions), repeated)
