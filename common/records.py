"""The typed shapes that cross rooms: what the gateway writes for every answer (`Record`), what
a user attaches to it (`Feedback`), the labelled examples kept across rounds (`Label`), what the
registry holds for every adapter version (`AdapterMeta`), each task's route (`Route`), and where
a long job stands (`JobProgress`).

The per-request shapes are msgspec Structs: the gateway encodes a record per request on its event
loop, and msgspec does it in a fraction of the json module's time; decoding checks every type.
The shapes the API answers as they are stored (`AdapterMeta`, `Route`, `JobProgress`, and the
round's in `common.rounds`) are standard dataclasses, which msgspec stores and FastAPI documents
from the one definition.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from pydantic import BaseModel

from common.datasets import input_hash, split_of
from common.rounds import DOCSTRINGS, CanaryRecord, GateRecord, TrainingData, TrainingRecord

Arm = Literal["base", "active", "canary"]
BASE_VERSION = "base"  # the version name of an answer no adapter served (`Record.version`)
Split = Literal["train", "eval"]
# as stored; `common.lifecycle` owns what may follow what
AdapterStatus = Literal["candidate", "gated", "shadowed", "canary", "active", "previous", "rejected", "retired", "rolled_back"]


class Sampling(msgspec.Struct, frozen=True):
    """The sampling parameters sent to vLLM, always explicit (never the model's generation_config)."""
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None
    frequency_penalty: float = 0.0  # OpenAI's: subtracted once per earlier use of a token in the answer
    n: int = 1  # completions sampled in the one engine request (their prompt's prefill shared); a record before groups: 1
    # 0: the group waits for all n. K (2 <= K < n): the answer is the best of the first K samples to finish, and the
    # engine request is cut there (vLLM aborts the rest), so the slowest samples do not hold the answer back
    first_finished: int = 0

    def override(self, temperature=None, top_p=None, max_tokens=None, seed=None, frequency_penalty=None, n=None,
                 first_finished=None) -> Sampling:
        return Sampling(
            self.temperature if temperature is None else temperature,
            self.top_p if top_p is None else top_p,
            self.max_tokens if max_tokens is None else max_tokens,
            self.seed if seed is None else seed,
            self.frequency_penalty if frequency_penalty is None else frequency_penalty,
            self.n if n is None else n,
            self.first_finished if first_finished is None else first_finished,
        )

    @property
    def cuts(self) -> bool:
        """Whether a request sampled so is cut once its first `first_finished` samples finish."""
        return 2 <= self.first_finished < self.n


@dataclass(frozen=True)
class RewardContext:
    """What a score depends on besides the completion and its reference: the task's input, as its
    input model (`common.tasks`), and, for a task whose answer is a query, the commerce DB and this
    deployment's limits on one query. `Settings.reward_context` builds it; GRPO's dataset carries it
    as JSON (`to_json`), and the reward function reads it back with the task's input model."""
    input: BaseModel | None = None  # None: a completion scored without its input (a reference-free check of its form)
    db_path: str | None = None
    timeout_s: float | None = None
    row_cap: int | None = None

    def to_json(self) -> str:
        given = self.input.model_dump(mode="json", exclude_none=True) if self.input is not None else None
        return json.dumps({"input": given, "db_path": self.db_path, "timeout_s": self.timeout_s, "row_cap": self.row_cap},
                          ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, input_model: type[BaseModel]) -> RewardContext:
        """The context `to_json` wrote, its input read as `input_model` (pydantic's ValidationError where
        it is not one); "" is a context without an input."""
        if not text:
            return cls()
        raw = json.loads(text)
        given = raw.get("input")
        return cls(input_model.model_validate(given) if given else None, raw.get("db_path"), raw.get("timeout_s"), raw.get("row_cap"))


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int


class Reward(msgspec.Struct):
    total: float
    components: dict[str, float]
    reference_used: bool
    details: dict[str, str] = {}


class Sample(msgspec.Struct):
    """One completion of a served group: its tokens as the engine sampled them, each sampled
    token's logprob under the sampling distribution (vLLM's processed logprobs: after temperature
    and top-p), and how the served score judged it."""
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    valid: bool
    reward: Reward


class Group(msgspec.Struct):
    """Every completion one request sampled from the serving version (`Record.adapter`, with the
    record's `sampling`), in the engine's order; `chosen` is the one answered (the best by the
    served score). A round's GRPO trains on it as a rollout group: the prompt's token ids and
    each sample's logprobs are what the importance ratio is taken against. `cut`: samples the
    request stopped before they finished (`Sampling.first_finished`); they are not in `samples`,
    so the group is not whole and no round trains on it as if it were."""
    prompt_token_ids: list[int]
    samples: list[Sample]
    chosen: int
    cut: int = 0

    @property
    def rewards(self) -> list[float]:
        return [s.reward.total for s in self.samples]


class Feedback(msgspec.Struct):
    rating: int
    at: float
    correction: Any = None


class Record(msgspec.Struct):
    """One answered request (contract §9), written to the records stream before the answer returns."""
    id: str
    time: float
    task: str
    source: str  # "tasks" or "chat"
    input: dict[str, Any]
    prompt: str  # exactly the text the engine saw
    chat_template_sha256: str
    raw: str
    output: Any
    valid: bool
    sampling: Sampling
    engine: str
    model: str
    adapter: str | None  # None: the base model (no version active yet)
    arm: Arm
    usage: Usage
    finish_reason: str | None
    latency_ms: float
    reward: Reward
    reward_version: str
    reference: Any = None  # as sent with the request; a correction replaces it when read back
    key_id: str | None = None  # a hash of the API key that made the request (feedback ownership)
    feedback: Feedback | None = None  # merged in when read; never part of the stored entry
    examples: list[str] = []  # the labels (record ids) whose answers the prompt showed as demonstrations, or bootstrap row ids
    answered_from: str | None = None  # an exact repeat of a corrected input: the label whose correction answered it
    group: Group | None = None  # sampling.n > 1: every completion sampled, scored; `raw` is the chosen one's text

    @property
    def version(self) -> str:
        return self.adapter or BASE_VERSION


class Label(msgspec.Struct):
    """A labelled example of a task, kept across rounds (the replay set) and never consumed: the
    reference a request carried or a user's correction (`answer`), and/or a user's rating of what
    was served. Its split is fixed when it arrives, by a stable hash of its input: an input in the
    team's eval set is never trained on."""
    id: str  # the record it came from
    task: str
    input: dict[str, Any]
    input_hash: str
    split: Split
    served: str  # the completion that was served
    served_version: str
    time: float
    answer: Any = None  # a checked reference or correction
    answer_source: Literal["reference", "correction"] | None = None
    rating: int | None = None  # -1, 0 or 1
    key_id: str | None = None
    updated: float = 0.0  # when its answer or rating last changed
    retired_by: str | None = None  # the adapter version that absorbed it: no longer retrieved as an example


def label_of(record: Record, eval_share: float) -> Label:
    """The label a record starts: its input, what was served, and the reference it carried."""
    digest = input_hash(record.task, record.input)
    return Label(id=record.id, task=record.task, input=record.input, input_hash=digest, split=split_of(digest, eval_share),
                 served=record.raw, served_version=record.version, time=record.time, answer=record.reference,
                 answer_source="reference" if record.reference is not None else None, key_id=record.key_id, updated=record.time)


@dataclass
class JobProgress:
    """Where a long job (the bootstrap, a training round) stands: what `/readyz`, `/v1/stats` and
    the dashboard show while it runs. Written by the job as it goes, with an expiry, so a job that
    died stops being shown."""
    __pydantic_config__ = DOCSTRINGS
    job: str
    """bootstrap or round."""
    stage: str
    share: float
    """Done so far, 0 to 1: of the whole job where its stages' expected seconds are known, else of this stage."""
    of_whole: bool
    seconds_spent: float
    seconds_left: float | None
    """The time left, estimated from the expected seconds and this machine's pace; None before any pace is known."""
    text: str
    """The line a person reads, as the job's log prints it."""
    updated: float = field(default_factory=time.time)


@dataclass
class StatusChange:
    status: AdapterStatus
    at: float
    reason: str | None = None


@dataclass
class LogprobProbe:
    """A fixed text and the logprobs the trainer computed for its last tokens under a version's
    weights (fp32, temperature 1), kept with the version: each engine that loads the version is
    asked the same tokens' prompt logprobs, and a version an engine serves otherwise (a wrong
    adapter, a stale cache, a LoRA the engine applies differently) is refused. `served_gap` is the
    distance the check compares with the tolerance."""
    __pydantic_config__ = DOCSTRINGS
    token_ids: list[int]
    scored_from: int
    """The first position whose token's logprob is compared (every later one is too)."""
    logprobs: list[float]

    def served_gap(self, served: list[float]) -> float:
        """The mean absolute difference, in nats, between an engine's logprobs of the scored tokens and the trainer's."""
        if len(served) != len(self.logprobs) or not served:
            raise ValueError(f"{len(served)} served logprobs for {len(self.logprobs)} probed tokens")
        return sum(abs(a - b) for a, b in zip(served, self.logprobs)) / len(served)


class TrainedNotServed(ConnectionError):
    """An engine loaded a version but its logprobs of the version's probe are not the trainer's:
    it was unloaded everywhere and nothing flipped. (A ConnectionError, as an engine that cannot
    load a version is, so the gateway answers 503; its own type, so a round rejects the candidate
    with the reason instead of stopping.)"""


@dataclass
class AdapterMeta:
    """A registered adapter version. Immutable in what defines it (version, files, hash, lineage);
    only its status and what the gate and the canary found are updated. A dataclass rather than a
    Struct, like the round's shapes in `common.rounds`: the API answers it as it is stored."""
    __pydantic_config__ = DOCSTRINGS
    version: str
    task: str
    path: str
    status: AdapterStatus = "candidate"
    parent: str | None = None
    round: str | None = None
    method: str | None = None
    base_model: str | None = None
    sha256: str | None = None
    created: float = field(default_factory=time.time)
    trainable_parameters: int | None = None
    data: TrainingData | None = None
    """What it was trained on: examples per kind and the labels and records they came from."""
    training: TrainingRecord | None = None
    """Per method: steps, seconds, TRL's step metrics; the stop conditions."""
    gate: GateRecord | None = None
    """The promotion gate's decision and the shadow replay."""
    canary: CanaryRecord | None = None
    """The canary's verdict and what became of it."""
    reason: str | None = None
    """Why it was rejected or retired."""
    history: list[StatusChange] = field(default_factory=list)
    probe: LogprobProbe | None = None
    """What its weights give a fixed text, checked on every engine that loads it; None: a version from before the check."""

    def shows_examples(self) -> bool:
        """Whether its prompts show the team's retrieved examples when it serves: yes unless its gate
        promoted it to be served alone (`GateDecision.served_alone`); an exact repeat of a corrected
        input is answered with the correction either way."""
        return not (self.gate is not None and self.gate.decision.served_alone)


@dataclass(kw_only=True)
class Route:
    """A task's route: the alias `active` and, while one runs, a canary with its share of the
    task's traffic. `previous` and `earlier` are the versions active before, newest first: what
    successive rollbacks go back to. Replaced whole, in one atomic step (`Store.change_route`).
    A dataclass, like `AdapterMeta`: the API answers it as stored."""
    __pydantic_config__ = DOCSTRINGS
    active: str | None = None
    """The active version; None: the base model serves the task."""
    previous: str | None = None
    """The version active before: where a rollback goes."""
    earlier: list[str] = field(default_factory=list)
    """The versions active before `previous`, newest first."""
    canary: str | None = None
    """A running canary's version."""
    canary_share: float = 0.0
    """The share of the task's traffic the canary serves."""
    canary_started: float | None = None
    """When the canary started (epoch seconds)."""
    canary_since: str | None = None
    """The records stream's last entry id when it started: its records come after."""

    def served(self) -> set[str]:
        """The versions this route sends traffic to."""
        return {version for version in (self.active, self.canary) if version}

    def without_canary(self) -> Route:
        return Route(active=self.active, previous=self.previous, earlier=list(self.earlier))


def adapter_version_name(task: str, number: int) -> str:
    """`extraction-v7`: a version's name, never reused (the number comes from a Redis counter)."""
    return f"{task}-v{number}"


class RewardTotal(msgspec.Struct):
    total: float


class RecordPoint(msgspec.Struct):
    """What a time series needs of a record; decoding only this skips the prompt and the answer."""
    time: float
    task: str
    adapter: str | None
    valid: bool
    reward: RewardTotal

    @property
    def version(self) -> str:
        return self.adapter or BASE_VERSION


ENCODER = msgspec.json.Encoder()
POINT_DECODER = msgspec.json.Decoder(RecordPoint)


def encode(value) -> bytes:
    return ENCODER.encode(value)


def decode_record(raw: bytes | str) -> Record:
    return msgspec.json.decode(raw, type=Record)


def decode_adapter(raw: bytes | str) -> AdapterMeta:
    """A stored version; one written before its sub-records were typed kept `{}` for "none yet"."""
    data = msgspec.json.decode(raw)
    for key in ("data", "training", "gate", "canary"):
        if data.get(key) == {}:
            data[key] = None
    return msgspec.convert(data, AdapterMeta)


def decode_label(raw: bytes | str) -> Label:
    return msgspec.json.decode(raw, type=Label)
