"""FastAPI dependencies, as `Annotated` aliases the routes declare: who the caller is and whether
they may do what they ask (contract §5), checked once per request. They are `async def`: FastAPI
runs a plain `def` dependency in its thread pool, a thread hop per dependency per request.

The access rules fail closed:

| keys configured | user routes | admin routes |
|---|---|---|
| none | open | open on a loopback-only gateway; else 403 naming TUCANO_ADMIN_API_KEY |
| user only | user key | 403 naming TUCANO_ADMIN_API_KEY, whatever is sent |
| admin only | admin key | admin key |
| both | user or admin key | admin key (the user key: 403) |

A missing or unknown key is a 401. Keys are compared in constant time. Each caller (a key, or
the client address when no key is configured) is rate-limited per minute: 429 with Retry-After.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from common.store import StoreUnavailable
from server.errors import ApiError, unavailable
from server.state import GatewayState
from tasks import TASKS

bearer = HTTPBearer(auto_error=False)
WINDOW_S = 60


@dataclass(frozen=True)
class Caller:
    state: GatewayState
    key_id: str | None  # a hash of the key presented (what records store), None without keys
    admin: bool
    client: str  # what the rate limit counts: the key's hash, else the client address


async def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]  # no key needed (health)
# Documented as an enum so clients see the tasks, but validated by the routes so that an unknown
# task is a 404 (a missing resource), not a 422.
TaskPath = Annotated[str, Path(description="A task's name (GET /v1/models lists them as tucano-<task>)",
                                json_schema_extra=lambda schema: schema.update(enum=list(TASKS)))]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


@functools.lru_cache(maxsize=64)  # a handful of keys, asked on every request
def key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _matches(given: str, key) -> bool:
    return key is not None and hmac.compare_digest(given.encode(), key.get_secret_value().encode())


def _identify(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Caller:
    """Who is calling: no key needed when none is configured; else a known key, or a 401."""
    state: GatewayState = request.app.state.gateway
    settings = state.settings
    address = request.client.host if request.client else "unknown"
    if settings.user_api_key is None and settings.admin_api_key is None:
        return Caller(state, None, False, f"address:{address}")
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing API key (Authorization: Bearer <key>)", {"WWW-Authenticate": "Bearer"})
    given = credentials.credentials
    admin = _matches(given, settings.admin_api_key)
    if not admin and not _matches(given, settings.user_api_key):
        raise ApiError(401, "unauthorized", "invalid API key", {"WWW-Authenticate": "Bearer"})
    ident = key_id(given)
    return Caller(state, ident, admin, f"key:{ident}")


async def limit_rate(caller: Caller, kind: str, per_minute: int) -> None:
    if per_minute <= 0:
        return
    try:
        wait = await caller.state.store.hit_rate(f"{kind}:{caller.client}", per_minute, WINDOW_S)
    except StoreUnavailable:
        raise unavailable("store_unavailable", "the record store is unavailable; retry shortly") from None
    if wait:
        raise ApiError(429, "rate_limited", f"more than {per_minute} {kind} per minute from this caller; retry in {wait} s",
                       {"Retry-After": str(wait)})


async def authorize_user(request: Request, credentials: Credentials) -> Caller:
    """A caller with the user or the admin key (anyone when no key is configured), within its rate."""
    caller = _identify(request, credentials)
    await limit_rate(caller, "requests", caller.state.settings.rate_limit_per_minute)
    return caller


async def authorize_admin(request: Request, credentials: Credentials) -> Caller:
    """A caller with the admin key; with none configured, only on a loopback-only gateway with no keys at all."""
    caller = _identify(request, credentials)
    settings = caller.state.settings
    if settings.admin_api_key is None:
        if settings.user_api_key is None and settings.loopback_only:
            return caller
        raise ApiError(403, "forbidden", "admin routes are disabled: set TUCANO_ADMIN_API_KEY (only a gateway that listens "
                                         "on loopback alone and has no keys at all lets them through without it)")
    if not caller.admin:
        raise ApiError(403, "forbidden", "this needs the admin key (TUCANO_ADMIN_API_KEY)")
    return caller


User = Annotated[Caller, Depends(authorize_user)]
Admin = Annotated[Caller, Depends(authorize_admin)]
