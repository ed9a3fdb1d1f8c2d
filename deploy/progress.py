"""Progress where people look. On a terminal the CLI draws rich's bar; elsewhere (a supervisor's
log, a container's stdout, `tucano serve > serve.log`) a bar draws nothing, so `ProgressLines`
prints plain lines instead: one when a stage starts, then one each time a long stage passes
another tenth, each with the time spent and the time left.

The time left is the stages' expected seconds (`weights`; the bootstrap's are measured on two
cores, a round's are what the last round took) scaled by how fast this machine has gone so far;
without weights, the stage's own pace.

`publish`, where given, receives the same account as a typed `JobProgress` at most once a second
(and at every new stage): `tucano train` hands the store's, so `/readyz`, `/v1/stats` and the
dashboard show a running round where it stands.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from common.records import JobProgress

LONG_STAGE_S = 60.0  # a stage expected to take this long gets a line every tenth
TENTHS = 10  # a long stage gets a line each time it passes another tenth
PUBLISH_EVERY_S = 1.0


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class ProgressLines:
    """A progress callback `(stage, completed, total)` that prints plain lines through `say`."""

    def __init__(self, job: str, say: Callable[[str], None], weights: dict[str, float] | None = None,
                 clock: Callable[[], float] = time.monotonic, publish: Callable[[JobProgress], None] | None = None):
        self.job, self.say, self.clock, self.publish = job, say, clock, publish
        self.published = -math.inf
        self.weights = dict(weights or {})
        order = list(self.weights)
        self.offsets = {stage: sum(self.weights[s] for s in order[:i]) for i, stage in enumerate(order)}
        self.total = sum(self.weights.values())
        self.started = clock()
        self.stage: str | None = None
        self.stage_started = self.started
        self.next_tenth = 1  # in tenths

    def __call__(self, stage: str, completed: float, total: float) -> None:
        share = min(1.0, completed / total) if total else 0.0
        now = self.clock()
        if stage != self.stage:
            self.stage, self.stage_started, self.next_tenth = stage, now, 1
            self.say(self._account(stage, share, now, "started").text)
            self._publish(stage, share, now, force=True)
            return
        tenths = math.floor(share * TENTHS + 1e-9)
        if self._long(stage) and self.next_tenth <= tenths < TENTHS:
            self.next_tenth = tenths + 1
            self.say(self._account(stage, share, now, f"{share:.0%}").text)
        self._publish(stage, share, now)

    def _publish(self, stage: str, share: float, now: float, force: bool = False) -> None:
        if self.publish is not None and (force or now - self.published >= PUBLISH_EVERY_S):
            self.published = now
            self.publish(self._account(stage, share, now, f"{share:.0%}"))

    def _long(self, stage: str) -> bool:
        return stage not in self.weights or self.weights[stage] >= LONG_STAGE_S

    def _account(self, stage: str, share: float, now: float, what: str) -> JobProgress:
        spent = now - self.started
        line = f"{self.job}: {stage} {what}, {duration(spent)} spent"
        if stage in self.weights and self.total:
            overall = (self.offsets[stage] + self.weights[stage] * share) / self.total
            pace = spent / (overall * self.total) if overall > 0.02 else 1.0  # this machine's seconds per expected second
            left = pace * self.total * (1 - overall)
            return JobProgress(self.job, stage, round(overall, 4), True, round(spent, 1), round(left, 1),
                               f"{line}, {overall:.0%} of the whole, about {duration(left)} left")
        if share > 0:
            left = (now - self.stage_started) * (1 - share) / share
            return JobProgress(self.job, stage, round(share, 4), False, round(spent, 1), round(left, 1),
                               f"{line}, about {duration(left)} left in this stage")
        return JobProgress(self.job, stage, 0.0, False, round(spent, 1), None, line)
