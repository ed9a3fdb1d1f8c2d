"""The OpenAI chat surface (server/chat.py): model names to tasks, insights' reasoning kept
apart from its answer, and a streamed answer as typed chunk events documented in OpenAPI."""
from __future__ import annotations

import asyncio
import json

import pytest

from server import chat
from server.errors import ApiError
from server.schemas import ChatCompletionChunk, ChatMessage
from tests.unit.test_access import app_for
from tests.unit.test_shapes_and_routing import make_record


def test_model_names_and_messages_say_the_task_and_its_text():
    assert chat.task_of("tucano-push", "x") == "push" and chat.task_of("tucano-auto", "Quantos clientes são de SP?") == "sql"
    with pytest.raises(ApiError, match="unknown model 'gpt-4o'") as refused:
        chat.task_of("gpt-4o", "x")
    assert refused.value.status == 404 and refused.value.type == "model_not_found"
    parts = ChatMessage(role="user", content=[{"type": "text", "text": "Quantos "}, {"type": "text", "text": "pedidos?"}])
    assert chat.last_user_text([ChatMessage(role="user", content="antes"), ChatMessage(role="assistant", content="x"), parts]) == "Quantos pedidos?"
    for messages in ([ChatMessage(role="system", content="x")], [ChatMessage(role="user", content="  ")]):
        with pytest.raises(ApiError, match="a non-empty user message is required"):
            chat.last_user_text(messages)


def test_the_think_block_streams_apart_even_when_its_tag_is_split_between_deltas():
    splitter = chat.ThinkSplitter(thinking=True)
    out = [d for text in ("<think>somar as ", "vendas</th", "ink>\n\nSP lidera", " com 40%.") for d in splitter.feed(text)]
    out += splitter.rest()
    assert "".join(d.reasoning_content or "" for d in out) == "somar as vendas"
    assert "".join(d.content or "" for d in out) == "SP lidera com 40%."
    assert all((d.content is None) != (d.reasoning_content is None) for d in out)  # each delta adds to one of the two
    opened = chat.ThinkSplitter(thinking=True)  # the opening tag itself split between deltas
    out = [d for text in ("\n<th", "ink>", "pensar</think>", "ok") for d in opened.feed(text)] + opened.rest()
    assert [(d.reasoning_content, d.content) for d in out] == [("pensar", None), (None, "ok")]
    unopened = chat.ThinkSplitter(thinking=True)  # a model that never writes the tag: all of it is reasoning until it closes
    assert [d.reasoning_content for d in unopened.feed("ab") + unopened.rest()] == ["ab"]
    plain = chat.ThinkSplitter(thinking=False)
    assert [d.content for d in plain.feed("SELECT 1")] == ["SELECT 1"] and plain.feed("") == [] and plain.rest() == []


def test_a_streamed_answer_is_typed_chunk_events_then_done(monkeypatch):
    record = make_record(task="insights", raw="<think>pensar</think>\n\nSP lidera.", output={"answer": "SP lidera.", "think": "pensar"},
                         finish_reason="length")

    async def stream(state, prepared):
        async def deltas():
            for text in ("<think>pen", "sar</think>\n\nSP ", "lidera."):
                yield text
        return deltas(), {"record": record}

    monkeypatch.setattr(chat.answering, "stream", stream)
    prepared = type("Prepared", (), {"started": 12.0})()

    async def collect(include_usage: bool) -> list[str]:
        return [event async for event in await chat.chunk_events(None, prepared, "insights", include_usage)]

    events = asyncio.run(collect(True))
    assert events[-1] == "data: [DONE]\n\n" and all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    chunks = [ChatCompletionChunk.model_validate_json(e.removeprefix("data: ")) for e in events[:-1]]
    assert {c.id for c in chunks} == {"chatcmpl-12"} and {c.model for c in chunks} == {"tucano-insights"}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.reasoning_content or "" for c in chunks if c.choices) == "pensar"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "SP lidera."
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 13
    middle = json.loads(events[1].removeprefix("data: "))
    assert middle["choices"][0]["finish_reason"] is None and set(middle["choices"][0]["delta"]) == {"reasoning_content"}
    assert "usage" not in middle  # only the last chunk carries it
    assert len(asyncio.run(collect(False))) == len(events) - 1  # no usage chunk unless asked


def test_the_stream_events_shape_is_in_the_openapi_schema():
    from fastapi.testclient import TestClient

    with TestClient(app_for(None, None)) as client:
        schema = client.get("/openapi.json").json()
    streamed = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    done, data = streamed["properties"]["data"]["anyOf"]
    assert streamed["required"] == ["data"] and done == {"const": "[DONE]"}
    assert data["type"] == "string" and data["contentMediaType"] == "application/json"
    assert data["contentSchema"] == {"anyOf": [{"$ref": "#/components/schemas/ChatCompletionChunk"}, {"$ref": "#/components/schemas/StreamError"}]}
    components = schema["components"]["schemas"]
    assert {"ChatCompletionChunk", "ChunkChoice", "ChunkDelta", "ChatUsage", "StreamError"} <= set(components)
    assert components["ChatCompletionChunk"]["properties"]["choices"]["items"] == {"$ref": "#/components/schemas/ChunkChoice"}
