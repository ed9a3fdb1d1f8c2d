"""Judging a canary (contract §8-9): the candidate serves a share of its task's live traffic beside
the active version, each record naming its arm. Once the canary has served
`canary_min_requests`, its live reward is compared with the active arm's over the same period
(the two arms draw from the same traffic), and so are the users' ratings where enough were given:
rolled back when the 95% interval of either difference lies wholly below zero (the canary is
worse beyond doubt), promoted otherwise (it already passed the gate and shadow replay; the
canary guards against a regression on live traffic). A canary that has not served enough when `canary_max_minutes` is up is rolled
back: too little traffic says nothing about it.

Where the team has labelled enough of the period's traffic (`MIN_LABELLED` records per arm whose
input carries a reference or correction), the reward compared is those records' answers scored
against their labels rather than the served (reference-free) score: the figures say which.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.datasets import input_hash
from common.records import Record
from common.rounds import CanaryRecord
from common.settings import Settings
from common.stats import difference_interval
from tasks import score, typed_input

MIN_RATINGS = 10  # ratings per arm before they are compared
MIN_LABELLED = 10  # labelled records per arm before the labels, not the served score, are compared


@dataclass
class Verdict:
    action: str  # wait, promote or rollback
    reason: str
    record: CanaryRecord  # the figures it read, with the action and the reason: kept with the version


def _verdict(action: str, reason: str, figures: dict) -> Verdict:
    return Verdict(action, reason, CanaryRecord(verdict=action, reason=reason, **figures))


def judge(records: list[Record], canary: str, started: float, min_requests: int, max_minutes: float,
          now: float | None = None, labelled: Callable[[Record], float | None] | None = None) -> Verdict:
    """`labelled(record)` is the record's answer scored against its label, or None without one."""
    now = time.time() if now is None else now
    records = [r for r in records if not r.answered_from]  # answered by a correction, not by either arm's model
    canary_arm = [r for r in records if r.arm == "canary" and r.adapter == canary]
    active_arm = [r for r in records if r.arm in ("active", "base")]
    figures = {"canary_requests": len(canary_arm), "active_requests": len(active_arm), "minutes": round((now - started) / 60, 2)}
    timed_out = now - started >= 60 * max_minutes
    if len(canary_arm) < min_requests or len(active_arm) < min_requests:
        if timed_out:
            return _verdict("rollback", f"after {max_minutes} min only {len(canary_arm)} canary and {len(active_arm)} active "
                                       f"requests (< {min_requests}): not enough to judge", figures)
        return _verdict("wait", f"{len(canary_arm)} of {min_requests} canary requests", figures)
    canary_rewards, active_rewards = [r.reward.total for r in canary_arm], [r.reward.total for r in active_arm]
    basis = "live reward"
    if labelled is not None:
        by_labels = [[x for x in map(labelled, arm) if x is not None] for arm in (canary_arm, active_arm)]
        figures.update(canary_labelled=len(by_labels[0]), active_labelled=len(by_labels[1]))
        if min(map(len, by_labels)) >= MIN_LABELLED:
            (canary_rewards, active_rewards), basis = by_labels, "reward by the team's labels"
    figures["basis"] = basis
    reward, low, high = difference_interval(canary_rewards, active_rewards)
    figures.update(reward_difference=round(reward, 4), reward_interval=(round(low, 4), round(high, 4)),
                   canary_reward=round(statistics.fmean(canary_rewards), 4), active_reward=round(statistics.fmean(active_rewards), 4))
    if high < 0:
        return _verdict("rollback", f"{basis} {reward:+.4f} vs active, 95% interval [{low:+.4f}, {high:+.4f}] "
                                   "wholly below zero", figures)
    rated = {arm: [r.feedback.rating for r in rs if r.feedback and r.feedback.rating in (-1, 1)]
             for arm, rs in (("canary", canary_arm), ("active", active_arm))}
    if all(len(v) >= MIN_RATINGS for v in rated.values()):
        rating, r_low, r_high = difference_interval([float(x) for x in rated["canary"]], [float(x) for x in rated["active"]])
        figures.update(rating_difference=round(rating, 4), rating_interval=(round(r_low, 4), round(r_high, 4)))
        if r_high < 0:
            return _verdict("rollback", f"ratings {rating:+.3f} vs active, 95% interval [{r_low:+.3f}, {r_high:+.3f}] "
                                       "wholly below zero", figures)
    return _verdict("promote", f"{basis} {reward:+.4f} vs active, 95% interval [{low:+.4f}, {high:+.4f}]: not worse, "
                              f"over {len(canary_arm)} canary requests", figures)


def labelled_scorer(settings: Settings, store, task: str, since: float) -> Callable[[Record], float | None]:
    """A record's answer scored against the team's label of its input (a reference or a
    correction), or None where its input has none: what `judge` compares once enough are labelled.
    Only labels no round trained the canary on count: the team's eval share, and labels that came
    after the canary started."""
    answers = {label.input_hash: label.answer for label in store.labels(task)
               if label.answer is not None and (label.split == "eval" or label.time >= since)}

    def scored(record: Record) -> float | None:
        answer = answers.get(input_hash(task, record.input))
        return None if answer is None else score(task, record.raw, answer, settings.reward_context(typed_input(task, record.input))).total

    return scored
