"""Engine health as the gateway sees it, against a real HTTP server that answers slowly or not
at all: a busy engine stays in rotation, a refused connection or repeated timeouts take it out."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from common.records import Sampling
from router.engine_client import SLOW_PROBES_BEFORE_DOWN, EnginePool, EngineTimeout, EngineUnavailable
from tasks import definition
from tasks.insights import FREQUENCY_PENALTY

MODELS = b'{"data": [{"id": "base-model", "parent": null}]}'
COMPLETION = b'{"choices": [{"text": "ok", "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}'


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An engine stand-in: `handler` answering on a free local port, for the block; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def send(handler: BaseHTTPRequestHandler, body: bytes, content_type: str = "application/json", status: int = 200) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class SlowModels(BaseHTTPRequestHandler):
    delay_s = 0.0
    completion_delay_s = 0.0
    bodies: ClassVar[list[dict]] = []  # every completion request as the engine received it

    def do_GET(self):
        time.sleep(type(self).delay_s)
        try:
            send(self, MODELS)
        except OSError:
            pass  # the client gave up first

    def do_POST(self):  # a completion, answered after `completion_delay_s` however slow the probes are
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        time.sleep(type(self).completion_delay_s)
        send(self, COMPLETION)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_engine():
    with serving(SlowModels) as url:
        yield url
    SlowModels.delay_s = SlowModels.completion_delay_s = 0.0
    SlowModels.bodies.clear()


def test_busy_engine_stays_in_rotation_until_it_misses_several_probes(slow_engine):
    pool = EnginePool("base", [slow_engine], template=None, probe_timeout_s=0.2)

    async def probes() -> list[bool]:
        seen = [await pool.check()]
        SlowModels.delay_s = 0.5
        for _ in range(SLOW_PROBES_BEFORE_DOWN):
            seen.append(await pool.check())
        SlowModels.delay_s = 0.0
        seen.append(await pool.check())
        await pool.close()
        return seen

    seen = asyncio.run(probes())
    assert seen == [True] * SLOW_PROBES_BEFORE_DOWN + [False, True]
    assert pool.engines[0].model == "base-model"


def test_engine_returning_completions_stays_in_rotation_however_slow_its_probes(slow_engine):
    pool = EnginePool("base", [slow_engine], template=None, probe_timeout_s=0.2)

    async def serve_while_probes_time_out() -> list[bool]:
        try:
            seen = [await pool.check()]
            SlowModels.delay_s = 0.5
            for _ in range(SLOW_PROBES_BEFORE_DOWN + 2):
                completion = await pool.complete("prompt", None, Sampling(0.0, 1.0, 4), None)
                assert completion.text == "ok"
                seen.append(await pool.check())
            return seen
        finally:
            SlowModels.delay_s = 0.0
            await pool.close()

    assert asyncio.run(serve_while_probes_time_out()) == [True] * (SLOW_PROBES_BEFORE_DOWN + 3)
    assert "returning completions" in pool.engines[0].last_error


def test_an_answer_past_the_timeout_is_a_timeout_and_the_engine_stays_in_rotation(slow_engine):
    """An engine that takes a request and answers after the pool's timeout is busy, not down: the
    request fails as a timeout (the gateway's 504), and the next one is still sent to it."""
    pool = EnginePool("base", [slow_engine], template=None, timeout_s=0.3)

    async def ask() -> str:
        try:
            assert await pool.check()
            SlowModels.completion_delay_s = 1.0
            with pytest.raises(EngineTimeout, match=r"did not answer within 0\.3 s") as timed_out:
                await pool.complete("prompt", None, Sampling(0.0, 1.0, 4), None)
            assert timed_out.value.seconds == 0.3 and not timed_out.value.failover
            SlowModels.completion_delay_s = 0.0
            return (await pool.complete("prompt", None, Sampling(0.0, 1.0, 4), None)).text
        finally:
            await pool.close()

    assert asyncio.run(ask()) == "ok"
    assert pool.engines[0].healthy


class FixedPrompt:
    """A chat template stand-in: the fake engine answers whatever it is sent."""
    sha256 = "0" * 64

    def render(self, messages: list[dict]) -> str:
        return "prompt"


def gateway_over(engine_url: str, timeout_s: float):
    """The real gateway app, both engine kinds at `engine_url` with `timeout_s`, its Redis
    unreachable (a failed request never gets as far as a record), as a TestClient."""
    from fastapi.testclient import TestClient

    from common.settings import load_settings
    from common.store import Store
    from router.route_table import RouteTable
    from server.app import create_app
    from server.state import GatewayState
    from tests.unit.test_access import UNREACHABLE

    settings = load_settings(rate_limit_per_minute=0, feedback_rate_limit_per_minute=0)
    store = Store(f"redis://{UNREACHABLE.removeprefix('http://')}/0")
    pools = {kind: EnginePool(kind, [engine_url], template=FixedPrompt(), timeout_s=timeout_s) for kind in ("base", "think")}
    return TestClient(create_app(GatewayState(settings, store, RouteTable(store, poll_s=30), pools, adapter_action=None)))


def test_the_gateway_answers_an_engine_timeout_with_504_not_503(slow_engine):
    """A request whose engine does not answer in time gets 504 `engine_timeout` naming the engine
    kind and the limit, without Retry-After (asking again would likely take as long)."""
    SlowModels.completion_delay_s = 1.0
    with gateway_over(slow_engine, timeout_s=0.3) as client:
        response = client.post("/v1/tasks/sql", json={"input": {"question": "Quantos pedidos foram entregues?"}})
    assert response.status_code == 504, response.text
    assert response.json()["error"]["type"] == "engine_timeout"
    assert response.json()["error"]["message"] == "the base engine did not answer within 0.3 s; nothing was recorded"
    assert "Retry-After" not in response.headers


def test_every_sampling_parameter_reaches_the_engine_explicitly(slow_engine):
    """vLLM would otherwise fill what is left out from the model's generation_config; insights
    leaves its frequency penalty to no one (its loops, docs/results.md, "insights, a penalty against loops")."""
    pool = EnginePool("think", [slow_engine], template=None)

    async def ask() -> None:
        await pool.check()
        await pool.complete("p", None, definition("insights").sampling.override(seed=3), None)
        await pool.complete("p", "sql-v2", Sampling(0.0, 1.0, 4), {"type": "object"})
        await pool.close()

    asyncio.run(ask())
    insights, sql = SlowModels.bodies
    assert {k: insights[k] for k in ("temperature", "top_p", "max_tokens", "seed", "frequency_penalty")} == {
        "temperature": 0.6, "top_p": 0.95, "max_tokens": 768, "seed": 3, "frequency_penalty": FREQUENCY_PENALTY}
    assert sql["model"] == "sql-v2" and sql["frequency_penalty"] == 0.0 and "seed" not in sql
    assert sql["structured_outputs"] == {"json": {"type": "object"}}


def test_refused_connection_is_down_at_once():
    pool = EnginePool("base", ["http://127.0.0.1:9"], template=None, probe_timeout_s=0.2)

    async def probe() -> bool:
        try:
            return await pool.check()
        finally:
            await pool.close()

    assert asyncio.run(probe()) is False
    with pytest.raises(EngineUnavailable, match=r"127\.0\.0\.1:9"):
        pool._pick()


class DropsReusedConnections(BaseHTTPRequestHandler):
    """Answers the first completion on each connection and closes it under the second, as a
    server closing an idle keep-alive connection does when a request goes out on it just then."""
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        send(self, MODELS)

    def do_POST(self):
        streaming = b'"stream":true' in self.rfile.read(int(self.headers["Content-Length"]))
        self.served = getattr(self, "served", 0) + 1
        if self.served > 1:
            self.close_connection = True
            return
        if streaming:
            send(self, b'data: {"choices": [{"text": "o"}]}\n\ndata: {"choices": [{"text": "k", "finish_reason": "stop"}]}'
                       b'\n\ndata: [DONE]\n\n', "text/event-stream")
        else:
            send(self, COMPLETION)

    def log_message(self, *args):
        pass


def test_a_dropped_keep_alive_connection_is_retried_not_a_503():
    server = ThreadingHTTPServer(("127.0.0.1", 0), DropsReusedConnections)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    pool = EnginePool("base", [f"http://127.0.0.1:{server.server_address[1]}"], template=None)

    async def answers() -> list[str]:
        try:
            assert await pool.check()
            texts = [(await pool.complete("p", None, Sampling(0.0, 1.0, 4), None)).text for _ in range(3)]
            for _ in range(2):
                texts.append("".join([d async for d in pool.stream("p", None, Sampling(0.0, 1.0, 4), None, {})]))
            return texts
        finally:
            await pool.close()

    try:
        assert asyncio.run(answers()) == ["ok"] * 5
        assert pool.engines[0].healthy
    finally:
        server.shutdown()


class SlowStream(BaseHTTPRequestHandler):
    """A streamed completion whose chunks come after `gaps` seconds each, as an engine writing a
    long answer token by token on busy cores does."""
    gaps: tuple[float, ...] = ()

    def do_GET(self):
        send(self, MODELS)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for gap in type(self).gaps:
                time.sleep(gap)
                self.wfile.write(b'data: {"choices": [{"text": "o"}]}\n\n')
                self.wfile.flush()
            self.wfile.write(b'data: {"choices": [{"text": "k", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        except OSError:
            pass  # the client gave up first

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_stream():
    with serving(SlowStream) as url:
        yield url
    SlowStream.gaps = ()


def test_a_stream_that_keeps_coming_is_not_cut_by_the_timeout_and_one_that_goes_quiet_is(slow_stream):
    pool = EnginePool("base", [slow_stream], template=None, timeout_s=0.5)

    async def streamed() -> tuple[str, str]:
        try:
            assert await pool.check()
            SlowStream.gaps = (0.2,) * 5  # 1 s in all, never 0.5 s without a token
            whole = "".join([d async for d in pool.stream("p", None, Sampling(0.0, 1.0, 8), None, {})])
            SlowStream.gaps = (0.0, 1.0)  # quiet for 1 s after its first token
            seen = []
            with pytest.raises(EngineTimeout, match=r"within 0\.5 s"):
                async for delta in pool.stream("p", None, Sampling(0.0, 1.0, 8), None, {}):
                    seen.append(delta)
            return whole, "".join(seen)
        finally:
            await pool.close()

    assert asyncio.run(streamed()) == ("ooooo" + "k", "o")
    assert pool.engines[0].healthy


def test_a_chat_stream_whose_engine_goes_quiet_ends_with_an_error_event(slow_stream):
    """The stream's 200 is sent with its first token; an engine that then goes quiet for the
    timeout ends the stream with an `error` event (`engine_timeout`), not a connection cut
    without a word, and no `[DONE]`."""
    SlowStream.gaps = (0.0, 1.0)
    with gateway_over(slow_stream, timeout_s=0.5) as client:
        response = client.post("/v1/chat/completions", json={
            "model": "tucano-sql", "stream": True, "messages": [{"role": "user", "content": "Quantos pedidos?"}]})
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    assert json.loads(events[-1]) == {"error": {"type": "engine_timeout",
                                                "message": "the base engine did not answer within 0.5 s; nothing was recorded"}}
    assert any(json.loads(e).get("choices", [{}])[0].get("delta", {}).get("content") == "o" for e in events[:-1])
