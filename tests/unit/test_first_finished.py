"""A sampled request answered from its first K samples to finish (`first_finished`): the group is
streamed, the connection is closed once K samples have finished (vLLM aborts the rest), the best
of those K answers, and the record says how many were cut, so that no round trains on the group
as if it were whole. Against the real gateway app and a real HTTP engine stand-in that streams
its samples token by token in lockstep, as vLLM decodes a group."""
from __future__ import annotations

import asyncio
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient

from common.records import Sampling
from common.settings import load_settings
from router.engine_client import EnginePool, EngineUnavailable
from router.route_table import RouteTable
from server.app import create_app
from server.state import GatewayState
from tests.unit.test_engine_client import MODELS, FixedPrompt, send, serving
from tests.unit.test_served_groups import GOOD, REVIEW, MemoryStore, NoExamples

# the samples in the engine's order, each with how many tokens it takes: the good answer and "{}"
# finish first, the two long ones would take 40 and 60 steps
TEXTS = ["não sei " * 20, "{}", GOOD, "??? " * 30]
LENGTHS = [40, 3, 5, 60]
STEP_S = 0.01


def pieces(text: str, count: int) -> list[str]:
    size = -(-len(text) // count)
    return [text[i * size:(i + 1) * size] for i in range(count)]


class LockstepEngine(BaseHTTPRequestHandler):
    """Streams a group's samples one token per step each, the shortest finishing first; records
    each request's body and the step at which the client went away (None: it read to the end)."""
    bodies: ClassVar[list[dict]] = []
    gone_at: ClassVar[list[int | None]] = []
    end_after: int | None = None  # steps after which the stream ends early, every sample unfinished

    def do_GET(self):
        send(self, MODELS)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if not body.get("stream"):
            choices = [{"index": i, "text": TEXTS[i], "finish_reason": "stop", "token_ids": list(range(LENGTHS[i])),
                        "prompt_token_ids": [1, 2, 3], "logprobs": {"token_logprobs": [-0.5] * LENGTHS[i]}} for i in range(body["n"])]
            send(self, json.dumps({"choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 9}}).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        split = [pieces(TEXTS[i], LENGTHS[i]) for i in range(body["n"])]
        try:
            for step in range(max(LENGTHS[:body["n"]])):
                if type(self).end_after is not None and step >= type(self).end_after:
                    break
                for i in range(body["n"]):
                    if step >= LENGTHS[i]:
                        continue
                    choice = {"index": i, "text": split[i][step], "token_ids": [100 * i + step], "logprobs": {"token_logprobs": [-0.25]},
                              "finish_reason": "stop" if step == LENGTHS[i] - 1 else None}
                    if step == 0:
                        choice["prompt_token_ids"] = [1, 2, 3]
                    self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
                time.sleep(STEP_S)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            type(self).gone_at.append(None)
        except OSError:
            type(self).gone_at.append(step)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine():
    with serving(LockstepEngine) as url:
        yield url
    LockstepEngine.bodies.clear()
    LockstepEngine.gone_at.clear()
    LockstepEngine.end_after = None


def group(url: str, sampling: Sampling):
    pool = EnginePool("base", [url], template=None)

    async def run():
        try:
            assert await pool.check()
            return await pool.complete_group("p", None, sampling, None)
        finally:
            await pool.close()
    return asyncio.run(run())


def wait_for_the_engine(count: int) -> None:
    deadline = time.monotonic() + 5
    while len(LockstepEngine.gone_at) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_first_two_samples_to_finish_are_returned_and_the_rest_are_cut(engine):
    completions = group(engine, Sampling(0.7, 1.0, 64, n=4, first_finished=2))
    body, = LockstepEngine.bodies
    assert body["stream"] is True and body["n"] == 4 and body["logprobs"] == 0 and body["return_token_ids"] is True
    # samples 1 and 3 tokens long and 2 (5 tokens), in the engine's order, each whole
    assert [c.text for c in completions] == ["{}", GOOD]
    assert [c.token_ids for c in completions] == [[100, 101, 102], [200, 201, 202, 203, 204]]
    assert all(c.logprobs == [-0.25] * len(c.token_ids) and c.prompt_token_ids == [1, 2, 3] for c in completions)
    assert completions[0].prompt_tokens == 3
    wait_for_the_engine(1)
    gone, = LockstepEngine.gone_at
    # the client closed the stream once the second sample finished (step 4), long before the 60th step
    assert gone is not None and gone < 20


def test_a_group_that_waits_for_all_is_one_request_not_streamed(engine):
    completions = group(engine, Sampling(0.7, 1.0, 64, n=4))
    assert LockstepEngine.bodies[0]["stream"] is False and len(completions) == 4
    # first_finished at n or 1 is no cut either
    assert not Sampling(0.7, 1.0, 64, n=4, first_finished=4).cuts and not Sampling(0.7, 1.0, 64, n=4, first_finished=1).cuts


def test_a_stream_that_ends_before_enough_samples_finished_is_an_engine_failure(engine):
    LockstepEngine.end_after = 4  # only the 3-token sample finishes
    with pytest.raises(EngineUnavailable, match="1 of the 2 finished samples"):
        group(engine, Sampling(0.7, 1.0, 64, n=4, first_finished=2))


@pytest.fixture
def gateway(engine):
    settings = load_settings(rate_limit_per_minute=0, feedback_rate_limit_per_minute=0, examples_tasks=[],
                             serve_samples={"extraction": 4}, serve_first_finished={"extraction": 2})
    store = MemoryStore()
    pools = {kind: EnginePool(kind, [engine], template=FixedPrompt()) for kind in ("base", "think")}
    app = create_app(GatewayState(settings, store, RouteTable(store, poll_s=30), pools, adapter_action=None, examples=NoExamples()))
    with TestClient(app) as client:
        yield client, store


def ask(client, **options):
    return client.post("/v1/tasks/extraction", json={"input": {"review": REVIEW}, "options": options})


def test_the_answer_is_the_best_of_the_first_finished_and_the_record_counts_the_cut(gateway):
    client, store = gateway
    response = ask(client)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["raw"] == GOOD
    assert answer["sample"]["of"] == 2 and answer["sample"]["cut"] == 2 and answer["sample"]["chosen"] == 1
    record, = store.records
    assert record.group.cut == 2 and [s.text for s in record.group.samples] == ["{}", GOOD]
    assert record.sampling.n == 4 and record.sampling.first_finished == 2
    # the request's own option wins: 0 waits for all four, in one request that is not streamed
    response = ask(client, first_finished=0)
    assert response.status_code == 200 and response.json()["sample"]["of"] == 4 and response.json()["sample"]["cut"] == 0
    assert LockstepEngine.bodies[-1]["stream"] is False and store.records[-1].group.cut == 0


def test_a_first_finished_that_is_no_choice_or_more_than_the_samples_is_a_422(gateway):
    client, store = gateway
    for options, says in (({"first_finished": 1}, "the best of one is no choice"), ({"samples": 4, "first_finished": 5}, "to the request's 4"),
                          ({"first_finished": -1}, None), ({"first_finished": "two"}, None)):
        response = ask(client, **options)
        assert response.status_code == 422, options
        if says:
            assert says in response.json()["error"]["message"] and "options.first_finished" in response.json()["error"]["message"]
    assert LockstepEngine.bodies == [] and store.records == []


def test_a_setting_of_one_first_finished_sample_is_refused_by_name():
    with pytest.raises(ValueError, match="the best of one is no choice"):
        load_settings(serve_first_finished={"sql": 1})
    from common.settings import ConfigError
    from tasks import check_settings
    with pytest.raises(ConfigError, match="SERVE_FIRST_FINISHED: no task named 'nope'"):
        check_settings(load_settings(serve_first_finished={"nope": 2}))
