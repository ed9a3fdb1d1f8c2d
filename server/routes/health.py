"""Liveness, readiness (Redis and every engine reachable) and Prometheus metrics."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from server.deps import State
from server.errors import RETRY_AFTER_S
from server.metrics import exposed, state_registry

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "alive"}


@router.get("/readyz")
async def readyz(state: State):
    redis_ok = await run_in_threadpool(state.store.ping)
    await asyncio.gather(*(pool.check() for pool in state.pools.values()))
    engines = {kind: [{"url": e.url, "healthy": e.healthy, "model": e.model, "error": e.last_error} for e in pool.engines]
               for kind, pool in state.pools.items()}
    ready = redis_ok and all(all(e["healthy"] for e in group) for group in engines.values())
    body = {"ready": ready, "redis": redis_ok, "engines": engines, "routes_version": state.routes.version}
    return JSONResponse(body, status_code=200 if ready else 503, headers=None if ready else {"Retry-After": str(RETRY_AFTER_S)})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    counted = generate_latest(exposed())
    live = await run_in_threadpool(generate_latest, state_registry(state.pools, state.store))
    return Response(counted + live, media_type=CONTENT_TYPE_LATEST)
