"""GET /v1/stats: served traffic and reward over time per task and adapter version, and feedback
counts (what the dashboard draws)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from common.tasks import TASKS
from server.deps import User
from server.schemas import ErrorResponse, Stats
from server.stats import series

router = APIRouter(tags=["stats"])
ERRORS = {code: {"model": ErrorResponse} for code in (401, 422, 429, 503)}


@router.get("/v1/stats", response_model=Stats, responses=ERRORS)
async def stats(caller: User, window_s: int = Query(86_400, ge=60, le=90 * 86_400, description="How far back, in seconds."),
                buckets: int = Query(48, ge=1, le=500, description="Equal time buckets the window is cut into.")) -> Stats:
    store, limit = caller.state.store, caller.state.settings.stats_max_records
    end = time.time()
    start = end - window_s

    def read():
        points, truncated = store.record_points(start, limit)
        return points, truncated, {task: store.labels(task) for task in TASKS}

    points, truncated, labels = await run_in_threadpool(read)
    return series(points, labels, start, end, buckets, truncated)
