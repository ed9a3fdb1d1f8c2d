"""FastAPI dependencies, as `Annotated` aliases the routes declare. They are `async def`
though they never await: FastAPI runs a plain `def` dependency in its thread pool, a thread
hop per dependency per request."""
from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from common.tasks import TASKS
from server.errors import ApiError
from server.state import GatewayState

bearer = HTTPBearer(auto_error=False)


async def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]  # no key needed (health)
# Documented as an enum so clients see the tasks, but validated by the routes so that an unknown
# task is a 404 (a missing resource), not a 422.
TaskPath = Annotated[str, Path(description="extraction, sql, push or insights", json_schema_extra={"enum": list(TASKS)})]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _matches(credentials: HTTPAuthorizationCredentials | None, *keys) -> bool:
    given = credentials.credentials if credentials else ""
    return any(key is not None and hmac.compare_digest(given, key.get_secret_value()) for key in keys)


async def authorize_user(request: Request, credentials: Credentials) -> GatewayState:
    """The gateway's state, for a request that carries the user or the admin key (or any request
    when no key is configured)."""
    state: GatewayState = request.app.state.gateway
    settings = state.settings
    if settings.user_api_key is None and settings.admin_api_key is None:
        return state
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing API key (Authorization: Bearer <key>)", {"WWW-Authenticate": "Bearer"})
    if not _matches(credentials, settings.user_api_key, settings.admin_api_key):
        raise ApiError(401, "unauthorized", "invalid API key", {"WWW-Authenticate": "Bearer"})
    return state


async def authorize_admin(request: Request, credentials: Credentials) -> GatewayState:
    """The gateway's state, for a request that carries the admin key (or any, when none is configured)."""
    state: GatewayState = request.app.state.gateway
    settings = state.settings
    if settings.admin_api_key is None:
        return state
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing admin key", {"WWW-Authenticate": "Bearer"})
    if not _matches(credentials, settings.admin_api_key):
        raise ApiError(403, "forbidden", "this needs the admin key")
    return state


# The key check hands over the state it checked against: one dependency per request instead of a
# check and a state lookup, each solved by FastAPI on every request.
UserState = Annotated[GatewayState, Depends(authorize_user)]
AdminState = Annotated[GatewayState, Depends(authorize_admin)]
User = Depends(authorize_user)  # for a route that needs the key but not the state
