"""The typed shapes that cross rooms, the routing table's arms, the classifier and the API's
input models: pure code, checked without any server."""
from __future__ import annotations

import json
import random

import msgspec
import pytest
from pydantic import ValidationError

from common.records import AdapterMeta, Record, Reward, Route, Sampling, Usage, adapter_version_name, decode_adapter, decode_record, encode
from common.tasks import PUSH_CAMPAIGN_MESSAGES, PUSH_CAMPAIGNS, ExtractionOutput, PushInput, SqlInput
from rewards import push
from rewards.text import fold
from router.classify import classify
from router.prompts import build_messages
from router.route_table import RouteTable
from server.schemas import ChatRequest, FeedbackRequest, TaskRequest
from tasks import INPUT_MODELS, TASK_ENGINE, TASKS, definition, stored_input


def make_record(**changes) -> Record:
    values = dict(
        id="r1", time=1.0, task="sql", source="tasks", input={"question": "Quantos pedidos?"}, prompt="<|im_start|>...",
        chat_template_sha256="abc", raw="SELECT 1", output={"sql": "SELECT 1"}, valid=True,
        sampling=Sampling(0.0, 1.0, 256, 7), engine="http://e", model="base", adapter=None, arm="base",
        usage=Usage(10, 3), finish_reason="stop", latency_ms=12.5,
        reward=Reward(0.5, {"parse": 1.0}, False, {"parse": "ok"}), reward_version="2",
    )
    values.update(changes)
    return Record(**values)


def test_a_record_survives_the_store_encoding_with_every_type():
    record = make_record(reference={"sql": "SELECT 2"}, key_id="k1")
    again = decode_record(encode(record))
    assert again == record and again.version == "base"
    assert make_record(adapter="sql-v3", arm="active").version == "sql-v3"


def test_a_record_stored_before_the_frequency_penalty_reads_as_sent_without_one():
    stored = msgspec.to_builtins(make_record())
    del stored["sampling"]["frequency_penalty"]
    assert decode_record(json.dumps(stored)).sampling == Sampling(0.0, 1.0, 256, 7, frequency_penalty=0.0)
    assert Sampling(0.6, 0.95, 768, None, 0.3).override(seed=5) == Sampling(0.6, 0.95, 768, 5, 0.3)
    assert Sampling(0.6, 0.95, 768, None, 0.3).override(frequency_penalty=0.0).frequency_penalty == 0.0


@pytest.mark.parametrize("broken", [
    {"sampling": {"temperature": "hot"}},  # a wrong type
    {"arm": "sideways"},  # outside the arms
    {"usage": None},
])
def test_a_malformed_stored_record_is_refused_not_half_read(broken):
    raw = msgspec.to_builtins(make_record())
    raw.update(broken)
    with pytest.raises(msgspec.ValidationError):
        decode_record(json.dumps(raw))
    missing = msgspec.to_builtins(make_record())
    del missing["raw"]
    with pytest.raises(msgspec.ValidationError):
        decode_record(json.dumps(missing))


def test_adapter_meta_names_and_round_trip():
    assert adapter_version_name("extraction", 7) == "extraction-v7"
    meta = AdapterMeta(version="push-v2", task="push", path="/a/push-v2", parent="push-v1", method="sft")
    assert decode_adapter(encode(meta)) == meta and meta.status == "candidate" and meta.created > 0


