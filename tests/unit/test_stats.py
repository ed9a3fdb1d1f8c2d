"""The one home of intervals (common/stats.py): each interval holds its estimate, covers the truth
about as often as it says, narrows with more data, and answers a sample without spread with the
degenerate interval instead of NaN."""
from __future__ import annotations

import random

import numpy as np
import pytest

from common.stats import block_interval, difference_interval, mean_interval, percentile, rank_correlation_interval, ratio_interval


def test_a_mean_interval_covers_the_true_mean_about_as_often_as_it_says():
    covered = 0
    for seed in range(200):
        sample = np.random.default_rng(seed).normal(0.3, 0.1, size=40)
        _, low, high = mean_interval(sample, resamples=500, seed=seed)
        covered += low <= 0.3 <= high
    assert 0.88 * 200 <= covered <= 0.99 * 200, covered  # the percentile bootstrap runs a little narrow at n = 40


def test_more_rows_narrow_the_interval_and_the_estimate_sits_inside():
    rng = random.Random(1)
    small = [rng.gauss(0, 1) for _ in range(20)]
    large = small + [rng.gauss(0, 1) for _ in range(300)]
    (m1, l1, h1), (m2, l2, h2) = mean_interval(small), mean_interval(large)
    assert l1 <= m1 <= h1 and l2 <= m2 <= h2
    assert h2 - l2 < (h1 - l1) / 2


def test_a_higher_level_is_wider_and_the_same_seed_gives_the_same_interval():
    rng = random.Random(2)
    sample = [rng.random() for _ in range(50)]
    _, l95, h95 = mean_interval(sample)
    _, l99, h99 = mean_interval(sample, level=0.9973)  # 20,000 resamples, so that each tail holds 27
    assert l99 < l95 and h99 > h95
    assert mean_interval(sample, seed=7) == mean_interval(sample, seed=7)


def test_samples_without_spread_and_empty_ones():
    assert mean_interval([]) == (0.0, 0.0, 0.0)
    assert mean_interval([0.1] * 30) == pytest.approx((0.1, 0.1, 0.1))
    assert mean_interval([0.4]) == (0.4, 0.4, 0.4)
    assert difference_interval([1.0] * 5, [0.5] * 7) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="both sides"):
        difference_interval([], [1.0])
    assert block_interval([[1.0, 2.0]], lambda blocks: sum(map(sum, blocks))) == (3.0, 3.0)
    assert ratio_interval([2.0] * 4, [1.0] * 3) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="not 0"):
        ratio_interval([1.0], [0.0])


def test_a_ratio_of_two_samples_means_and_its_interval():
    rng = np.random.default_rng(4)
    slow, fast = rng.normal(11.0, 1.5, 40), rng.normal(5.0, 0.8, 40)
    ratio, low, high = ratio_interval(slow, fast)
    assert ratio == pytest.approx(slow.mean() / fast.mean()) and low < ratio < high
    assert low > 1.8 and high < 2.6  # about 2.2, each side's spread carried into it


def test_a_difference_of_independent_means_separates_a_real_gap_and_not_noise():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.6, 0.1, 60), rng.normal(0.5, 0.1, 45)
    difference, low, high = difference_interval(a, b)
    assert difference == pytest.approx(a.mean() - b.mean()) and 0.0 < low < difference < high
    same = rng.normal(0.5, 0.1, 50)
    _, low, high = difference_interval(same, rng.normal(0.5, 0.1, 50))
    assert low < 0.0 < high


def test_block_intervals_resample_whole_blocks():
    # blocks whose values move together: resampling blocks sees their spread, resampling values would not
    rng = random.Random(4)
    blocks = [[level + rng.gauss(0, 0.01) for _ in range(50)] for level in (rng.gauss(0, 1) for _ in range(12))]
    low, high = block_interval(blocks, lambda chosen: float(np.mean([v for block in chosen for v in block])))
    _, value_low, value_high = mean_interval([v for block in blocks for v in block])
    assert high - low > 5 * (value_high - value_low)


def test_a_rank_correlation_interval_is_spearmans_rho_over_resampled_pairs():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(5)
    served = rng.random(40).round(1)  # rounded: ties, as scores have
    reference = (served + rng.normal(0, 0.3, 40)).round(1)
    rho, low, high = rank_correlation_interval(served, reference, resamples=300, seed=2)
    assert rho == pytest.approx(spearmanr(served, reference).statistic, abs=1e-12) and low < rho < high
    # the same pairs drawn as blocks, with scipy's spearmanr on each resample, give the same interval
    pairs = list(zip(served, reference))
    assert (low, high) == pytest.approx(block_interval(pairs, lambda chosen: spearmanr(*zip(*chosen)).statistic, resamples=300, seed=2),
                                        abs=1e-9)
    assert rank_correlation_interval(served, served)[:2] == pytest.approx((1.0, 1.0))
    constant = rank_correlation_interval([0.5] * 10, reference[:10])
    assert all(np.isnan(v) for v in constant)  # no spread on one side: no correlation to state


def test_a_rank_correlation_whose_references_mostly_tie_keeps_an_interval_over_the_resamples_where_it_is_defined():
    """sql-v1's held-out answers in run 34: 37 of 40 scored alike by the references. About 4% of
    resamples draw none of the other 3 and have no correlation; the interval is over the rest,
    not the point estimate twice. Where most resamples are undefined, no interval is stated."""
    rng = np.random.default_rng(7)
    served = rng.random(40).round(2)
    reference = np.full(40, 0.15)
    reference[[3, 17, 29]] = [1.0, 1.0, 0.0]
    rho, low, high = rank_correlation_interval(served, reference, resamples=2000, seed=1)
    assert not np.isnan(rho) and low < high and low <= rho <= high
    rare = np.full(40, 0.15)
    rare[5] = 1.0  # one row of 40: most resamples miss it
    assert all(np.isnan(v) for v in rank_correlation_interval(served, rare, resamples=2000, seed=1)[1:])
    with pytest.raises(ValueError, match="two pairs"):
        rank_correlation_interval([0.1], [0.2])


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([5], 0.99) == 5.0
    assert percentile(list(range(101)), 0.99) == 99.0


def test_a_wider_level_draws_enough_resamples_for_its_tails():
    from common.stats import RESAMPLES, resamples_for

    assert resamples_for(0.95) == RESAMPLES == 2000
    assert resamples_for(0.9973) == 20_000  # the gate's early-win level: 27 resamples in its 0.135% tail
