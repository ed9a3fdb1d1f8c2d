"""Served answers as rollouts: a request sampled n times is one engine request with vLLM's `n`
(logprobs and token ids asked for), every completion is scored, the best by the served score is
answered, and the record keeps the whole group. Against the real gateway app and a real HTTP
engine stand-in; the store keeps records in memory."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient

from common.records import Group, Reward, Route, Sample, decode_record, encode
from common.settings import load_settings
from common.store import Store
from common.tasks import ExtractionInput
from router.engine_client import EnginePool
from router.examples import Example
from router.route_table import RouteTable
from server.app import create_app
from server.state import GatewayState
from tasks import definition
from tests.unit.test_engine_client import MODELS, FixedPrompt, send
from tests.unit.test_shapes_and_routing import make_record

REVIEW = "Comprei o fone de ouvido bluetooth e chegou com a caixa amassada, mas funciona bem."
GOOD = json.dumps({"sentiment": "neutral", "sentiment_score": 3.0, "complaint_category": "damaged_product",
                   "product_mentioned": "fone de ouvido bluetooth", "delivery_issue": False, "would_recommend": True,
                   "urgency": "low", "key_phrases": ["chegou com a caixa amassada", "funciona bem"],
                   "summary": "Fone chegou com a caixa amassada, mas funciona bem.", "requires_response": True}, ensure_ascii=False)
# the engine's completions, in its order: garbage, an empty object, the good answer, garbage again
TEXTS = ["não sei", "{}", GOOD, "???"]


class GroupEngine(BaseHTTPRequestHandler):
    """Answers a completion request with as many choices as it asks for (or `short` fewer), each
    with token ids and a logprob per token when asked, as vLLM does."""
    bodies: ClassVar[list[dict]] = []
    texts: ClassVar[list[str]] = TEXTS
    short = 0

    def do_GET(self):
        send(self, MODELS)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        n = body.get("n", 1) - type(self).short
        choices = []
        for i in range(n):
            texts = type(self).texts
            choice = {"index": i, "text": texts[i % len(texts)], "finish_reason": "stop"}
            if body.get("return_token_ids"):
                choice.update(token_ids=[100 + i, 7, 2], prompt_token_ids=[1, 2, 3])
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"token_logprobs": [-0.5, -0.25, -0.125], "tokens": ["a", "b", "c"], "top_logprobs": []}
            choices.append(choice)
        send(self, json.dumps({"choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 3 * n}}).encode())

    def log_message(self, *args):
        pass


class MemoryStore(Store):
    """The real Store's code paths up to Redis; records kept in a list."""

    def __init__(self):
        super().__init__("redis://127.0.0.1:9/0")
        self.records = []

    async def add_record(self, record, label=None) -> str:
        self.records.append(decode_record(encode(record)))  # as it would be read back
        return "1-0"


class NoExamples:
    """Examples that must not be asked (a request with `examples: false`)."""

    def __init__(self):
        self.asked = 0

    def for_request(self, task, task_input):
        self.asked += 1
        return None, []


@pytest.fixture
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", 0), GroupEngine)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings = load_settings(rate_limit_per_minute=0, feedback_rate_limit_per_minute=0, examples_tasks=[],
                             serve_samples={"extraction": 4})  # a group by default: extraction is greedy alone
    store, examples = MemoryStore(), NoExamples()
    pools = {kind: EnginePool(kind, [url], template=FixedPrompt()) for kind in ("base", "think")}
    app = create_app(GatewayState(settings, store, RouteTable(store, poll_s=30), pools, adapter_action=None, examples=examples))
    with TestClient(app) as client:
        yield client, store, examples
    server.shutdown()
    GroupEngine.bodies.clear()
    GroupEngine.short, GroupEngine.texts = 0, TEXTS


def ask(client, **options):
    return client.post("/v1/tasks/extraction", json={"input": {"review": REVIEW}, "options": options})


def test_a_group_is_one_engine_request_and_the_best_completion_answers(gateway):
    client, store, _ = gateway
    response = ask(client)
    assert response.status_code == 200, response.text
    body, = GroupEngine.bodies
    # extraction answers greedily alone; its group samples at the task's group temperature
    assert body["n"] == 4 and body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["temperature"] == definition("extraction").group_temperature > 0
    answer = response.json()
    record, = store.records
    assert answer["raw"] == GOOD and record.raw == GOOD
    assert answer["sample"]["chosen"] == 2 and answer["sample"]["of"] == 4
    totals = answer["sample"]["totals"]
    assert totals[2] == max(totals) == answer["scores"]["total"] and min(totals) < totals[2]
    group = record.group
    assert group.chosen == 2 and group.prompt_token_ids == [1, 2, 3]
    assert [s.text for s in group.samples] == TEXTS and group.rewards == totals
    assert [s.token_ids for s in group.samples] == [[100, 7, 2], [101, 7, 2], [102, 7, 2], [103, 7, 2]]
    assert all(s.logprobs == [-0.5, -0.25, -0.125] for s in group.samples)
    assert record.sampling.n == 4 and record.sampling.temperature == body["temperature"]


