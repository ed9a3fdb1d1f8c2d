"""The answering pipeline every endpoint shares: render the task prompt with the model's own
chat template, call vLLM (the task's LoRA version when its route points at one), score the raw
completion with `rewards`, write the record to Redis, and only then answer.

A request sampled `n` > 1 times (the task's `serve_samples`, or its own `options.samples`) is one
engine request with vLLM's `n`: every completion is scored, the best by the served score is the
answer (the first of equals, in the engine's order), and the record keeps the whole group with
each sample's tokens and logprobs. Every served answer is then a sample of the serving version
that a round's GRPO can train on (`trainer.data`), and best-of-n lifts what the user gets. A task
that answers from the first K samples to finish (`serve_first_finished`) cuts the rest, so the
answer does not wait for the longest sample; its group records how many were cut, and is not
trained on as a whole group."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from common.records import BASE_VERSION, Group, Record, Reward, Sample, Sampling, Usage, label_of
from common.store import StoreUnavailable
from rewards import REWARD_VERSION
from rewards.parsing import split_think
from rewards.scoring import first_best
from rewards.sql_sandbox import run_readonly
from router.engine_client import Completion, EngineTimeout, EngineUnavailable
from router.examples import Example
from router.prompts import build_messages
from server import metrics
from server.errors import ApiError, unavailable
from server.state import GatewayState
from tasks import TRAITS, definition, score, stored_input

# Set per request by the app's overhead timer (a dict, so that the timer reads what `answer`
# wrote even if a layer between them copied the context): the task and its engine call's seconds.
ENGINE_CALL: ContextVar[dict | None] = ContextVar("engine_call", default=None)


@dataclass
class Prepared:
    task: str
    task_input: BaseModel  # the task's input model, as the edge validated it
    fields: dict  # its stored form (`stored_input`): what the record keeps
    prompt: str
    template_sha256: str
    adapter: str | None
    arm: str
    sampling: Sampling
    reference: object
    source: str
    key_id: str | None
    started: float
    examples: list[str] = field(default_factory=list)  # the labels shown as demonstrations
    repeat: Example | None = None  # an exact repeat of a corrected input: answered with this correction


async def prepare(state: GatewayState, task: str, task_input: BaseModel, sampling_overrides: dict, reference, source: str,
                  key_id: str | None = None, samples: int = 1, with_examples: bool = True) -> Prepared:
    """`samples`: completions to sample (1 for a stream); `with_examples` False: the prompt shows
    none of the team's examples and an exact repeat of a corrected input is asked of the model
    too, so the answer is what the weights alone give. A version its gate chose to serve alone
    (`RouteTable.shows_examples`) shows none either, and still answers an exact repeat with its
    correction."""
    started = time.perf_counter()
    spec = definition(task)
    fields = stored_input(task_input)
    pool = state.pools[spec.engine]
    adapter, arm = state.routes.adapter_for(task)
    repeat, shown = None, []
    if with_examples:  # reads labels from Redis and may re-index them: off the event loop
        repeat, shown = await run_in_threadpool(state.examples.for_request, task, task_input)
        shown = shown if state.routes.shows_examples(adapter) else []
    prompt = pool.template.render(build_messages(task, task_input, tuple((e.input, e.answer) for e in shown)))
    return Prepared(task, task_input, fields, prompt, pool.template.sha256, adapter, arm,
                    spec.sampling_for(samples, sampling_overrides), reference, source, key_id, started,
                    [e.id for e in shown], repeat)


def _engine_down(state: GatewayState, prepared: Prepared, error: EngineUnavailable) -> ApiError:
    """503 for an engine that is down; 504 for one that took the request and did not answer in time."""
    kind = definition(prepared.task).engine
    timed_out = isinstance(error, EngineTimeout)
    metrics.ENGINE_ERRORS.labels(kind).inc()
    metrics.REQUESTS.labels(prepared.task, prepared.adapter or BASE_VERSION, "504" if timed_out else "503").inc()
    state.store.add_failure({"time": time.time(), "task": prepared.task, "engine_kind": kind, "adapter": prepared.adapter,
                             "error": str(error)[:500], "source": prepared.source})
    if timed_out:
        return ApiError(504, "engine_timeout", f"the {kind} engine did not answer within {error.seconds:g} s; nothing was recorded")
    return unavailable("engine_unavailable", f"the {kind} engine is unavailable; retry shortly")


def _output(task: str, raw: str, scored, execute: bool, include_think: bool, state: GatewayState):
    if TRAITS[task].thinks:
        thought = split_think(raw)
        out = {"answer": thought.answer}
        if include_think:
            out["think"] = thought.think
        return out
    if TRAITS[task].runs_sql:
        out = {"sql": scored.output if isinstance(scored.output, str) else None}
        if execute and out["sql"]:
            result = run_readonly(state.settings.db_path, out["sql"], timeout_s=state.settings.sql_time_limit_s,
                                  row_cap=state.settings.sql_row_cap)
            out.update(columns=result.columns, rows=[list(r) for r in result.rows], truncated=result.truncated,
                       error=result.error)
        return out
    return scored.output


def _score_and_output(state: GatewayState, prepared: Prepared, completions: list[Completion], execute: bool, include_think: bool):
    """Every completion's score, the index of the best (the first of equals), and its output."""
    context = state.settings.reward_context(prepared.task_input)
    scores = [score(prepared.task, c.text, prepared.reference, context) for c in completions]
    best = first_best([s.total for s in scores])
    return scores, best, _output(prepared.task, completions[best].text, scores[best], execute, include_think, state)


