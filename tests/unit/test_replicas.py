"""A pool of engine replicas as the gateway sees it, against real HTTP servers that speak the part
of vLLM's API the gateway uses (models listing, runtime LoRA loading, completions): a replica
that lacks a routed adapter gets it before it takes traffic; one that refuses it stays out; a
request whose replica goes away, or lacks the adapter, is answered by another."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.records import Sampling
from router.engine_client import EnginePool, EngineUnavailable

GREEDY = Sampling(0.0, 1.0, 4)


class Replica:
    """One fake vLLM server: `adapters` it serves, what it was asked (`calls`), and whether it
    refuses to load adapters."""

    def __init__(self, refuse_loads: bool = False):
        self.adapters: set[str] = set()
        self.calls: list[tuple[str, str]] = []  # (path, model or adapter)
        self.refuse_loads = refuse_loads
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict | str, content_type: str = "application/json"):
                raw = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                listed = [{"id": "base", "parent": None}] + [{"id": a, "parent": "base"} for a in sorted(replica.adapters)]
                self._send(200, {"data": listed})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/load_lora_adapter":
                    replica.calls.append((self.path, body["lora_name"]))
                    if replica.refuse_loads:
                        return self._send(400, {"error": {"message": f"cannot read {body['lora_path']}"}})
                    if body["lora_name"] in replica.adapters:
                        return self._send(400, {"error": {"message": f"The lora adapter '{body['lora_name']}' has already been loaded."}})
                    replica.adapters.add(body["lora_name"])
                    return self._send(200, "ok", "text/plain")
                replica.calls.append((self.path, body["model"]))
                if body["model"] != "base" and body["model"] not in replica.adapters:
                    return self._send(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
                if body.get("stream"):
                    return self._send(200, 'data: {"choices": [{"text": "o"}]}\n\ndata: {"choices": [{"text": "k", '
                                           '"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n', "text/event-stream")
                self._send(200, {"choices": [{"text": "ok", "finish_reason": "stop"}], "usage": {"completion_tokens": 1}})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def completions(self) -> list[str]:
        return [model for path, model in self.calls if path == "/v1/completions"]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas():
    made: list[Replica] = []

    def make(**options) -> Replica:
        made.append(Replica(**options))
        return made[-1]
    yield make
    for replica in made:
        replica.stop()


def run(pool: EnginePool, work):
    async def go():
        try:
            return await work()
        finally:
            await pool.close()
    return asyncio.run(go())


def test_a_replica_lacking_a_routed_adapter_gets_it_before_it_takes_traffic(replicas):
    first, restarted = replicas(), replicas()
    first.adapters.add("sql-v3")  # the other replica was restarted: it serves no adapter
    pool = EnginePool("base", [first.url, restarted.url], template=None, routed_adapters=lambda: {"sql-v3": "/adapters/sql-v3"})

    async def work():
        assert await pool.check()
        return [(await pool.complete("p", "sql-v3", GREEDY, None)).engine for _ in range(4)]

    engines = run(pool, work)
    assert restarted.calls[0] == ("/v1/load_lora_adapter", "sql-v3")  # before its first completion
    assert restarted.completions() == ["sql-v3", "sql-v3"] and first.completions() == ["sql-v3", "sql-v3"]
    assert sorted(engines) == sorted([first.url, restarted.url] * 2)
    assert all(e.healthy for e in pool.engines) and first.adapters == restarted.adapters == {"sql-v3"}
    assert ("/v1/load_lora_adapter", "sql-v3") not in first.calls  # a replica that has it is left alone


def test_a_replica_that_refuses_a_routed_adapter_stays_out_and_the_others_serve(replicas):
    good, broken = replicas(), replicas(refuse_loads=True)
    pool = EnginePool("base", [good.url, broken.url], template=None, routed_adapters=lambda: {"push-v2": "/adapters/push-v2"})

    async def work():
        assert await pool.check()
        return [(await pool.complete("p", "push-v2", GREEDY, None)).engine for _ in range(3)]

    assert run(pool, work) == [good.url] * 3
    down = pool.engines[1]
    assert not down.healthy and "push-v2" in down.last_error and "HTTP 400" in down.last_error
    assert broken.completions() == []


def test_two_gateways_loading_the_same_adapter_both_admit_the_replica(replicas):
    replica = replicas()
    pools = [EnginePool("base", [replica.url], template=None, routed_adapters=lambda: {"sql-v1": "/a/sql-v1"}) for _ in range(2)]

    async def work():
        try:
            return [await pool.check() for pool in pools]  # the second finds it loaded, or is told "already loaded"
        finally:
            for pool in pools:
                await pool.close()

    replica.calls.clear()
    assert asyncio.run(work()) == [True, True]
    assert replica.adapters == {"sql-v1"}


def test_a_request_whose_replica_went_away_is_answered_by_another(replicas):
    staying, leaving = replicas(), replicas()
    pool = EnginePool("base", [leaving.url, staying.url], template=None)

    async def work():
        assert await pool.check()
        leaving.stop()  # killed after the probe: the pool still counts it healthy
        answers = [(await pool.complete("p", None, GREEDY, None)).engine for _ in range(3)]
        streamed = "".join([delta async for delta in pool.stream("p", None, GREEDY, None, {})])
        return answers, streamed

    answers, streamed = run(pool, work)
    assert answers == [staying.url] * 3 and streamed == "ok"
    assert not pool.engines[0].healthy


def test_a_stream_whose_replica_lacks_the_adapter_goes_to_one_that_has_it(replicas):
    stale, current = replicas(), replicas()
    current.adapters.add("push-v1")
    pool = EnginePool("base", [stale.url, current.url], template=None)  # no routes: nothing loaded by probes

    async def work():
        assert await pool.check()
        result: dict = {}
        text = "".join([delta async for delta in pool.stream("p", "push-v1", GREEDY, None, result)])
        return text, result

    text, result = run(pool, work)
    assert text == "ok" and result["engine"] == current.url
    assert stale.completions() == ["push-v1"] and current.completions() == ["push-v1"]


def test_with_no_other_replica_the_failure_is_reported_not_hidden(replicas):
    only = replicas()
    pool = EnginePool("base", [only.url], template=None)

    async def work():
        assert await pool.check()
        with pytest.raises(EngineUnavailable, match="HTTP 404"):
            await pool.complete("p", "sql-v9", GREEDY, None)
        only.stop()
        with pytest.raises(EngineUnavailable, match="failed"):
            await pool.complete("p", None, GREEDY, None)

    run(pool, work)
