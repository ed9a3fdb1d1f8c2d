"""Bootstrap intervals, in one place: every decision (the gate, shadow replay, canaries) and every
benchmark table states its uncertainty with these, at one resampling count (more only where a
level's tails need it: `resamples_for`) and one percentile rule.

- `mean_interval`: the mean of one sample (a paired difference is one sample of differences).
- `difference_interval`: mean(a) - mean(b) of two independent samples (a canary's arm against
  the active arm's); `ratio_interval`: mean(a) / mean(b) of the same (one arm's step times over
  another's).
- `rank_correlation_interval`: Spearman's rho of paired samples, pairs resampled (the served
  score against the reference score of the same answers), over the resamples where it is defined.
- `block_interval`: any statistic of a list of blocks, whole blocks resampled. Requests of one
  block of a benchmark shared the machine's moment (and an engine's batch steps) and are not
  independent of one another, so the block is the unit that is drawn.

All five are `scipy.stats.bootstrap` with the percentile method; the first four vectorised, the
last over block indices with the statistic called per resample (scipy cannot resample Python
objects itself). Percentiles of a sample (a latency's p99, say) use `percentile`: numpy's linear
interpolation, the rule scipy's percentile intervals use too. A sample without spread gives the
degenerate interval [x, x] (scipy would answer NaN and warn).
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import bootstrap, rankdata

RESAMPLES = 2000
LEVEL = 0.95
# A resample of pairs whose one side has no spread has no rank correlation. Where answers mostly
# score alike (39 of 40 SQL answers that run, 2 that match), a few percent of resamples are such:
# the interval is taken over the others. Where more are, no interval is stated (NaN). Before,
# one such resample made scipy's interval NaN, and the point estimate was reported as [rho, rho].
MAX_UNDEFINED_RESAMPLES = 0.10
MIN_TAIL_DRAWS = 27  # resamples beyond each end of an interval, at the least: a 99.73% interval's 0.135% tail of 2000 would be 3


def resamples_for(level: float) -> int:
    """The resampling count of an interval at `level`: `RESAMPLES`, or more where the level's tails
    would hold fewer than `MIN_TAIL_DRAWS` resamples (20,000 at 99.73%)."""
    return max(RESAMPLES, math.ceil(MIN_TAIL_DRAWS / ((1 - level) / 2)))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `values`, linearly interpolated."""
    return float(np.quantile(np.asarray(values, dtype=float), q))


def _interval(data: tuple, statistic: Callable, estimate: float, level: float, resamples: int, seed: int,
              vectorized: bool, paired: bool = False) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate resample distribution: handled below
        result = bootstrap(data, statistic, n_resamples=resamples, confidence_level=level, method="percentile",
                           vectorized=vectorized, paired=paired, random_state=np.random.default_rng(seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if np.isnan(low) or np.isnan(high):
        return estimate, estimate
    return low, high


def mean_interval(values: Sequence[float], *, level: float = LEVEL, resamples: int | None = None,
                  seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its percentile-bootstrap interval at `level`; (0, 0, 0) when
    there are no values."""
    sample = np.asarray(values, dtype=float)
    if not len(sample):
        return 0.0, 0.0, 0.0
    mean = float(sample.mean())
    if len(sample) < 2 or np.ptp(sample) == 0:
        return mean, mean, mean
    low, high = _interval((sample,), np.mean, mean, level, resamples or resamples_for(level), seed, vectorized=True)
    return mean, low, high


def _difference_of_means(a, b, axis=-1):
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def difference_interval(a: Sequence[float], b: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                        seed: int = 0) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high), each sample resampled on its own (independent samples)."""
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(first) or not len(second):
        raise ValueError("a difference of means needs values on both sides")
    difference = float(first.mean() - second.mean())
    if (len(first) < 2 or np.ptp(first) == 0) and (len(second) < 2 or np.ptp(second) == 0):
        return difference, difference, difference
    low, high = _interval((first, second), _difference_of_means, difference, level, resamples, seed, vectorized=True)
    return difference, low, high


def _ratio_of_means(a, b, axis=-1):
    return np.mean(a, axis=axis) / np.mean(b, axis=axis)


def ratio_interval(a: Sequence[float], b: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = 0) -> tuple[float, float, float]:
    """(mean(a) / mean(b), low, high), each sample resampled on its own (independent samples of
    positive values: one arm's step times over another's)."""
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(first) or not len(second) or second.mean() == 0:
        raise ValueError("a ratio of means needs values on both sides, and a denominator that is not 0")
    ratio = float(first.mean() / second.mean())
    if (len(first) < 2 or np.ptp(first) == 0) and (len(second) < 2 or np.ptp(second) == 0):
        return ratio, ratio, ratio
    low, high = _interval((first, second), _ratio_of_means, ratio, level, resamples, seed, vectorized=True)
    return ratio, low, high


def _spearman(a, b, axis=-1):
    """Spearman's rho along `axis`: Pearson's r of the ranks (ties get their mean rank), as
    `scipy.stats.spearmanr` computes it, for every resample at once (spearmanr takes one pair of
    samples a call: 2,000 calls took 2 s per interval)."""
    ranks_a, ranks_b = rankdata(a, axis=axis), rankdata(b, axis=axis)
    ranks_a = ranks_a - ranks_a.mean(axis=axis, keepdims=True)
    ranks_b = ranks_b - ranks_b.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample without spread has no correlation: NaN
        return (ranks_a * ranks_b).sum(axis=axis) / np.sqrt((ranks_a**2).sum(axis=axis) * (ranks_b**2).sum(axis=axis))


def rank_correlation_interval(x: Sequence[float], y: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                              seed: int = 0) -> tuple[float, float, float]:
    """(rho, low, high): Spearman's rho of the pairs (x[i], y[i]) and its interval, pairs resampled."""
    first, second = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(first) != len(second) or len(first) < 2:
        raise ValueError("a rank correlation needs at least two pairs")
    rho = float(_spearman(first, second))
    if np.isnan(rho):
        return rho, rho, rho
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # resamples without spread on one side: counted below
        result = bootstrap((first, second), _spearman, n_resamples=resamples, confidence_level=level, method="percentile",
                           vectorized=True, paired=True, random_state=np.random.default_rng(seed))
    rhos = np.asarray(result.bootstrap_distribution, dtype=float)
    if np.isnan(rhos).mean() > MAX_UNDEFINED_RESAMPLES:
        return rho, math.nan, math.nan
    low, high = np.nanpercentile(rhos, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return rho, float(low), float(high)


def block_interval(blocks: Sequence[Any], statistic: Callable[[list], float], *, level: float = LEVEL,
                   resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """(low, high) of `statistic(blocks)` with whole blocks resampled; a block is anything the
    statistic reads (a block's latencies, a pair of blocks of two sides)."""
    if not blocks:
        raise ValueError("an interval over blocks needs at least one block")
    estimate = float(statistic(list(blocks)))
    if len(blocks) < 2:
        return estimate, estimate
    return _interval((np.arange(len(blocks)),), lambda chosen: statistic([blocks[i] for i in chosen]), estimate, level,
                     resamples, seed, vectorized=False)