def test_an_adapters_sub_records_are_typed_and_read_what_earlier_releases_stored(monkeypatch):
    """Versions stored before the gate, canary, training and data records were typed kept `{}`
    for "none yet" and dicts for the history; they read back typed, and /v1/adapters answers them
    with every sub-record in the OpenAPI schema."""
    from fastapi.testclient import TestClient

    from common.rounds import CanaryRecord, GateDecision, GateRecord
    from tests.unit.test_access import app_for

    legacy = {"version": "sql-v1", "task": "sql", "path": "/a/sql-v1", "status": "rejected", "created": 1.0, "data": {}, "training": {},
              "gate": {}, "canary": {}, "reason": "worse", "history": [{"status": "rejected", "at": 2.0, "reason": "worse"}]}
    old = decode_adapter(json.dumps(legacy))
    assert old.gate is None and old.canary is None and old.data is None and old.history[0].at == 2.0
    decision = GateDecision(promote=True, reason="better", n=40, rows={"bootstrap": 40}, candidate_mean=0.7, incumbent_mean=0.5,
                            difference=0.2, interval=(0.1, 0.3))
    meta = AdapterMeta(version="sql-v2", task="sql", path="/a/sql-v2", gate=GateRecord(decision=decision, incumbent="base"),
                       canary=CanaryRecord(verdict="promote", reason="not worse", reward_interval=(-0.01, 0.05)))
    assert decode_adapter(encode(meta)) == meta
    with pytest.raises(msgspec.ValidationError):  # a gate without its decision is no gate record
        decode_adapter(json.dumps({**legacy, "gate": {"incumbent": "base"}}))
    with TestClient(app_for(None, None)) as client:
        store = client.app.state.gateway.store
        monkeypatch.setattr(store, "adapters", lambda *tasks: [old, meta])
        monkeypatch.setattr(store, "routes", lambda: (1, {"sql": Route(active="sql-v2")}))
        listed = client.get("/v1/adapters").json()
        schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert [a["version"] for a in listed["adapters"]] == ["sql-v1", "sql-v2"] and listed["routes"]["sql"]["active"] == "sql-v2"
    assert listed["adapters"][1]["gate"]["decision"]["interval"] == [0.1, 0.3] and listed["adapters"][0]["gate"] is None
    assert schema["AdapterList"]["properties"]["adapters"]["items"] == {"$ref": "#/components/schemas/AdapterMeta"}
    assert {"gate", "canary", "training", "data", "history"} <= set(schema["AdapterMeta"]["properties"])
    assert {"GateRecord", "GateDecision", "CanaryRecord", "TrainingRecord", "TrainingData", "StatusChange"} <= set(schema)
    assert schema["AdapterList"]["properties"]["routes"]["additionalProperties"] == {"$ref": "#/components/schemas/Route"}
    assert "canary_share" in schema["Route"]["properties"] and set(schema["ServedBy"]["properties"]) == {"model", "adapter", "version"}


def test_routing_table_sends_the_canary_its_share_and_the_rest_to_active():
    table = RouteTable(store=None)
    table.routes = {"sql": Route(active="sql-v2", canary="sql-v3", canary_share=0.25)}
    random.seed(1)
    picks = [table.adapter_for("sql") for _ in range(4000)]
    assert set(picks) == {("sql-v2", "active"), ("sql-v3", "canary")}
    assert 0.22 < picks.count(("sql-v3", "canary")) / len(picks) < 0.28
    assert table.adapter_for("push") == (None, "base")  # no route yet: the base model


def test_the_routing_table_knows_which_routed_versions_are_served_without_the_examples():
    """A version's gate chose how it is served (`GateDecision.served_alone`); the table reads it
    from the store with the routes, and a version stored before the choice existed, like the base
    model, shows the examples."""
    from common.rounds import GateDecision, GateRecord
    from common.store import Store

    def judged(version: str, served_alone: bool | None) -> AdapterMeta:
        meta = AdapterMeta(version=version, task="extraction", path=f"/adapters/{version}")
        if served_alone is not None:
            meta.gate = GateRecord(decision=GateDecision(promote=True, reason="", n=64, rows={}, candidate_mean=0.8, incumbent_mean=0.6,
                                                         difference=0.2, interval=(0.1, 0.3), served_alone=served_alone),
                                   incumbent="base")
        return decode_adapter(encode(meta))  # as stored and read back

    class Registry(Store):
        def __init__(self):
            super().__init__("redis://127.0.0.1:9/0")
            self.metas = {m.version: m for m in (judged("extraction-v2", True), judged("sql-v2", False), judged("push-v1", None))}

        def adapter(self, version):
            return self.metas.get(version)

        def routes_version(self):
            return 3

        def routes(self):
            return 3, {"extraction": Route(active="extraction-v1", canary="extraction-v2", canary_share=0.5),
                       "sql": Route(active="sql-v2"), "push": Route(active="push-v1")}

    store = Registry()
    assert [store.shows_examples(v) for v in ("extraction-v2", "sql-v2", "push-v1", None, "gone")] == [False, True, True, True, True]
    table = RouteTable(store)
    table.refresh()
    assert table.alone == {"extraction-v2"} and not table.shows_examples("extraction-v2")
    assert table.shows_examples("sql-v2") and table.shows_examples(None)
    # a decision stored before `served_alone` existed reads as served with the examples
    stored = msgspec.json.encode(judged("sql-v3", False))
    assert b'"served_alone":false' in stored
    old = msgspec.json.decode(stored.replace(b',"served_alone":false', b""), type=AdapterMeta)
    assert old.shows_examples() and b"served_alone" not in stored.replace(b',"served_alone":false', b"")


