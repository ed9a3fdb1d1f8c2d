"""POST /v1/feedback: a rating, and optionally a correction that becomes the record's reference
and a label that rounds train on. A correction must be a valid answer of the record's task
(`rewards.references`): anything else is a 422 and nothing is stored."""
from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from common.store import StoreUnavailable, TooManyCorrections, UnknownRecord
from rewards.references import InvalidReference
from server.deps import User, limit_rate
from server.errors import ApiError, unavailable
from server.schemas import ErrorResponse, FeedbackRequest, FeedbackResponse
from tasks import check_reference

router = APIRouter(tags=["feedback"])


@router.post("/v1/feedback", response_model=FeedbackResponse, operation_id="feedback",
             responses={code: {"model": ErrorResponse} for code in (401, 403, 404, 409, 413, 422, 429, 503)})
async def feedback(body: FeedbackRequest, caller: User) -> FeedbackResponse:
    store, settings = caller.state.store, caller.state.settings
    await limit_rate(caller, "feedback posts", settings.feedback_rate_limit_per_minute)
    try:
        stored = await run_in_threadpool(store.get_record, body.id)
        if stored.record is None:
            raise UnknownRecord(body.id)
        if stored.record.key_id != caller.key_id and not caller.admin:
            raise ApiError(403, "forbidden", "feedback on a record needs the key that made its request, or the admin key")
        correction = None
        if body.correction is not None:
            try:
                correction = check_reference(stored.record.task, body.correction, settings.max_reference_bytes)
            except InvalidReference as error:
                raise ApiError(422, "invalid_request", f"correction: {error}") from None
        record = await run_in_threadpool(store.add_feedback, body.id, body.rating, correction, settings.team_eval_share,
                                         settings.max_corrections_per_record)
    except UnknownRecord:
        raise ApiError(404, "unknown_record", f"no record with id {body.id!r}") from None
    except TooManyCorrections as error:
        raise ApiError(409, "too_many_corrections", str(error)) from None
    except StoreUnavailable:
        raise unavailable("store_unavailable", "the record store is unavailable; retry shortly") from None
    return FeedbackResponse(id=body.id, rating=body.rating, reference_set=record.reference is not None)
