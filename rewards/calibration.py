"""How far the served score can be trusted: on labelled answers, the served (reference-free)
score against the reference score of the same answer, and against the team's verdicts.

Two measures, each with its count:
- `rank_correlation`: Spearman's rho between the served score and the reference score of the
  answers that have a reference or correction. 1 is a served score that ranks answers exactly as
  the labels do; near 0, the served score says nothing of whether an answer is right.
- `separation`: the probability that an answer the team liked (rating +1) has a higher served
  score than one it corrected or disliked (the area under the ROC curve, from the Mann-Whitney U
  statistic); 0.5 is a coin.

`weak` says when the served score should not be read as a measure of quality: a rank correlation
below `WEAK_BELOW`, or a separation below `WEAK_BELOW`, where each has at least `MIN_PAIRS`.
Pure functions: the caller scores the answers (`pairs_of`) with `tasks.score`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

MIN_PAIRS = 10  # fewer labelled answers than this measure nothing
WEAK_BELOW = 0.7


class Pair(NamedTuple):
    served: float  # the reference-free score of the answer
    reference: float | None  # the same answer scored with its label's reference, when it has one
    verdict: str | None  # "liked", "corrected" or None


class Calibration(NamedTuple):
    n: int  # answers with a reference
    rank_correlation: float | None
    liked: int
    corrected: int
    separation: float | None
    weak: bool | None  # None: too few labels to say

    def as_dict(self) -> dict:
        return self._asdict()


def _finite(value: float) -> float | None:
    return round(float(value), 4) if math.isfinite(value) else None


def calibrate(pairs: Iterable[Pair]) -> Calibration:
    from scipy.stats import mannwhitneyu, spearmanr  # 1.3 s to import; every process that imports the gateway would pay it

    pairs = list(pairs)
    with_reference = [(p.served, p.reference) for p in pairs if p.reference is not None]
    rho = None
    if len(with_reference) >= MIN_PAIRS:
        served, reference = zip(*with_reference, strict=True)
        rho = _finite(spearmanr(served, reference).statistic) if len(set(served)) > 1 and len(set(reference)) > 1 else 0.0
    liked = [p.served for p in pairs if p.verdict == "liked"]
    corrected = [p.served for p in pairs if p.verdict == "corrected"]
    separation = None
    if len(liked) + len(corrected) >= MIN_PAIRS and liked and corrected:
        u = mannwhitneyu(liked, corrected, alternative="two-sided").statistic
        separation = _finite(u / (len(liked) * len(corrected)))
    measured = [m for m in (rho, separation) if m is not None]
    weak = None if not measured else any(m < WEAK_BELOW for m in measured)
    return Calibration(len(with_reference), rho, len(liked), len(corrected), separation, weak)


def verdict(answer_source: str | None, rating: int | None) -> str | None:
    """What the team said of a served answer: corrected (a correction, or a dislike), liked, or nothing."""
    if answer_source == "correction" or (rating is not None and rating < 0):
        return "corrected"
    return "liked" if rating is not None and rating > 0 else None


def pairs_of(labels: Iterable, score: Callable[[str, object, dict], float]) -> list[Pair]:
    """A pair per label that has an answer or a rating; `score(completion, reference, input)` gives a
    total (reference None: the served score)."""
    return [Pair(score(label.served, None, label.input),
                 score(label.served, label.answer, label.input) if label.answer is not None else None,
                 verdict(label.answer_source, label.rating))
            for label in labels if label.answer is not None or label.rating is not None]
