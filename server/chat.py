"""The OpenAI chat surface over the task service: which task a chat model name means, the
assistant message made of a record (insights' reasoning kept apart from its answer), and a
streamed answer assembled into typed `chat.completion.chunk` events. The route
(`server/routes/chat.py`) only validates and hands over, as the task route does with
`server/answering.py`."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from common.records import Record
from rewards.parsing import THINK_CLOSE, THINK_OPEN
from router.classify import classify
from server import answering
from server.errors import ApiError
from server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    ChatUsage,
    ChunkChoice,
    ChunkDelta,
    Scores,
    StreamError,
    TucanoExtras,
)
from tasks import AUTO_MODEL, TRAITS, definition, public_models


def last_user_text(messages: list[ChatMessage]) -> str:
    """The task's input text: the last user message (text, or the text of its content parts)."""
    def text(content) -> str:
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))
    said = [text(m.content) for m in messages if m.role == "user"]
    if not said or not said[-1].strip():
        raise ApiError(422, "invalid_request", "messages: a non-empty user message is required")
    return said[-1]


def task_of(model: str, text: str) -> str:
    """The task a public model name serves; `tucano-auto` asks the classifier."""
    if model == AUTO_MODEL:
        return classify(text)
    models = public_models()
    if model in models:
        return models[model]
    raise ApiError(404, "model_not_found", f"unknown model {model!r}; models are {', '.join([*models, AUTO_MODEL])}")


def public_model(task: str) -> str:
    return definition(task).public_model


def _message(task: str, record: Record) -> AssistantMessage:
    """What the assistant says, and the reasoning kept apart from it (insights)."""
    if TRAITS[task].thinks:
        return AssistantMessage(content=record.output["answer"], reasoning_content=record.output.get("think"))
    field = TRAITS[task].answer_field
    if field:
        return AssistantMessage(content=record.output[field] or record.raw)
    if record.output is None or isinstance(record.output, str):  # a free-text answer is its text
        return AssistantMessage(content=record.output or record.raw)
    return AssistantMessage(content=json.dumps(record.output, ensure_ascii=False))


def _usage(record: Record) -> ChatUsage:
    usage = record.usage
    return ChatUsage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                     total_tokens=usage.prompt_tokens + usage.completion_tokens)


def completion(task: str, record: Record) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{record.id}", created=int(record.time), model=public_model(task),
        choices=[ChatChoice(message=_message(task, record), finish_reason=record.finish_reason or "stop")],
        usage=_usage(record),
        tucano=TucanoExtras(record_id=record.id, task=task, adapter=record.adapter,
                            scores=Scores(total=record.reward.total, components=record.reward.components,
                                          reference_used=record.reward.reference_used)))


class ThinkSplitter:
    """Routes streamed text to `reasoning_content` until `</think>`, then to `content`. A leading
    `<think>` (the template usually opens it in the prompt) is dropped even when it arrives split
    between deltas, as is a closing tag split between them."""

    def __init__(self, thinking: bool):
        self.thinking, self.buffer, self.opened = thinking, "", False

    def feed(self, text: str) -> list[ChunkDelta]:
        if not self.thinking:
            return [ChunkDelta(content=text)] if text else []
        self.buffer += text
        if not self.opened:
            head = self.buffer.lstrip()
            if THINK_OPEN.startswith(head):  # may still become the opening tag
                return []
            self.buffer, self.opened = head.removeprefix(THINK_OPEN), True
        out = []
        if THINK_CLOSE in self.buffer:
            reasoning, rest = self.buffer.split(THINK_CLOSE, 1)
            self.thinking, self.buffer = False, ""
            out = [ChunkDelta(reasoning_content=reasoning), ChunkDelta(content=rest.lstrip())]
        elif len(self.buffer) > len(THINK_CLOSE):  # keep a tail that might start the closing tag
            keep = len(THINK_CLOSE)
            out = [ChunkDelta(reasoning_content=self.buffer[:-keep])]
            self.buffer = self.buffer[-keep:]
        return [delta for delta in out if delta.content or delta.reasoning_content]

    def rest(self) -> list[ChunkDelta]:
        """What is still held back when the stream ends."""
        if not self.buffer.strip():
            return []
        return [ChunkDelta(reasoning_content=self.buffer) if self.thinking else ChunkDelta(content=self.buffer)]


def _event(chunk: ChatCompletionChunk | StreamError) -> str:
    return f"data: {chunk.model_dump_json()}\n\n"


async def chunk_events(state, prepared: answering.Prepared, task: str, include_usage: bool) -> AsyncIterator[str]:
    """The streamed answer as server-sent events: a role chunk, the text (insights' reasoning as
    `reasoning_content`), a finish chunk, the usage when asked for, then `[DONE]`. An error after
    the status was sent ends the stream as its last event."""
    deltas, done = await answering.stream(state, prepared)
    model, chunk_id, splitter = public_model(task), f"chatcmpl-{prepared.started:.0f}", ThinkSplitter(thinking=TRAITS[task].thinks)

    def chunk(delta: ChunkDelta | None, finish: str | None = None, usage: ChatUsage | None = None) -> str:
        choices = [ChunkChoice(delta=delta, finish_reason=finish)] if delta is not None else []
        return _event(ChatCompletionChunk(id=chunk_id, created=int(time.time()), model=model, choices=choices, usage=usage))

    async def events() -> AsyncIterator[str]:
        yield chunk(ChunkDelta(role="assistant", content=""))
        try:
            async for text in deltas:
                for delta in splitter.feed(text):
                    yield chunk(delta)
        except ApiError as error:
            yield _event(StreamError(error={"type": error.type, "message": error.message}))
            return
        for delta in splitter.rest():
            yield chunk(delta)
        record = done["record"]  # written to Redis before the stream ends
        yield chunk(ChunkDelta(), finish=record.finish_reason or "stop")
        if include_usage:
            yield chunk(None, usage=_usage(record))
        yield "data: [DONE]\n\n"

    return events()
