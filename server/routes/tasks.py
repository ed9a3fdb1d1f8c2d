"""POST /v1/tasks/{task}: one answer to one task request, scored and recorded."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import ValidationError

from rewards.references import InvalidReference
from server import answering
from server.deps import TaskPath, User
from server.errors import ApiError, invalid_input
from server.schemas import ErrorResponse, SampleChoice, Scores, ServedBy, TaskRequest, TaskResponse, Usage
from tasks import TASKS, TRAITS, check_reference, definition, first_finished_of, samples_of

router = APIRouter(tags=["tasks"])
ERRORS = {code: {"model": ErrorResponse} for code in (401, 404, 413, 422, 429, 503)}


# OpenAPI links: what a client (and a stateful fuzzer) can do next with an answer
FEEDBACK_LINK = {"links": {"GiveFeedback": {"operationId": "feedback", "requestBody": {"id": "$response.body#/id"}}}}


@router.post("/v1/tasks/{task}", response_model=TaskResponse, operation_id="run_task", responses={**ERRORS, 200: FEEDBACK_LINK})
async def run_task(task: TaskPath, body: TaskRequest, caller: User) -> TaskResponse:
    if task not in TASKS:
        raise ApiError(404, "unknown_task", f"unknown task {task!r}; tasks are {', '.join(TASKS)}")
    try:
        task_input = definition(task).parse_input(body.input)
    except ValidationError as error:
        raise invalid_input(error, "input") from None
    reference = None
    if body.reference is not None:
        try:
            reference = check_reference(task, body.reference, caller.state.settings.max_reference_bytes)
        except InvalidReference as error:
            raise ApiError(422, "invalid_request", f"reference: {error}") from None
    options = body.options
    settings = caller.state.settings
    samples = samples_of(settings, task, options.temperature) if options.samples is None else options.samples
    if options.temperature == 0.0 and samples > 1:  # asked for by the request itself
        raise ApiError(422, "invalid_request", f"options.samples: {samples} samples need a temperature above 0 (greedy "
                                               "samples are all the same answer)")
    if samples > settings.serve_samples_cap:
        raise ApiError(422, "invalid_request", f"options.samples: {samples} is more than the cap of {settings.serve_samples_cap} "
                                               "completions per request (TUCANO_SERVE_SAMPLES_CAP)")
    first = first_finished_of(settings, task) if options.first_finished is None else options.first_finished
    if options.first_finished is not None and (first == 1 or first > samples):
        raise ApiError(422, "invalid_request", f"options.first_finished: {first} must be 0 (wait for all) or 2 to the request's "
                                               f"{samples} samples (the best of one is no choice)")
    overrides = {"temperature": options.temperature, "top_p": options.top_p, "max_tokens": options.max_tokens, "seed": options.seed,
                 "frequency_penalty": options.frequency_penalty, "first_finished": first}
    prepared = await answering.prepare(caller.state, task, task_input, overrides, reference, "tasks", caller.key_id,
                                       samples=samples, with_examples=options.examples)
    record = await answering.answer(caller.state, prepared, execute=options.execute and TRAITS[task].runs_sql,
                                    include_think=options.include_think)
    reward = record.reward
    return TaskResponse(
        id=record.id, task=task, output=record.output, raw=record.raw, valid=record.valid,
        route=ServedBy(model=record.model, adapter=record.adapter, version=record.version),
        scores=Scores(total=reward.total, components=reward.components, reference_used=reward.reference_used),
        usage=Usage(prompt_tokens=record.usage.prompt_tokens, completion_tokens=record.usage.completion_tokens),
        latency_ms=record.latency_ms, examples=record.examples, answered_from=record.answered_from,
        sample=SampleChoice(chosen=record.group.chosen, of=len(record.group.samples), totals=record.group.rewards,
                            cut=record.group.cut) if record.group else None,
    )
