"""GET /v1/review/{task}: the review queue (server/review.py) as the review page reads it; and
GET /review, the page (server/static/review.html), served without a key like the dashboard: the
routes it calls apply the API's access rules, and saving posts to /v1/feedback."""
from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from rewards.sql_sandbox import run_readonly
from server.deps import TaskPath, User
from server.errors import ApiError
from server.review import rank
from server.routes.dashboard import STATIC
from server.schemas import ErrorResponse, ReviewItem, ReviewQueue, SqlResult
from tasks import TASKS, TRAITS

router = APIRouter(tags=["review"])
SCANNED = 500  # newest records of the task the queue ranks


@router.get("/v1/review/{task}", response_model=ReviewQueue, responses={code: {"model": ErrorResponse} for code in (401, 404, 422, 429, 503)})
async def review_queue(task: TaskPath, caller: User, limit: int = Query(30, ge=1, le=200, description="Answers to list.")) -> ReviewQueue:
    if task not in TASKS:
        raise ApiError(404, "unknown_task", f"unknown task {task!r}; tasks are {', '.join(TASKS)}")
    state = caller.state
    settings = state.settings

    def read() -> list[ReviewItem]:
        store = state.store
        ranked = rank(task, store.recent_records(task, SCANNED), store.labels(task), store.rounds(5), caller.key_id, caller.admin, limit)
        items = []
        for record, priority, why in ranked:
            executed = None
            if TRAITS[task].runs_sql and isinstance(record.output, dict) and record.output.get("sql"):
                result = run_readonly(settings.db_path, record.output["sql"], timeout_s=settings.sql_time_limit_s, row_cap=20)
                executed = SqlResult(columns=result.columns, rows=[list(r) for r in result.rows], error=result.error)
            items.append(ReviewItem(id=record.id, time=record.time, input=record.input, output=record.output, raw=record.raw,
                                    version=record.version, score=record.reward.total, components=record.reward.components,
                                    priority=priority, why=why, executed=executed))
        return items

    return ReviewQueue(task=task, items=await run_in_threadpool(read))


@router.get("/review", include_in_schema=False)
async def review_page() -> FileResponse:
    return FileResponse(STATIC / "review.html", headers={"Cache-Control": "no-cache"})