def _group(completions: list[Completion], scores, chosen: int, sampling: Sampling) -> Group | None:
    """The record's group: the samples the request returned, and how many it cut before they finished."""
    if len(completions) < 2:
        return None
    samples = [Sample(text=c.text, token_ids=c.token_ids or [], logprobs=[round(x, 5) for x in c.logprobs or []],
                      finish_reason=c.finish_reason, valid=s.valid, reward=Reward(s.total, s.components, s.reference_used, s.details))
               for c, s in zip(completions, scores)]
    return Group(prompt_token_ids=completions[0].prompt_token_ids or [], samples=samples, chosen=chosen,
                 cut=sampling.n - len(completions))


async def finish(state: GatewayState, prepared: Prepared, completions: list[Completion], execute: bool = False,
                 include_think: bool = False) -> Record:
    """Score and record the completions of one request (one, or a group); return the record (the
    answer is built from it: the best completion's)."""
    if TRAITS[prepared.task].runs_sql:  # runs queries (up to their time limit): off the event loop
        scores, best, output = await run_in_threadpool(_score_and_output, state, prepared, completions, execute, include_think)
    else:  # pure CPU for tens of microseconds: cheaper than a thread hop
        scores, best, output = _score_and_output(state, prepared, completions, execute, include_think)
    completion, scored = completions[best], scores[best]
    record = Record(
        id=uuid.uuid4().hex, time=time.time(), task=prepared.task, source=prepared.source, input=prepared.fields,
        prompt=prepared.prompt, chat_template_sha256=prepared.template_sha256, raw=completion.text, output=output,
        valid=scored.valid, sampling=prepared.sampling, engine=completion.engine, model=completion.model,
        adapter=prepared.adapter, arm=prepared.arm,
        usage=Usage(completion.prompt_tokens, completion.completion_tokens), finish_reason=completion.finish_reason,
        latency_ms=round((time.perf_counter() - prepared.started) * 1000, 2),
        reward=Reward(scored.total, scored.components, scored.reference_used, scored.details),
        reward_version=REWARD_VERSION, reference=prepared.reference, key_id=prepared.key_id, examples=prepared.examples,
        answered_from=prepared.repeat.id if prepared.repeat else None, group=_group(completions, scores, best, prepared.sampling),
    )
    label = label_of(record, state.settings.team_eval_share) if record.reference is not None else None
    try:
        await state.store.add_record(record, label)
    except StoreUnavailable:
        metrics.RECORD_FAILURES.inc()
        metrics.REQUESTS.labels(prepared.task, record.version, "503").inc()
        raise unavailable("store_unavailable", "the record store is unavailable; retry shortly") from None
    metrics.REQUESTS.labels(prepared.task, record.version, "200").inc()
    metrics.LATENCY.labels(prepared.task, record.version).observe(record.latency_ms / 1000)
    metrics.REWARD.labels(prepared.task, record.version).observe(scored.total)
    return record


CORRECTION = "correction"  # the engine and model a record names when a correction answered it


def from_correction(prepared: Prepared) -> Completion:
    """The answer to an exact repeat of a corrected input: the correction itself, no engine asked."""
    return Completion(prepared.repeat.answer, 0, 0, "stop", CORRECTION, CORRECTION)


async def answer(state: GatewayState, prepared: Prepared, execute: bool = False, include_think: bool = False) -> Record:
    if prepared.repeat is not None:
        return await finish(state, prepared, [from_correction(prepared)], execute, include_think)
    pool = state.pools[definition(prepared.task).engine]
    called = time.perf_counter()
    try:
        completions = await pool.complete_group(prepared.prompt, prepared.adapter, prepared.sampling, definition(prepared.task).json_schema)
    except EngineUnavailable as error:
        raise _engine_down(state, prepared, error) from None
    engine_call = ENGINE_CALL.get()
    if engine_call is not None:
        engine_call.update(task=prepared.task, seconds=time.perf_counter() - called)
    return await finish(state, prepared, completions, execute, include_think)


async def stream(state: GatewayState, prepared: Prepared) -> tuple[AsyncIterator[str], dict]:
    """Text deltas from the engine; after the last one, `done["record"]` holds the written Record.
    The first delta is awaited before returning, so an engine that is down still gets a 503.
    An exact repeat of a corrected input streams its correction as one delta."""
    if prepared.repeat is not None:
        done: dict = {}
        completion = from_correction(prepared)

        async def whole() -> AsyncIterator[str]:
            yield completion.text
            done["record"] = await finish(state, prepared, [completion])

        return whole(), done
    pool = state.pools[definition(prepared.task).engine]
    info: dict = {}
    deltas = pool.stream(prepared.prompt, prepared.adapter, prepared.sampling, definition(prepared.task).json_schema, info)
    try:
        first = await deltas.__anext__()
    except StopAsyncIteration:
        first = ""
    except EngineUnavailable as error:
        raise _engine_down(state, prepared, error) from None
    done: dict = {}

    async def text() -> AsyncIterator[str]:
        parts = [first]
        if first:
            yield first
        try:
            async for delta in deltas:
                parts.append(delta)
                yield delta
        except EngineUnavailable as error:  # the engine went quiet or away mid-stream: nothing is recorded
            raise _engine_down(state, prepared, error) from None
        usage = info.get("usage") or {}
        completion = Completion("".join(parts), usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                                info.get("finish_reason"), info.get("engine", ""), info.get("model", ""))
        done["record"] = await finish(state, prepared, [completion])

    return text(), done
