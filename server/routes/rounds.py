"""GET /v1/rounds: the history of training rounds and their decisions, newest first, and one
round in full (`/v1/rounds/{round_id}`)."""
from __future__ import annotations

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from common.rounds import RoundSummary
from server.deps import User
from server.errors import ApiError
from server.schemas import ErrorResponse, RoundList

router = APIRouter(tags=["rounds"])
ERRORS = {code: {"model": ErrorResponse} for code in (401, 404, 422, 429, 503)}


@router.get("/v1/rounds", response_model=RoundList, responses=ERRORS)
async def list_rounds(caller: User, limit: int = Query(20, ge=1, le=500)) -> RoundList:
    return RoundList(rounds=await run_in_threadpool(caller.state.store.rounds, limit))


@router.get("/v1/rounds/{round_id}", operation_id="show_round", response_model=RoundSummary, responses=ERRORS)
async def show_round(round_id: str, caller: User) -> RoundSummary:
    found = await run_in_threadpool(caller.state.store.round, round_id) if len(round_id) <= 64 else None
    if found is None:
        raise ApiError(404, "unknown_round", f"no round {round_id!r}")
    return found
