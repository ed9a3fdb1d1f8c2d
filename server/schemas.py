"""The API's pydantic models: the single source of the OpenAPI schema."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.records import AdapterMeta, JobProgress, Route
from common.rounds import RoundSummary
from tasks import AUTO_MODEL, INPUT_MODELS, public_models

TaskName = Annotated[str, Field(description="A task's name (its registry entry, tasks/).")]
FrequencyPenalty = Annotated[float | None, Field(
    ge=-2.0, le=2.0, description="OpenAI's frequency penalty; unset, the task's own (insights has one against loops, the others 0).")]


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class TaskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=2048)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    frequency_penalty: FrequencyPenalty = None
    execute: bool = Field(False, description="sql: run the answer read-only and return its rows.")
    include_think: bool = Field(False, description="insights: also return the <think> block.")
    samples: int | None = Field(None, ge=1, description="Completions to sample in one engine request; the best by the served score "
                                                        "is answered and all are recorded. Unset: the task's `serve_samples`; at most "
                                                        "`serve_samples_cap` (a 422 names it).")
    first_finished: int | None = Field(None, ge=0, description="Answer with the best of the first K samples to finish and cut the "
                                                               "rest, so that the answer does not wait for the longest one (2 <= K "
                                                               "<= samples; 0: wait for all). Unset: the task's "
                                                               "`serve_first_finished`.")
    examples: bool = Field(True, description="false: the prompt shows none of the team's examples and a corrected input is "
                                             "asked of the model again, so the answer is what the weights alone give.")


class TaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Validated against the task in the path by the route; documented as the four shapes.
    input: dict[str, Any] = Field(description="The task's input: extraction {review}, sql {question}, "
                                              "push {campaign, customer_name, product, ...}, insights {question, columns, rows}.",
                                  json_schema_extra=lambda schema: schema.update(
                                      anyOf=[model.model_json_schema() for model in INPUT_MODELS.values()]))
    options: TaskOptions = Field(default_factory=TaskOptions)
    reference: dict[str, Any] | str | None = Field(None, description="Optional reference answer to score against.")


class ServedBy(BaseModel):
    """Which engine model and adapter answered (the task's `Route` chose it)."""
    model: str
    adapter: str | None
    version: str


class Scores(BaseModel):
    total: float
    components: dict[str, float]
    reference_used: bool


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class SampleChoice(BaseModel):
    """Which of the request's sampled completions was answered."""
    chosen: int = Field(description="Its index among the finished ones, in the engine's order.")
    of: int = Field(description="How many finished and were scored.")
    totals: list[float] = Field(description="Each finished completion's served score, in the same order.")
    cut: int = Field(0, description="How many more were sampled and cut before they finished (`first_finished`).")


class TaskResponse(BaseModel):
    id: str
    task: TaskName
    output: Any
    raw: str
    valid: bool
    route: ServedBy
    scores: Scores
    usage: Usage
    latency_ms: float
    examples: list[str] = Field(default_factory=list, description="Ids of the team's labelled answers shown to the model as "
                                                                   "demonstrations (the most similar corrections and liked answers); "
                                                                   "while a first serve's engines hold the demo model's pretrained "
                                                                   "weights, also bootstrap rows (`<task>-bootstrap-<n>`).")
    answered_from: str | None = Field(None, description="Set when this input was corrected before: the id of the record whose "
                                                        "correction is the answer (no model was asked).")
    sample: SampleChoice | None = Field(None, description="Set when more than one completion was sampled.")


class FeedbackRequest(BaseModel):
    """A rating, a correction, or both. A correction sent alone is a label that says the answer was
    wrong: its rating is -1."""
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=64)
    rating: Literal[-1, 0, 1] | None = Field(None, description="-1, 0 or 1; unset with a correction: -1 (the answer was wrong).")
    correction: dict[str, Any] | str | None = None

    @model_validator(mode="after")
    def _a_correction_alone_is_a_label(self) -> FeedbackRequest:
        if self.rating is None:
            if self.correction is None:
                raise ValueError("a rating or a correction is required")
            self.rating = -1
        return self


class FeedbackResponse(BaseModel):
    id: str
    rating: int
    reference_set: bool


# --- OpenAI-compatible -------------------------------------------------------------------

class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = Field(None, description="Text, or OpenAI content parts (their text is used).")
    name: str | None = Field(None, max_length=64)


class ChatRequest(BaseModel):
    """The OpenAI chat request with the parameters this service honours; any other field is a 422
    naming it, rather than a parameter the caller believes applied."""
    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="tucano-extraction, tucano-sql, tucano-push, tucano-insights or tucano-auto",
                       json_schema_extra=lambda schema: schema.update(enum=[*public_models(), AUTO_MODEL]))
    messages: list[ChatMessage] = Field(min_length=1, max_length=100)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=2048)
    max_completion_tokens: int | None = Field(None, ge=1, le=2048)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    frequency_penalty: FrequencyPenalty = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1)
    stream_options: dict[str, Any] | None = None
    user: str | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    reasoning_content: str | None = Field(None, description="insights: the <think> block, kept apart from the answer")


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TucanoExtras(BaseModel):
    record_id: str
    task: TaskName
    adapter: str | None
    scores: Scores