def test_the_adapters_table_gives_the_comparison_that_decided():
    from rich.console import Console

    from common.rounds import GateDecision, GateRecord
    from deploy.history import adapters_table

    alone = GateDecision(promote=True, reason="", n=32, rows={}, candidate_mean=0.8, incumbent_mean=0.55, difference=0.25, interval=(0.15, 0.35))
    decision = GateDecision(promote=True, reason="", n=64, rows={}, candidate_mean=0.6, incumbent_mean=0.55, difference=0.05,
                            interval=(-0.01, 0.1), alone=alone, served_alone=True)
    metas = [AdapterMeta(version="extraction-v1", task="extraction", path="/x", gate=GateRecord(decision=decision, incumbent="base"))]
    console = Console(width=300, record=True)
    console.print(adapters_table(metas))
    assert "+0.250 [+0.150, +0.350] n=32, served alone" in console.export_text()
    decision.served_alone = False
    assert decision.deciding() is decision


def test_a_route_round_trips_and_reads_what_earlier_releases_stored():
    route = Route(active="sql-v4", previous="sql-v3", earlier=["sql-v2"], canary="sql-v5", canary_share=0.2, canary_started=1.0,
                  canary_since="1-0")
    assert msgspec.json.decode(msgspec.json.encode(route), type=Route) == route and route.served() == {"sql-v4", "sql-v5"}
    assert route.without_canary() == Route(active="sql-v4", previous="sql-v3", earlier=["sql-v2"])
    for stored in (b'{"active": "push-v2", "previous": null, "earlier": []}', b'{"active": "push-v2"}'):  # as json.dumps, then msgspec wrote them
        assert msgspec.json.decode(stored, type=Route) == Route(active="push-v2")
    assert msgspec.json.decode(b"{}", type=Route) == Route()
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"active": 3}', type=Route)


def test_every_task_has_one_entry_with_its_engine_sampling_and_prompt():
    assert list(TASKS) == ["extraction", "sql", "push", "insights"] and set(INPUT_MODELS) == set(TASKS)
    for task in TASKS:
        entry = definition(task)
        assert entry.name == task and entry.engine == TASK_ENGINE[task] and entry.sampling.max_tokens > 0
        assert (entry.json_schema is not None) == (task in ("extraction", "push"))
    # the prompt states the domains the schema enforces, from the same tuples
    schema = definition("extraction").json_schema["properties"]
    for value in schema["complaint_category"]["enum"]:
        assert value in definition("extraction").system_prompt
    assert build_messages("sql", SqlInput(question="x"))[1]["content"] == "Pergunta: x"


def test_push_prompt_says_what_a_known_campaign_is_about_in_words_after_its_identifier():
    """A known campaign's message follows its identifier; the scorer reads it as that campaign's
    message and no other's. An unknown campaign, or none, gets no such line."""
    message = build_messages("push", PushInput(campaign="volta_ao_estoque", customer_name="Ana"))[-1]["content"]
    assert message.splitlines() == ["campanha: volta_ao_estoque", f"sobre: {PUSH_CAMPAIGN_MESSAGES['volta_ao_estoque']}", "cliente: Ana"]
    assert build_messages("push", PushInput(campaign="natal", customer_name="Ana"))[-1]["content"] == "campanha: natal\ncliente: Ana"
    assert build_messages("push", PushInput(customer_name="Ana", product="fone"))[-1]["content"] == "cliente: Ana\nproduto: fone"
    for campaign in PUSH_CAMPAIGNS:
        credit, why = push._intent(PushInput(campaign=campaign), fold(PUSH_CAMPAIGN_MESSAGES[campaign]))
        assert credit == 1.0, (campaign, why)


