"""Adapter versions and routes. Promote, rollback and the canary (start, promote, abort) need the
admin key and are carried out by the adapter action deploy/ hands to the gateway: a refused
change (a canary already running, promoting beside a running canary, a version that is no
candidate: `common.lifecycle.TransitionRefused`) is a 409 and changes nothing. A promotion answers
once the examples the version absorbed are retired (`examples_retired`)."""
from __future__ import annotations

import re

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from common.lifecycle import Action, AdapterChange, TransitionRefused
from server.deps import Admin, TaskPath, User
from server.errors import ApiError, unavailable
from server.schemas import AdapterList, CanaryRequest, ErrorResponse
from tasks import TASKS

router = APIRouter(tags=["adapters"])
ERRORS = {code: {"model": ErrorResponse} for code in (401, 403, 404, 409, 422, 429, 501, 503)}
VERSION = re.compile(r"^[a-z]+-v\d+$")


@router.get("/v1/adapters", response_model=AdapterList, responses=ERRORS)
async def list_adapters(caller: User) -> AdapterList:
    adapters = await run_in_threadpool(caller.state.store.adapters, *TASKS)
    _, routes = await run_in_threadpool(caller.state.store.routes)
    return AdapterList(adapters=adapters,
                       routes=routes)


async def _act(caller, action: Action, target: str, share: float | None = None) -> AdapterChange:
    state = caller.state
    if state.adapter_action is None:
        raise ApiError(501, "not_implemented", f"{action} is not available in this deployment")
    try:
        return await state.adapter_action(action, target, share=share)
    except LookupError as error:
        raise ApiError(404, "unknown_adapter", str(error)) from None
    except TransitionRefused as error:
        raise ApiError(409, "conflict", str(error)) from None
    except ConnectionError as error:  # an engine could not load the version: nothing flipped
        raise unavailable("engine_unavailable", f"nothing flipped: {error}") from None


@router.post("/v1/adapters/{task}/promote", response_model=AdapterChange, responses=ERRORS)
async def promote(task: TaskPath, caller: Admin, version: str) -> AdapterChange:
    _version_of(task, version)
    return await _act(caller, Action.PROMOTE, version)


def _known(task: str) -> None:
    if task not in TASKS:
        raise ApiError(404, "unknown_task", f"unknown task {task!r}")


def _version_of(task: str, version: str) -> None:
    _known(task)
    if not VERSION.match(version) or not version.startswith(task + "-"):
        raise ApiError(422, "invalid_request", f"version {version!r} is not a version of {task} (like {task}-v3)")


@router.post("/v1/adapters/{task}/rollback", response_model=AdapterChange, responses=ERRORS)
async def rollback(task: TaskPath, caller: Admin) -> AdapterChange:
    _known(task)
    return await _act(caller, Action.ROLLBACK, task)


@router.post("/v1/adapters/{task}/canary", response_model=AdapterChange, responses=ERRORS)
async def start_canary(task: TaskPath, body: CanaryRequest, caller: Admin) -> AdapterChange:
    """Serve a candidate version to a share of the task's traffic; it is promoted or rolled back
    automatically on its live reward, or by hand below."""
    _version_of(task, body.version)
    return await _act(caller, Action.CANARY, body.version, share=body.share)


@router.post("/v1/adapters/{task}/canary/promote", response_model=AdapterChange, responses=ERRORS)
async def promote_canary(task: TaskPath, caller: Admin) -> AdapterChange:
    _known(task)
    return await _act(caller, Action.CANARY_PROMOTE, task)


@router.post("/v1/adapters/{task}/canary/abort", response_model=AdapterChange, responses=ERRORS)
async def abort_canary(task: TaskPath, caller: Admin) -> AdapterChange:
    _known(task)
    return await _act(caller, Action.CANARY_ABORT, task)
