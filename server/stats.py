"""Time series of served traffic for `/v1/stats` (the dashboard's charts): per task and per
adapter version, requests and mean served reward in equal buckets over a window, from the
records; per task the feedback its labels hold, and how well the served score agrees with those
labels (`rewards.calibration`), overall and per version. Pure functions over what the store
returned and the pairs the route scored."""
from __future__ import annotations

import statistics
from collections import defaultdict

from common.records import Label, RecordPoint
from rewards.calibration import Pair, calibrate
from server.schemas import Calibration, FeedbackCounts, SeriesPoint, Stats, TaskCalibration, TaskStats, VersionSeries
from tasks import TASKS


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def feedback_counts(labels: list[Label]) -> FeedbackCounts:
    return FeedbackCounts(labels=len(labels), references=sum(label.answer_source == "reference" for label in labels),
                          corrections=sum(label.answer_source == "correction" for label in labels),
                          ratings=sum(label.rating is not None for label in labels),
                          positive=sum((label.rating or 0) > 0 for label in labels),
                          negative=sum((label.rating or 0) < 0 for label in labels))


def calibration(pairs: list[tuple[str, Pair]]) -> TaskCalibration:
    """A task's calibration from (served version, pair), overall and per version."""
    by_version: dict[str, list[Pair]] = defaultdict(list)
    for version, pair in pairs:
        by_version[version].append(pair)
    return TaskCalibration(**calibrate(p for _, p in pairs).as_dict(),
                           versions={v: Calibration(**calibrate(p).as_dict()) for v, p in sorted(by_version.items())})


def series(points: list[RecordPoint], labels: dict[str, list[Label]], start: float, end: float, buckets: int,
           truncated: bool, pairs: dict[str, list[tuple[str, Pair]]] | None = None) -> Stats:
    bucket_s = (end - start) / buckets
    # task -> version -> bucket index -> rewards (and invalid counts)
    rewards: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    invalid: dict[tuple[str, str, int], int] = defaultdict(int)
    for point in points:
        if not start <= point.time <= end or point.task not in TASKS:
            continue
        index = min(int((point.time - start) / bucket_s), buckets - 1)
        rewards[point.task][point.version][index].append(point.reward.total)
        invalid[point.task, point.version, index] += not point.valid
    tasks = {}
    for task in TASKS:
        versions = []
        for version, by_bucket in rewards[task].items():
            every = [r for values in by_bucket.values() for r in values]
            versions.append(VersionSeries(version=version, requests=len(every), mean_reward=_mean(every), points=[
                SeriesPoint(start=round(start + i * bucket_s, 3), requests=len(by_bucket.get(i, [])),
                            mean_reward=_mean(by_bucket.get(i, [])), invalid=invalid.get((task, version, i), 0))
                for i in range(buckets)]))
        versions.sort(key=lambda v: -v.requests)
        every = [r for v in rewards[task].values() for values in v.values() for r in values]
        tasks[task] = TaskStats(requests=len(every), mean_reward=_mean(every), versions=versions,
                                feedback=feedback_counts(labels.get(task, [])), calibration=calibration((pairs or {}).get(task, [])))
    return Stats(start=start, end=end, bucket_s=bucket_s, records=sum(t.requests for t in tasks.values()),
                 truncated=truncated, tasks=tasks)