def _absent(value) -> bool:
    return value is None


class ChunkDelta(BaseModel):
    """What a chunk adds to the assistant message; a field it does not add is left out."""
    role: Literal["assistant"] | None = Field(None, exclude_if=_absent)
    content: str | None = Field(None, exclude_if=_absent)
    reasoning_content: str | None = Field(None, exclude_if=_absent, description="insights: the <think> block, streamed apart")


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion (`stream: true`), as OpenAI's."""
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: ChatUsage | None = Field(None, exclude_if=_absent, description="the last chunk, with `stream_options.include_usage`")


class StreamError(BaseModel):
    """The last event of a stream that failed after its status was sent."""
    error: dict[str, str]


class ChatCompletion(BaseModel):
    """The OpenAI chat.completion object, with the record's id and scores under `tucano`."""
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    tucano: TucanoExtras


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tucano"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class CanaryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1, max_length=64, description="A candidate version of the task, like sql-v4.")
    share: float = Field(gt=0.0, lt=1.0, description="Share of the task's traffic the canary serves, in (0, 1).")


class Health(BaseModel):
    status: Literal["alive"]


class EngineState(BaseModel):
    url: str
    healthy: bool
    model: str | None = Field(description="The model the engine serves, as its /v1/models names it.")
    error: str | None = Field(description="Why its last health probe failed.")


class Readiness(BaseModel):
    """The body of /readyz, with 200 when ready and 503 (with Retry-After) when not."""
    ready: bool = Field(description="Redis answers and every kind of engine has one that serves.")
    degraded: bool = Field(description="An engine is out, though each kind still has one that serves.")
    redis: bool
    engines: dict[str, list[EngineState]]
    routes_version: int = Field(description="The routing table's version this gateway has seen (-1: none yet).")
    jobs: list[JobProgress] = Field(description="Long jobs running (a training round, the demo model's fine-tuning).")


class RoundList(BaseModel):
    rounds: list[RoundSummary] = Field(description="Round summaries, newest first.")


class AdapterList(BaseModel):
    adapters: list[AdapterMeta] = Field(description="Every registered version, by task and age.")
    routes: dict[str, Route] = Field(description="Each task's route; a task without one is served by the base model.")


class SeriesPoint(BaseModel):
    start: float = Field(description="The bucket's start (epoch seconds).")
    requests: int
    mean_reward: float | None = Field(description="Mean served reward of the bucket's answers; null without any.")
    invalid: int = Field(description="Answers that did not parse or validate.")


class VersionSeries(BaseModel):
    version: str = Field(description="The adapter version that answered, or base.")
    requests: int
    mean_reward: float | None
    points: list[SeriesPoint]


class FeedbackCounts(BaseModel):
    labels: int = Field(description="Every label of the task: references sent with requests, corrections, ratings.")
    references: int
    corrections: int
    ratings: int
    positive: int
    negative: int


class Calibration(BaseModel):
    """How far the served (reference-free) score can be trusted, measured on labelled answers."""
    n: int = Field(description="Labelled answers with a reference or correction.")
    rank_correlation: float | None = Field(description="Spearman's rho of the served score against the reference score of the "
                                                       "same answers; null below 10 answers.")
    liked: int = Field(description="Answers rated +1.")
    corrected: int = Field(description="Answers corrected or rated -1.")
    separation: float | None = Field(description="Probability that a liked answer has a higher served score than a corrected "
                                                 "one (ROC AUC); 0.5 is a coin; null below 10 verdicts.")
    weak: bool | None = Field(description="True where either measure is below 0.7: the served score is not a measure of "
                                          "quality here. Null: too few labels to say.")


class TaskCalibration(Calibration):
    versions: dict[str, Calibration] = Field(description="The same per adapter version that served the labelled answers.")


class TaskStats(BaseModel):
    requests: int
    mean_reward: float | None
    versions: list[VersionSeries] = Field(description="Per version that answered in the window, most requests first.")
    feedback: FeedbackCounts
    calibration: TaskCalibration = Field(description="The served score against the team's labels (newest labels).")


class Stats(BaseModel):
    start: float
    end: float
    bucket_s: float
    records: int = Field(description="Records read in the window.")
    truncated: bool = Field(description="The window held more records than TUCANO_STATS_MAX_RECORDS: the oldest were left out.")
    tasks: dict[str, TaskStats]
    jobs: list[JobProgress] = Field([], description="Long jobs running now (a training round), each with where it stands.")


# --- the review queue ----------------------------------------------------------------------

class SqlResult(BaseModel):
    columns: list[str]
    rows: list[list[Any]] = Field(description="At most 20 rows.")
    error: str | None


class ReviewItem(BaseModel):
    id: str = Field(description="The record: what /v1/feedback takes.")
    time: float
    input: dict[str, Any]
    output: Any
    raw: str
    version: str
    score: float = Field(description="The served score.")
    components: dict[str, float]
    priority: float = Field(description="How much a label would help; the queue is sorted by it.")
    why: list[str] = Field(description="What raised its priority.")
    executed: SqlResult | None = Field(None, description="sql: the answer run read-only, as the reviewer should see it.")


class ReviewQueue(BaseModel):
    task: TaskName
    items: list[ReviewItem]
