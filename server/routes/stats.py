"""GET /v1/stats: served traffic and reward over time per task and adapter version, feedback
counts, and the served score's calibration against the team's labels (what the dashboard draws).
Calibration scores the newest `CALIBRATION_LABELS` labels of each task twice (without and with their
reference); each score is kept per label, its last change and the reward version, so a dashboard
that polls pays only for new labels."""
from __future__ import annotations

import time

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from common.records import Label
from common.settings import Settings
from rewards import REWARD_VERSION
from rewards.calibration import Pair, pairs_of
from server.deps import User
from server.schemas import ErrorResponse, Stats
from server.stats import series
from tasks import TASKS, score, typed_input

router = APIRouter(tags=["stats"])
CALIBRATION_LABELS = 300
_SCORES: dict[tuple, float] = {}  # (label id, its last change, reward version, with reference) -> total


def _calibration_pairs(settings: Settings, task: str, labels: list[Label]) -> list[tuple[str, Pair]]:
    newest = [label for label in labels if label.answer is not None or label.rating is not None][-CALIBRATION_LABELS:]
    pairs = []
    for label in newest:
        def scored(completion: str, reference, task_input: dict, label=label) -> float:  # the label's stored input
            key = (label.id, label.updated, REWARD_VERSION, reference is not None)
            if key not in _SCORES:
                if len(_SCORES) > 20 * CALIBRATION_LABELS * len(TASKS):
                    _SCORES.clear()
                _SCORES[key] = score(task, completion, reference, settings.reward_context(typed_input(task, task_input))).total
            return _SCORES[key]
        pairs += [(label.served_version, pair) for pair in pairs_of([label], scored)]
    return pairs
ERRORS = {code: {"model": ErrorResponse} for code in (401, 422, 429, 503)}


@router.get("/v1/stats", response_model=Stats, responses=ERRORS)
async def stats(caller: User, window_s: int = Query(86_400, ge=60, le=90 * 86_400, description="How far back, in seconds."),
                buckets: int = Query(48, ge=1, le=500, description="Equal time buckets the window is cut into.")) -> Stats:
    store, limit = caller.state.store, caller.state.settings.stats_max_records
    end = time.time()
    start = end - window_s

    def read():
        points, truncated = store.record_points(start, limit)
        labels = {task: store.labels(task) for task in TASKS}
        pairs = {task: _calibration_pairs(caller.state.settings, task, labels[task]) for task in TASKS}
        return points, truncated, labels, pairs, store.jobs()

    points, truncated, labels, pairs, jobs = await run_in_threadpool(read)
    return series(points, labels, start, end, buckets, truncated, pairs).model_copy(update={"jobs": jobs})