def test_equal_scores_answer_the_first_and_one_sample_records_no_group(gateway):
    client, store, _ = gateway
    assert ask(client, temperature=0.0).json()["sample"] is None  # greedy asked for: answered once
    assert GroupEngine.bodies.pop()["temperature"] == 0.0 and store.records.pop().group is None
    response = ask(client, samples=1)
    assert response.status_code == 200 and response.json()["sample"] is None
    assert store.records[0].group is None and store.records[0].sampling.n == 1
    body = GroupEngine.bodies[0]
    assert "n" not in body and "logprobs" not in body and body["temperature"] == 0.0  # greedy, as before groups
    GroupEngine.texts = ["não sei", "???"]  # neither is an answer: equal scores
    response = ask(client, samples=2, temperature=0.3)
    assert response.status_code == 200
    totals = response.json()["sample"]["totals"]
    assert totals[0] == totals[1] and response.json()["sample"]["chosen"] == 0
    assert GroupEngine.bodies[1]["temperature"] == 0.3  # the request's own temperature wins


def test_more_samples_than_the_cap_is_a_422_that_names_it(gateway):
    client, store, _ = gateway
    response = ask(client, samples=9)
    assert response.status_code == 422
    assert "cap of 8" in response.json()["error"]["message"] and "TUCANO_SERVE_SAMPLES_CAP" in response.json()["error"]["message"]
    for bad in (0, -1, "four"):
        assert ask(client, samples=bad).status_code == 422
    greedy = ask(client, samples=4, temperature=0.0)
    assert greedy.status_code == 422 and "temperature above 0" in greedy.json()["error"]["message"]
    assert GroupEngine.bodies == [] and store.records == []


def test_an_engine_that_returns_part_of_a_group_is_a_503_and_nothing_is_recorded(gateway):
    client, store, _ = gateway
    GroupEngine.short = 1
    response = ask(client)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "engine_unavailable"
    assert store.records == []


def test_without_examples_the_prompt_shows_none_and_nothing_is_retrieved(gateway):
    client, store, examples = gateway
    assert ask(client, examples=False).status_code == 200
    assert examples.asked == 0 and store.records[0].examples == []
    assert ask(client).status_code == 200
    assert examples.asked == 1


class OneExample:
    """The team's examples as `Examples` gives them: `REPEAT` was corrected (an exact repeat is
    answered with its correction), and every other input is shown one similar example."""

    def __init__(self):
        self.example = Example("label-1", ExtractionInput(review="Fone chegou quebrado."), "EXEMPLO-DO-TIME", "correction")

    def for_request(self, task, task_input):
        if task_input.review == REPEAT:
            return self.example._replace(id="label-2", answer=GOOD), []
        return None, [self.example]


REPEAT = "Fone chegou quebrado e ninguém respondeu."


def test_a_version_its_gate_chose_to_serve_alone_shows_no_example_but_still_answers_a_repeat(gateway):
    client, store, _ = gateway
    state = client.app.state.gateway
    state.examples = OneExample()
    assert ask(client).status_code == 200  # the base model: served with the examples
    assert store.records[-1].examples == ["label-1"]  # the labels the prompt showed (this engine's template is fixed)
    state.routes.routes = {"extraction": Route(active="extraction-v2")}
    assert ask(client).status_code == 200  # a version served with them, as its gate judged it
    assert GroupEngine.bodies[-1]["model"] == "extraction-v2" and store.records[-1].examples == ["label-1"]
    state.routes.alone = frozenset({"extraction-v2"})
    assert ask(client).status_code == 200
    assert GroupEngine.bodies[-1]["model"] == "extraction-v2" and store.records[-1].examples == []
    asked = len(GroupEngine.bodies)
    repeat = client.post("/v1/tasks/extraction", json={"input": {"review": REPEAT}})
    assert repeat.status_code == 200 and repeat.json()["raw"] == GOOD
    assert len(GroupEngine.bodies) == asked and store.records[-1].answered_from == "label-2"  # no engine asked


def test_a_streamed_chat_answer_is_sampled_once(gateway):
    client, store, _ = gateway
    response = client.post("/v1/chat/completions", json={"model": "tucano-extraction", "stream": True,
                                                          "messages": [{"role": "user", "content": REVIEW}]})
    assert response.status_code == 200
    assert "n" not in GroupEngine.bodies[0]
    response = client.post("/v1/chat/completions", json={"model": "tucano-extraction", "messages": [{"role": "user", "content": REVIEW}]})
    assert response.status_code == 200 and GroupEngine.bodies[1]["n"] == 4
    assert store.records[-1].group is not None and response.json()["choices"][0]["message"]["content"] == GOOD


def test_a_chat_message_that_is_no_valid_input_of_its_task_is_a_422_that_says_why(gateway):
    """The chat path validates with the task's input model, as the task route does: nothing reaches
    the engine or the store."""
    client, store, _ = gateway
    too_long = client.post("/v1/chat/completions", json={"model": "tucano-sql", "messages": [{"role": "user", "content": "x" * 2001}]})
    assert too_long.status_code == 422, too_long.text
    message = too_long.json()["error"]["message"]
    assert message.startswith("messages: the last user message as sql's input.question") and "at most 2000 characters" in message
    assert GroupEngine.bodies == [] and store.records == []


def test_a_record_with_a_group_round_trips_and_one_stored_before_groups_reads_without_one():
    sample = Sample(text="SELECT 1", token_ids=[5, 6], logprobs=[-0.1, -0.2], finish_reason="stop", valid=True,
                    reward=Reward(0.4, {"parse": 1.0}, False))
    record = make_record(group=Group(prompt_token_ids=[1, 2], samples=[sample, sample], chosen=1))
    assert decode_record(encode(record)) == record
    stored = json.loads(encode(make_record()))
    del stored["group"]
    del stored["sampling"]["n"]
    old = decode_record(json.dumps(stored))
    assert old.group is None and old.sampling.n == 1