def test_a_chat_message_becomes_its_tasks_input_and_only_push_reads_json_fields():
    fields = '{"campaign": "cupom", "customer_name": "Ana"}'
    def chat_input(task: str, text: str) -> dict:
        return stored_input(definition(task).input_from_text(text))

    assert chat_input("push", fields) == {"campaign": "cupom", "customer_name": "Ana"}
    assert chat_input("push", "Ana, cupom de 10%") == {"briefing": "Ana, cupom de 10%"}
    assert chat_input("push", "[1, 2]") == {"briefing": "[1, 2]"}  # JSON, but not fields
    # JSON of fields push does not take, or of values it refuses, is the text of a briefing
    assert chat_input("push", '{"cupom": "X"}') == {"briefing": '{"cupom": "X"}'}
    assert chat_input("push", '{"campaign": "cupom", "discount_pct": 500}') == {"briefing": '{"campaign": "cupom", "discount_pct": 500}'}
    assert chat_input("sql", fields) == {"question": fields}
    assert chat_input("extraction", fields) == {"review": fields}
    assert isinstance(definition("sql").input_from_text("Quantos pedidos?"), definition("sql").input_model)  # typed past the edge
    with pytest.raises(ValidationError):
        definition("sql").input_from_text("x" * 2001)  # no valid input of the task: the chat route's 422


@pytest.mark.parametrize("text,task", [
    ("Quantos clientes são do estado SP?", "sql"),
    ("O fone chegou quebrado, não recomendo.", "extraction"),
    ('{"campaign": "carrinho_abandonado", "customer_name": "Ana"}', "push"),
    ("Analise: o que a queda de vendas sugere para a loja?", "insights"),
    ("", "insights"),
])
def test_classifier(text, task):
    assert classify(text) == task


def test_api_input_models_refuse_unknown_fields_and_bad_values():
    with pytest.raises(ValidationError):
        TaskRequest.model_validate({"input": {"review": "x"}, "options": {"temperature": 9}})
    for penalty in (2.5, -3, "high"):
        with pytest.raises(ValidationError, match="frequency_penalty"):
            TaskRequest.model_validate({"input": {"review": "x"}, "options": {"frequency_penalty": penalty}})
    assert TaskRequest.model_validate({"input": {"review": "x"}, "options": {"frequency_penalty": 0}}).options.frequency_penalty == 0
    with pytest.raises(ValidationError):
        TaskRequest.model_validate({"input": {"review": "x"}, "surprise": 1})
    with pytest.raises(ValidationError):
        FeedbackRequest.model_validate({"id": "x", "rating": 2})
    with pytest.raises(ValidationError, match="a rating or a correction is required"):
        FeedbackRequest.model_validate({"id": "x"})
    assert FeedbackRequest.model_validate({"id": "x", "correction": {"sql": "SELECT 1"}}).rating == -1  # a correction alone: wrong
    assert FeedbackRequest.model_validate({"id": "x", "rating": 1, "correction": {"sql": "SELECT 1"}}).rating == 1
    assert FeedbackRequest.model_validate({"id": "x", "rating": 0}).correction is None
    with pytest.raises(ValidationError):
        INPUT_MODELS["push"].model_validate({"discount_pct": 250})
    with pytest.raises(ValidationError):
        ExtractionOutput.model_validate({"sentiment": "furious"})
    chat = {"model": "tucano-sql", "messages": [{"role": "user", "content": "x", "name": "ana"}], "temperature": 0, "stream": True}
    assert ChatRequest.model_validate(chat).messages[0].name == "ana"
    assert ChatRequest.model_validate({**chat, "frequency_penalty": -0.5}).frequency_penalty == -0.5
    with pytest.raises(ValidationError, match="frequency_penalty"):
        ChatRequest.model_validate({**chat, "frequency_penalty": 2.1})
    for extra in ({"logit_bias": {}}, {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            ChatRequest.model_validate({**chat, **extra})
