"""Liveness, readiness and Prometheus metrics. Ready: Redis answers and every kind of engine has
at least one that serves (a fleet with one engine down still answers through the others, so it
stays in its load balancer's rotation); the body names each engine's state, and `degraded` says
that one is out; `jobs` says where a running training round stands ("round: sql training 40%,
..., about 6 min left")."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from server.deps import State
from server.errors import not_ready
from server.metrics import exposed, state_registry
from server.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="alive")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "Not ready: the same body, with Retry-After."}})
async def readyz(state: State):
    redis_ok = await run_in_threadpool(state.store.ping)
    jobs = await run_in_threadpool(state.store.jobs) if redis_ok else []
    await asyncio.gather(*(pool.check() for pool in state.pools.values()))
    engines = {kind: [{"url": e.url, "healthy": e.healthy, "model": e.model, "error": e.last_error} for e in pool.engines]
               for kind, pool in state.pools.items()}
    ready = redis_ok and all(any(e["healthy"] for e in group) for group in engines.values())
    degraded = not all(e["healthy"] for group in engines.values() for e in group)
    body = Readiness(ready=ready, degraded=degraded, redis=redis_ok, engines=engines, routes_version=state.routes.version,
                     jobs=jobs).model_dump(mode="json")
    return JSONResponse(body) if ready else not_ready(body)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    counted = generate_latest(exposed())
    live = await run_in_threadpool(generate_latest, state_registry(state.pools, state.store))
    return Response(counted + live, media_type=CONTENT_TYPE_LATEST)
