"""Judging a canary (PRODUCT §8-9): the candidate serves a share of its task's live traffic beside
the active version, each record naming its arm. Once the canary has served
`canary_min_requests`, its live reward is compared with the active arm's over the same period
(the two arms draw from the same traffic), and so are the users' ratings where enough were given:
rolled back when the 95% interval of either difference lies wholly below zero (the canary is
worse beyond doubt), promoted otherwise (it already passed the gate and shadow replay; the
canary guards against a regression on live traffic). A canary that has not served enough when `canary_max_minutes` is up is rolled
back: too little traffic says nothing about it.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from common.records import Record

MIN_RATINGS = 10  # ratings per arm before they are compared
RESAMPLES = 2000


@dataclass
class Verdict:
    action: str  # wait, promote or rollback
    reason: str
    figures: dict


def difference_interval(a: list[float], b: list[float], seed: int = 0) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% percentile-bootstrap interval (independent samples)."""
    rng = random.Random(seed)
    diffs = sorted(statistics.fmean(rng.choices(a, k=len(a))) - statistics.fmean(rng.choices(b, k=len(b)))
                   for _ in range(RESAMPLES))
    return statistics.fmean(a) - statistics.fmean(b), diffs[int(0.025 * RESAMPLES)], diffs[int(0.975 * RESAMPLES) - 1]


def judge(records: list[Record], canary: str, started: float, min_requests: int, max_minutes: float,
          now: float | None = None) -> Verdict:
    now = time.time() if now is None else now
    canary_arm = [r for r in records if r.arm == "canary" and r.adapter == canary]
    active_arm = [r for r in records if r.arm in ("active", "base")]
    figures = {"canary_requests": len(canary_arm), "active_requests": len(active_arm), "minutes": round((now - started) / 60, 2)}
    timed_out = now - started >= 60 * max_minutes
    if len(canary_arm) < min_requests or len(active_arm) < min_requests:
        if timed_out:
            return Verdict("rollback", f"after {max_minutes} min only {len(canary_arm)} canary and {len(active_arm)} active "
                                       f"requests (< {min_requests}): not enough to judge", figures)
        return Verdict("wait", f"{len(canary_arm)} of {min_requests} canary requests", figures)
    reward, low, high = difference_interval([r.reward.total for r in canary_arm], [r.reward.total for r in active_arm])
    figures.update(reward_difference=round(reward, 4), reward_interval=[round(low, 4), round(high, 4)],
                   canary_reward=round(statistics.fmean(r.reward.total for r in canary_arm), 4),
                   active_reward=round(statistics.fmean(r.reward.total for r in active_arm), 4))
    if high < 0:
        return Verdict("rollback", f"live reward {reward:+.4f} vs active, 95% interval [{low:+.4f}, {high:+.4f}] "
                                   "wholly below zero", figures)
    rated = {arm: [r.feedback.rating for r in rs if r.feedback and r.feedback.rating in (-1, 1)]
             for arm, rs in (("canary", canary_arm), ("active", active_arm))}
    if all(len(v) >= MIN_RATINGS for v in rated.values()):
        rating, r_low, r_high = difference_interval([float(x) for x in rated["canary"]], [float(x) for x in rated["active"]])
        figures.update(rating_difference=round(rating, 4), rating_interval=[round(r_low, 4), round(r_high, 4)])
        if r_high < 0:
            return Verdict("rollback", f"ratings {rating:+.3f} vs active, 95% interval [{r_low:+.3f}, {r_high:+.3f}] "
                                       "wholly below zero", figures)
    return Verdict("promote", f"live reward {reward:+.4f} vs active, 95% interval [{low:+.4f}, {high:+.4f}]: not worse, "
                              f"over {len(canary_arm)} canary requests", figures)
