"""Every error is JSON `{"error": {"type", "message"}}`; this module is the one place that
turns exceptions into responses."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.headers = status, type_, message, headers or {}


def error_body(type_: str, message: str) -> dict:
    return {"error": {"type": type_, "message": message}}


def _field(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError):
        return JSONResponse(error_body(error.type, error.message), status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError):
        problems = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in error.errors()[:10])
        return JSONResponse(error_body("invalid_request", problems or "invalid request"), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        return JSONResponse(error_body(kinds.get(error.status_code, "http_error"), str(error.detail)),
                            status_code=error.status_code, headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body("internal_error", "internal error"), status_code=500)
