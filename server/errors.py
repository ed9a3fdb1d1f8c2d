"""Every error is JSON `{"error": {"type", "message"}}`, counted in /metrics by status and type;
this module is the one place that turns exceptions into responses."""
from __future__ import annotations

import logging

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.store import StoreUnavailable
from server import metrics

log = logging.getLogger(__name__)


RETRY_AFTER_S = 5  # what a 503 asks a client to wait: engines restart and Redis reconnects within it


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.headers = status, type_, message, headers or {}


def unavailable(type_: str, message: str) -> ApiError:
    """A 503 with Retry-After: an engine or the store is down for now."""
    return ApiError(503, type_, message, {"Retry-After": str(RETRY_AFTER_S)})


def not_ready(readiness: dict) -> JSONResponse:
    """/readyz's 503: the readiness body itself (which engines are out, which job runs), with
    Retry-After. Not counted among the error responses: it answers a probe, it refuses no request."""
    return JSONResponse(readiness, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def error_response(status: int, type_: str, message: str, headers: dict | None = None) -> JSONResponse:
    metrics.ERROR_RESPONSES.labels(str(status), type_).inc()
    return JSONResponse({"error": {"type": type_, "message": message}}, status_code=status, headers=headers)


def invalid_input(error: ValidationError, prefix: str) -> ApiError:
    """A 422 naming each problem pydantic found in a task's input, under `prefix` (`input`, the message)."""
    problems = "; ".join(".".join([prefix, *(str(p) for p in e["loc"])]) + f": {e['msg']}" for e in error.errors()[:10])
    return ApiError(422, "invalid_request", problems)


def _field(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError):
        return error_response(error.status, error.type, error.message, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError):
        problems = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in error.errors()[:10])
        return error_response(422, "invalid_request", problems or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        return error_response(error.status_code, kinds.get(error.status_code, "http_error"), str(error.detail),
                              getattr(error, "headers", None))

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(redis.RedisError)
    async def store_down(_: Request, error: Exception):
        return error_response(503, "store_unavailable", "the record store is unavailable; retry shortly",
                              {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception):
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error")
