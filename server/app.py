"""Builds the FastAPI app around a `GatewayState`."""
from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from server import answering, errors, metrics
from server.errors import error_response
from server.routes import adapters, chat, dashboard, feedback, health, review, rounds, stats, tasks
from server.schemas import ChatCompletionChunk, StreamError
from server.state import GatewayState

# an escaped surrogate, or one encoded as bytes (which `json.loads` reads with surrogatepass)
SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


class BodyGuard:
    """Refuses, before the app sees the body: one over the limit with 413 (by Content-Length, or
    by reading a chunked body up to the limit, then replaying it), and one whose JSON holds a lone
    UTF-16 surrogate (escaped, `"\\ud800"`, or as bytes) with 422. Python's JSON decoder accepts
    such a string, but it is not Unicode: no tokenizer, UTF-8 encoder or Redis write can take it."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._too_large()(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large()(scope, receive, send)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        if SURROGATE.search(body) and _holds_lone_surrogate(body):
            refusal = error_response(422, "invalid_request",
                                     "body: a string holds a lone UTF-16 surrogate (like \\ud800), which is not Unicode text")
            return await refusal(scope, receive, send)
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)

    def _too_large(self):
        return error_response(413, "payload_too_large", f"request body over {self.max_bytes} bytes")


class OverheadTimer:
    """Observes the gateway's own time for each answered request: from the request's arrival here
    to its last response byte, less the engine call (`tucano_gateway_overhead_seconds`, per task).
    The engine call ends when the request's task resumes with the answer, so an answer that waits
    while the event loop works through a burst of others counts as engine time: under bursts this
    is a lower bound of what the gateway adds, free of the engine's run-to-run noise that
    side-by-side latencies carry."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        engine_call: dict = {}
        token = answering.ENGINE_CALL.set(engine_call)
        try:
            await self.app(scope, receive, send)
        finally:
            answering.ENGINE_CALL.reset(token)
        if "seconds" in engine_call:
            overhead = time.perf_counter() - started - engine_call["seconds"]
            metrics.GATEWAY_OVERHEAD.labels(engine_call["task"]).observe(overhead)


def _holds_lone_surrogate(body: bytes) -> bool:
    """Whether the JSON body decodes to a string with an unpaired surrogate (a proper pair, like
    an escaped emoji, decodes to one character and passes). Not JSON at all: the app says so."""
    try:
        json.dumps(json.loads(body), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: the app answers
        return False
    return False


def _replay(messages: list[dict], then=None):
    async def receive():
        if messages:
            return messages.pop(0)
        return await then() if then else {"type": "http.disconnect"}
    return receive


def create_app(state: GatewayState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.routes.start()
        await asyncio.gather(*(pool.check() for pool in state.pools.values()))
        checker = asyncio.create_task(_watch_engines(state))
        # What start-up built (transformers, the tokenizers, pydantic's schemas: ~460k objects)
        # lives as long as the process; left to the collector, each full collection walked all
        # of it and stopped the event loop for ~330 ms.
        gc.collect()
        gc.freeze()
        yield
        checker.cancel()
        state.routes.stop()
        await asyncio.gather(*(pool.close() for pool in state.pools.values()))

    app = FastAPI(title="tucano-commerce", version="0.1.0", lifespan=lifespan,
                  description="PT-BR e-commerce analysis on vLLM: extraction, text-to-SQL, push copy, insights.")
    app.state.gateway = state
    errors.install(app)
    for module in (tasks, chat, feedback, adapters, rounds, stats, review, health, dashboard):
        app.include_router(module.router)
    app.mount("/dashboard/assets", dashboard.assets, name="dashboard-assets")
    app.add_middleware(BodyGuard, max_bytes=state.settings.max_request_bytes)
    app.add_middleware(OverheadTimer)  # added last: the outermost, so body checks count as overhead
    _document_stream_events(app)
    return app


def _document_stream_events(app: FastAPI) -> None:
    """FastAPI puts only JSON bodies' models in the OpenAPI components; the chat stream's event
    (`text/event-stream` of /v1/chat/completions) is added beside them, so its shape is documented."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            for model in (ChatCompletionChunk, StreamError):
                event = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schema["components"]["schemas"].update({**event.pop("$defs", {}), model.__name__: event})
        return app.openapi_schema
    app.openapi = openapi


async def _watch_engines(state: GatewayState, every_s: float = 2.0) -> None:
    """Re-probe engines so one that comes back (or goes away) is noticed without a request failing first."""
    while True:
        await asyncio.sleep(every_s)
        await asyncio.gather(*(pool.check() for pool in state.pools.values()), return_exceptions=True)
