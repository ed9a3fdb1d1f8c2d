"""OpenAI-compatible `/v1/chat/completions` (streaming too) and `/v1/models`, so the official
`openai` client works unchanged. The last user message becomes the task's input; the task is
the model's (`tucano-sql`...) or, for `tucano-auto`, what the router's classifier says."""
from __future__ import annotations

import json
import time

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from common.records import Record
from common.tasks import TRAITS
from rewards.parsing import THINK_CLOSE, THINK_OPEN
from router.classify import classify
from router.task_specs import AUTO_MODEL, PUBLIC_MODELS, TASK_SPECS
from server import answering
from server.deps import User
from server.errors import ApiError
from server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatRequest,
    ChatUsage,
    ErrorResponse,
    ModelCard,
    ModelList,
    Scores,
    TucanoExtras,
)

router = APIRouter(tags=["openai"])
ERRORS = {code: {"model": ErrorResponse} for code in (401, 404, 413, 422, 429, 503)}
STARTED = int(time.time())


@router.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def models(caller: User) -> ModelList:
    return ModelList(data=[ModelCard(id=name, created=STARTED) for name in (*PUBLIC_MODELS, AUTO_MODEL)])


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def _content(task: str, record: Record) -> tuple[str, str | None]:
    """What the assistant message says, and the reasoning kept apart from it (insights)."""
    if TRAITS[task].thinks:
        return record.output["answer"], record.output.get("think")
    if TRAITS[task].runs_sql:
        return record.output["sql"] or record.raw, None
    return (json.dumps(record.output, ensure_ascii=False) if record.output is not None else record.raw), None


def _usage(record: Record) -> ChatUsage:
    usage = record.usage
    return ChatUsage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                     total_tokens=usage.prompt_tokens + usage.completion_tokens)


def _chunk(chunk_id: str, model: str, delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
    body = {"id": chunk_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


class ThinkSplitter:
    """Routes streamed text to `reasoning_content` until `</think>`, then to `content`."""

    def __init__(self, thinking: bool):
        self.thinking, self.buffer = thinking, ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if not self.thinking:
            return [("content", text)] if text else []
        self.buffer += text
        out = []
        if THINK_CLOSE in self.buffer:
            reasoning, rest = self.buffer.split(THINK_CLOSE, 1)
            self.thinking, self.buffer = False, ""
            reasoning = reasoning.replace(THINK_OPEN, "")
            if reasoning:
                out.append(("reasoning_content", reasoning))
            if rest.lstrip():
                out.append(("content", rest.lstrip()))
        elif len(self.buffer) > len(THINK_CLOSE):  # keep a tail that might start the closing tag
            keep = len(THINK_CLOSE)
            out.append(("reasoning_content", self.buffer[:-keep].replace(THINK_OPEN, "")))
            self.buffer = self.buffer[-keep:]
        return [(k, v) for k, v in out if v]


@router.post("/v1/chat/completions", response_model=ChatCompletion, operation_id="chat_completions", responses={
    **ERRORS, 200: {"content": {"text/event-stream": {"description": "with `stream: true`: chat.completion.chunk events"}},
                    "links": {"GiveFeedback": {"operationId": "feedback", "requestBody": {"id": "$response.body#/tucano/record_id"}}}}})
async def chat_completions(body: ChatRequest, caller: User):
    state = caller.state
    user_messages = [_text(m.content) for m in body.messages if m.role == "user"]
    if not user_messages or not user_messages[-1].strip():
        raise ApiError(422, "invalid_request", "messages: a non-empty user message is required")
    text = user_messages[-1]
    if body.model == AUTO_MODEL:
        task = classify(text)
    elif body.model in PUBLIC_MODELS:
        task = PUBLIC_MODELS[body.model]
    else:
        raise ApiError(404, "model_not_found", f"unknown model {body.model!r}; models are {', '.join([*PUBLIC_MODELS, AUTO_MODEL])}")
    task_input = TASK_SPECS[task].input_from_text(text)
    overrides = {"temperature": body.temperature, "top_p": body.top_p,
                 "max_tokens": body.max_completion_tokens or body.max_tokens, "seed": body.seed,
                 "frequency_penalty": body.frequency_penalty}
    prepared = await answering.prepare(state, task, task_input, overrides, None, "chat", caller.key_id)
    public_model = f"tucano-{task}"

    if not body.stream:
        record = await answering.answer(state, prepared, include_think=True)
        content, reasoning = _content(task, record)
        return ChatCompletion(
            id=f"chatcmpl-{record.id}", created=int(record.time), model=public_model,
            choices=[ChatChoice(message=AssistantMessage(content=content, reasoning_content=reasoning),
                                finish_reason=record.finish_reason or "stop")],
            usage=_usage(record),
            tucano=TucanoExtras(record_id=record.id, task=task, adapter=record.adapter,
                                scores=Scores(total=record.reward.total, components=record.reward.components,
                                              reference_used=record.reward.reference_used)))

    deltas, done = await answering.stream(state, prepared)
    chunk_id = f"chatcmpl-{prepared.started:.0f}"
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    splitter = ThinkSplitter(thinking=TRAITS[task].thinks)

    async def events():
        yield _chunk(chunk_id, public_model, {"role": "assistant", "content": ""})
        try:
            async for text_delta in deltas:
                for field, value in splitter.feed(text_delta):
                    yield _chunk(chunk_id, public_model, {field: value})
        except ApiError as error:  # the status is sent already: the stream ends with the error as its last event
            yield f"data: {json.dumps({'error': {'type': error.type, 'message': error.message}}, ensure_ascii=False)}\n\n"
            return
        if splitter.buffer:
            yield _chunk(chunk_id, public_model, {"reasoning_content" if splitter.thinking else "content": splitter.buffer})
        record = done["record"]  # written to Redis before the stream ends
        yield _chunk(chunk_id, public_model, {}, finish=record.finish_reason or "stop")
        if include_usage:
            yield _chunk(chunk_id, public_model, None, usage=_usage(record).model_dump())
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Tucano-Task": task})
