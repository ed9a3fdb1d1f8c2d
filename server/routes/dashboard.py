"""GET /dashboard: the web dashboard, a static page (server/static) whose every figure comes from
/v1/stats, /v1/rounds and /v1/adapters with the key the user types into it. The page itself holds
no data, so it is served without a key (a browser's navigation cannot send a bearer token); the
routes it reads apply the API's access rules, and its admin buttons call the admin routes."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static"
router = APIRouter(tags=["dashboard"])
assets = StaticFiles(directory=STATIC)


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-cache"})
