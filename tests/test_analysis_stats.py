"""Unit tests of analysis.stats: bootstrap sums, intervals, the sign-flip test and the verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.stats import (
    Change,
    bootstrap_sums,
    paired_change,
    percentile_interval,
    sign_flip_pvalue,
)


def test_bootstrap_sums_equal_brute_force_resampling():
    rng_matrix = np.random.default_rng(3)
    matrix = rng_matrix.integers(0, 100, size=(7, 3)).astype(float)
    got = bootstrap_sums(matrix, 50, np.random.default_rng(11))
    (stream,) = np.random.default_rng(11).spawn(1)  # one chunk: the first child stream draws everything
    idx = stream.integers(0, 7, size=(50, 7), dtype=np.int32)
    want = matrix[idx].sum(axis=1)
    np.testing.assert_allclose(got, want)


def test_bootstrap_sums_in_chunks_are_reproducible_resamples(monkeypatch):
    import analysis.stats as stats

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
    assert c.significant is (not too_few)


def test_verdicts():
    assert Change(0.02, 0.01, 0.03, 30, "items").significant
    assert not Change(0.02, -0.01, 0.03, 30, "items").significant  # interval covers zero
    assert not Change(0.02, math.nan, math.nan, 1, "items").significant  # no interval
    assert not Change(0.02, 0.01, 0.03, 8, "run pairs", p_value=0.07).significant  # p not below 0.05


def test_paired_change_of_identical_arms_is_zero_and_not_significant():
    pairs = np.array([[10.0, 2.0, 10.0, 2.0], [12.0, 3.0, 12.0, 3.0], [9.0, 1.0, 9.0, 1.0]])
    c = paired_change(pairs, 200, np.random.default_rng(0))
    assert (c.estimate, c.lo, c.hi) == (0.0, 0.0, 0.0)
    assert c.p_value == 1.0 and not c.significant


def test_paired_change_is_a_ratio_of_sums_over_pairs():
    # throughput pairs: (tokens_b, window_b, tokens_a, window_a)
    pairs = np.array([[72.0, 3.5, 50.0, 4.5], [70.0, 3.5, 50.0, 3.5]])
    c = paired_change(pairs, 500, np.random.default_rng(1))
    assert c.estimate == pytest.approx((142 / 7) / (100 / 8) - 1)
    # resamples: pair 1 twice, pair 2 twice, or both
    assert c.lo == pytest.approx((70 / 3.5) / (50 / 3.5) - 1)
    assert c.hi == pytest.approx((72 / 3.5) / (50 / 4.5) - 1)
    assert c.p_value == pytest.approx(0.5) and c.n == 2


def test_paired_change_drops_pairs_with_missing_values():
    pairs = np.array([[1.0, 1.0, 1.0, 1.0], [np.nan, 1.0, 1.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    c = paired_change(pairs, 10, np.random.default_rng(0))
    assert c.n == 1 and not c.has_interval
