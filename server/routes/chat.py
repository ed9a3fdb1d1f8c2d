"""OpenAI-compatible `/v1/chat/completions` (streaming too) and `/v1/models`, so the official
`openai` client works unchanged. The last user message becomes the task's input; the task is
the model's (`tucano-sql`...) or, for `tucano-auto`, what the router's classifier says."""
from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from server import answering, chat
from server.deps import User
from server.errors import invalid_input
from server.schemas import ChatCompletion, ChatRequest, ErrorResponse, ModelCard, ModelList
from tasks import AUTO_MODEL, definition, first_finished_of, public_models, samples_of

router = APIRouter(tags=["openai"])
ERRORS = {code: {"model": ErrorResponse} for code in (401, 404, 413, 422, 429, 503)}
STARTED = int(time.time())
STREAMED = {"description": "with `stream: true`: chat.completion.chunk events, then `data: [DONE]`; a stream that fails after "
                           "its status was sent ends with an error event instead",
            # one server-sent event (OpenAPI 3.2's per-event reading of `schema` for text/event-stream): its data is
            # JSON, a chunk or an error (both added to the components by server/app.py), and `[DONE]` at the end
            "schema": {"type": "object", "required": ["data"], "properties": {"data": {"anyOf": [
                {"const": "[DONE]"},
                {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": [
                    {"$ref": "#/components/schemas/ChatCompletionChunk"}, {"$ref": "#/components/schemas/StreamError"}]}}]}}}}


@router.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def models(caller: User) -> ModelList:
    return ModelList(data=[ModelCard(id=name, created=STARTED) for name in (*public_models(), AUTO_MODEL)])


@router.post("/v1/chat/completions", response_model=ChatCompletion, operation_id="chat_completions", responses={
    **ERRORS, 200: {"content": {"text/event-stream": STREAMED},
                    "links": {"GiveFeedback": {"operationId": "feedback", "requestBody": {"id": "$response.body#/tucano/record_id"}}}}})
async def chat_completions(body: ChatRequest, caller: User):
    text = chat.last_user_text(body.messages)
    task = chat.task_of(body.model, text)
    overrides = {"temperature": body.temperature, "top_p": body.top_p, "max_tokens": body.max_completion_tokens or body.max_tokens,
                 "seed": body.seed, "frequency_penalty": body.frequency_penalty,
                 "first_finished": first_finished_of(caller.state.settings, task)}
    samples = 1 if body.stream else samples_of(caller.state.settings, task, body.temperature)  # the best of the task's group answers
    try:
        task_input = definition(task).input_from_text(text)
    except ValidationError as error:  # an empty or too long message for the task
        raise invalid_input(error, f"messages: the last user message as {task}'s input") from None
    prepared = await answering.prepare(caller.state, task, task_input, overrides, None, "chat", caller.key_id, samples=samples)
    if not body.stream:
        return chat.completion(task, await answering.answer(caller.state, prepared, include_think=True))
    events = await chat.chunk_events(caller.state, prepared, task, include_usage=bool((body.stream_options or {}).get("include_usage")))
    return StreamingResponse(events, media_type="text/event-stream", headers={"X-Tucano-Task": task})
