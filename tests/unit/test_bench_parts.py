"""`tucano bench parts`' own pieces: the parts it takes away stand in for the real calls (same
signatures, so a change to either shows here, not as a bench full of failures), unknown parts are
refused, the bare uvicorn floor answers, and the statistics (paired differences with intervals)
and the table read right."""
from __future__ import annotations

import inspect
import subprocess
import sys
import time

import httpx
import pytest

from common.processes import free_port
from common.records import RewardContext
from common.tasks import ExtractionInput
from tests.conftest import REPO


def _replacements(monkeypatch) -> dict:
    """What `serve_gateway_without` puts in place, captured instead of serving."""
    from bench import parts
    from common.store import Store
    from router.engine_client import EnginePool

    served = []
    monkeypatch.setattr(parts, "serve_gateway", lambda *args: served.append(args))
    monkeypatch.setattr(Store, "add_record", Store.add_record)  # restored after the test
    monkeypatch.setattr(EnginePool, "complete_group", EnginePool.complete_group)
    parts.serve_gateway_without("record,engine", "data", "redis://x")
    assert served == [("data", "redis://x")]
    return {"add_record": Store.add_record, "complete_group": EnginePool.complete_group}


def test_the_parts_taken_away_have_the_signatures_of_the_real_calls(monkeypatch):
    from common.store import Store
    from router.engine_client import EnginePool

    real = {"add_record": Store.add_record, "complete_group": EnginePool.complete_group}  # what answering calls
    replaced = _replacements(monkeypatch)
    for name, function in real.items():
        assert replaced[name] is not function, name
        assert list(inspect.signature(replaced[name]).parameters) == list(inspect.signature(function).parameters), name
        assert inspect.iscoroutinefunction(replaced[name])


def test_the_in_process_completion_is_the_mocks_extraction_answer(monkeypatch):
    import asyncio

    from bench.mock_engine import COMPLETION
    from common.records import Sampling
    from tasks import score

    replaced = _replacements(monkeypatch)
    completion, = asyncio.run(replaced["complete_group"](None, "prompt " * 10, None, Sampling(0.0, 1.0, 64), {}))
    assert completion.text == COMPLETION and completion.finish_reason == "stop" and completion.model == "base"
    assert completion.completion_tokens > 0
    late = ExtractionInput(review="O fone de ouvido chegou com a entrega atrasada.")
    assert score("extraction", completion.text, None, RewardContext(late)).components["schema"] > 0


def test_unknown_parts_are_refused_before_anything_serves(monkeypatch):
    from bench import parts

    monkeypatch.setattr(parts, "serve_gateway", lambda *args: pytest.fail("served"))
    with pytest.raises(SystemExit, match="unknown parts"):
        parts.serve_gateway_without("record,scoring")
    with pytest.raises(SystemExit, match="scoring"):
        parts.serve_gateway_without("fastapi,scoring")


def test_the_uvicorn_floor_reads_the_body_and_answers_json():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", "import sys; from bench.floor import serve; serve(sys.argv[1])",
                                str(port)], cwd=REPO)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/v1/tasks/extraction", content=b'{"input": {"review": "bom"}}' * 2000)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        assert response.status_code == 200 and response.json()["output"]["sentiment"] == "negative"
    finally:
        process.terminate()
        process.wait(10)


def test_differences_are_paired_by_round_and_their_interval_holds_a_constant_shift():
    from bench.parts import differences

    with_part = [1.0, 1.4, 0.9, 1.2, 1.1, 1.3]
    shifted = [v - 0.25 for v in with_part]
    found = differences(with_part, shifted)
    assert found["ms"] == 0.25 and found["ci95"] == [0.25, 0.25]  # the rounds' swings cancel in pairs
    alone = differences(with_part, None)
    assert alone["ms"] == round(sum(with_part) / len(with_part), 4)
    assert min(with_part) <= alone["ci95"][0] < alone["ms"] < alone["ci95"][1] <= max(with_part)


def test_the_table_names_every_variant_and_part_at_every_level():
    from bench.parts import PARTS, VARIANTS, table

    level = {"variants": {name: {"ms": 0.5, "ci95": [0.4, 0.6], "failed": 0} for name in VARIANTS},
             "parts": {part: {"ms": 0.1, "ci95": [0.05, 0.15]} for part, _, _ in PARTS}}
    level["variants"]["served"]["failed"] = 3
    written = table({"rounds": 6, "block": 200, "levels": [{"concurrency": 1, **level}, {"concurrency": 16, **level}],
                     "records": {"answered_by_recording_variants": 10, "in_redis": 10}})
    assert "| variant | c=1 | c=16 |" in written and "| served | 0.500 [0.400, 0.600] (3 failed) |" in written
    for part, _, _ in PARTS:
        assert f"| {part} | 0.100 [0.050, 0.150] | 0.100 [0.050, 0.150] |" in written
    assert "answered 10; Valkey holds 10" in written


def test_the_fastapi_free_shim_hands_task_posts_to_the_route_function_and_the_rest_to_the_app(monkeypatch):
    import asyncio
    import json
    from types import SimpleNamespace

    from bench import parts
    from server.routes import tasks
    from server.schemas import Scores, ServedBy, TaskResponse, Usage

    calls, passed = [], []

    async def run_task(task, body, caller):
        calls.append((task, body.input, caller.client))
        return TaskResponse(id="1" * 32, task=task, output={"message": "oi"}, raw="oi", valid=True,
                            route=ServedBy(model="base", adapter=None, version="base"),
                            scores=Scores(total=0.5, components={}, reference_used=False),
                            usage=Usage(prompt_tokens=1, completion_tokens=1), latency_ms=1.0)

    async def app(scope, receive, send):
        passed.append((scope["type"], scope.get("path")))

    monkeypatch.setattr(tasks, "run_task", run_task)
    app.state = SimpleNamespace(gateway="state")
    shim = parts.without_fastapi(app)

    async def call(scope, chunks):
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        sent = []

        async def receive():
            return messages.pop(0)

        async def send(message):
            sent.append(message)
        await shim(scope, receive, send)
        return sent

    sent = asyncio.run(call({"type": "http", "method": "POST", "path": "/v1/tasks/push"}, [b'{"input": {"camp', b'aign": "natal"}}']))
    assert calls == [("push", {"campaign": "natal"}, "bench")]
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"])["output"] == {"message": "oi"}
    asyncio.run(call({"type": "lifespan"}, []))
    asyncio.run(call({"type": "http", "method": "GET", "path": "/readyz"}, []))
    asyncio.run(call({"type": "http", "method": "POST", "path": "/v1/feedback"}, []))
    assert passed == [("lifespan", None), ("http", "/readyz"), ("http", "/v1/feedback")] and len(calls) == 1
