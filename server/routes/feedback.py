"""POST /v1/feedback: a rating, and optionally a correction that becomes the record's reference."""
from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from common.store import StoreUnavailable, UnknownRecord
from server.deps import UserState
from server.errors import ApiError, unavailable
from server.schemas import ErrorResponse, FeedbackRequest, FeedbackResponse

router = APIRouter(tags=["feedback"])


@router.post("/v1/feedback", response_model=FeedbackResponse,
             responses={code: {"model": ErrorResponse} for code in (401, 404, 413, 422, 503)})
async def feedback(body: FeedbackRequest, state: UserState) -> FeedbackResponse:
    try:
        record = await run_in_threadpool(state.store.add_feedback, body.id, body.rating, body.correction)
    except UnknownRecord:
        raise ApiError(404, "unknown_record", f"no record with id {body.id!r}") from None
    except StoreUnavailable:
        raise unavailable("store_unavailable", "the record store is unavailable; retry shortly") from None
    return FeedbackResponse(id=body.id, rating=body.rating, reference_set=record.reference is not None)
