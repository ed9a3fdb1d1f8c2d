"""The typed record of learning: what a training round did with each task (`RoundSummary`,
`TaskOutcome`, its `Outcome`), and what the gate, the shadow replay, the canary and the
retirement of examples found (the sub-records an `AdapterMeta` keeps).

Written by `trainer/`, kept in Redis and under the data dir's rounds/, read by the API
(`/v1/rounds`, `/v1/adapters`), the dashboard, the CLI and the benchmarks. Standard dataclasses:
msgspec encodes and decodes them as it does the records, and FastAPI documents them in the
OpenAPI schema, so each shape has this one home.

Summaries written before the outcome was typed kept it in a string (`"status": "not trained:
<why>"`), and before the gate's record was nested kept its decision, incumbent and shadow replay
beside the outcome; `decode_round` reads those too, so a store keeps its history across the upgrades.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec
from pydantic import ConfigDict

DOCSTRINGS = ConfigDict(use_attribute_docstrings=True)  # OpenAPI takes each field's description from its docstring


class Outcome(enum.StrEnum):
    """What a round did with a task."""
    PROMOTED = "promoted"
    CANARY = "canary"  # passed its gate; serves a share of traffic until the canary's verdict
    REJECTED = "rejected"
    NOT_TRAINED = "not trained"
    FAILED = "failed"


@dataclass
class ComponentDifference:
    __pydantic_config__ = DOCSTRINGS
    difference: float
    """Mean paired difference of one reward component (candidate minus incumbent)."""
    interval: tuple[float, float]
    """Its 95% interval."""
    worse: bool
    """Whether the whole interval lies below the component tolerance."""


@dataclass
class LabelledCheck:
    """Whether a reference-free gain is matched by the team's labels on its labelled eval rows."""
    __pydantic_config__ = DOCSTRINGS
    checked: bool
    n: int
    matched: bool
    reason: str
    reference_free_difference: float | None = None
    labelled_difference: float | None = None
    labelled_interval: tuple[float, float] | None = None


@dataclass
class GateDecision:
    """The promotion gate's decision on paired eval rows (trainer/gate.py)."""
    __pydantic_config__ = DOCSTRINGS
    promote: bool
    reason: str
    """The decision in words."""
    n: int
    """Rows scored (fewer than `planned` when a look stopped the gate early)."""
    rows: dict[str, int]
    """Rows by source: team, file, bootstrap."""
    candidate_mean: float
    incumbent_mean: float
    difference: float
    """Mean paired difference, candidate minus incumbent."""
    interval: tuple[float, float]
    """Its 95% interval (percentile bootstrap over rows)."""
    components: dict[str, ComponentDifference] = field(default_factory=dict)
    seconds: float = 0.0
    planned: int = 0
    """Rows sampled for the gate."""
    looks: int = 1
    """Looks taken before it decided."""
    labelled: LabelledCheck | None = None
    alone: GateDecision | None = None
    """The same rows, the candidate answering without the team's examples and the incumbent as it
    is served, where the task shows examples (trainer/gate.py)."""
    served_alone: bool = False
    """Promoted to be served without the examples: alone it beat the incumbent as served, by more
    than with them (`AdapterMeta.shows_examples`)."""

    def deciding(self) -> GateDecision:
        """The comparison that decided: the one without the examples where it was promoted to be
        served so, else this one."""
        return self.alone if self.served_alone and self.alone is not None else self


@dataclass
class ShadowReplay:
    """The candidate against what was served, on recent real inputs."""
    __pydantic_config__ = DOCSTRINGS
    n: int
    difference: float
    interval: tuple[float, float]
    worse: bool
    """Worse beyond the shadow margin: the candidate is rejected."""
    reason: str
    basis: str | None = None
    """Reward by the team's labels, or reference-free reward (None: written before the basis was kept)."""
    served_versions: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Retirement:
    """The examples a promoted version absorbed and that retrieval no longer shows."""
    __pydantic_config__ = DOCSTRINGS
    checked: int
    """Examples it trained on that were checked."""
    retired: int
    """Of them, those it answers right on its own, now retired."""
    reason: str


@dataclass
class CanaryRecord:
    """The canary's last verdict on live records and what became of it."""
    __pydantic_config__ = DOCSTRINGS
    verdict: str | None = None
    """wait, promote or rollback."""
    reason: str | None = None
    canary_requests: int | None = None
    active_requests: int | None = None
    minutes: float | None = None
    canary_labelled: int | None = None
    active_labelled: int | None = None
    basis: str | None = None
    """live reward, or reward by the team's labels."""
    reward_difference: float | None = None
    reward_interval: tuple[float, float] | None = None
    canary_reward: float | None = None
    active_reward: float | None = None
    rating_difference: float | None = None
    rating_interval: tuple[float, float] | None = None
    outcome: str | None = None
    """promoted or rolled back, once acted on."""
    retired: Retirement | None = None


@dataclass
class GateRecord:
    """What judged a candidate before any traffic: the gate and the shadow replay."""
    __pydantic_config__ = DOCSTRINGS
    decision: GateDecision
    incumbent: str
    """What it was compared with: a version, or base."""
    shadow: ShadowReplay | None = None


@dataclass
class MethodRun:
    """One training method's run within a candidate (SFT, DPO, KTO or GRPO)."""
    __pydantic_config__ = DOCSTRINGS
    method: str
    why: str
    examples: int
    steps: int
    epochs: float
    seconds: float
    stopped_by: str
    """epochs, time budget, early stopping or steps."""
    last: dict[str, float] = field(default_factory=dict)
    """The last logged value of each of TRL's step metrics."""
    phases: dict[str, float] | None = None
    """GRPO: seconds in generation and in scoring."""
    grpo: GrpoReport | None = None
    """GRPO: what its rollouts were and the watch list of a run (groups, rewards, clipping, KL, lengths)."""


@dataclass
class GrpoReport:
    """A GRPO run's watch list: where its rollouts came from, how many groups carried signal, and
    what the policy did to them. Means are over the run's generation batches (each logged step)."""
    __pydantic_config__ = DOCSTRINGS
    rollouts: str
    """`served groups` (the records' own samples, no generation in the trainer) or `transformers generate`."""
    groups: int
    """Groups the trainer saw (a group seen again in a later epoch counts again)."""
    groups_dropped: int
    """Of those, groups whose rewards did not vary: no signal, left out of the loss."""
    steps: int
    generation_tokens_per_s: float | None
    """Completion tokens generated per second inside the trainer; None for served groups (nothing generated)."""
    optimisation_tokens_per_s: float
    """Prompt and completion tokens through the optimisation (forward and backward) per second."""
    reward_mean: float
    reward_std: float
    """The mean within-group spread of the rewards."""
    clip_ratio: float
    """The share of tokens PPO's clipped ratio (epsilon 0.2, 0.28 above) cut, over the logged steps."""
    entropy: float | None
    completion_length: float
    grad_norm: float | None
    importance_tokens: int = 0
    """Served groups: completion tokens weighed by the importance ratio to the version that sampled them."""
    importance_clipped: int = 0
    """Of those, tokens whose ratio was above `grpo_importance_cap` (capped there)."""
    kl_to_parent: float | None = None
    """KL(parent || trained) per token, on up to 8 of the parent's own served groups (k3 estimator), both
    computed by the trainer; None where no group was the parent's."""
    older_groups: int = 0
    """Served groups sampled by an older version of the lineage: weighted by the importance ratio."""
    groups_per_batch: int = 0
    """Groups in each generation batch (`trainer.grpo.groups_per_batch`): more groups, larger batches; 0 in older rounds."""
    group_size: int = 0
    """Samples in each group: the served groups' own size, or `grpo_num_generations` where the run sampled them; 0 in older rounds."""
    beta: float = 0.0
    """The KL penalty's coefficient (`grpo_beta`); 0: none, and in older rounds."""
    kl_to_base: float | None = None
    """Where `beta` is above 0: the penalised KL term per token as TRL logs it (k3 of the base model's
    logprob less the policy's, mean over the steps), on the tokens trained on: on served groups the
    serving version's samples, where the few tokens the policy pushed far below the base model
    dominate it (push, 60 groups: 4.85 at beta 0.2 while `kl_to_parent` read 0.009). None without a
    penalty."""


@dataclass
class StopCondition:
    flagged: bool
    value: float
    spikes: int | None = None


@dataclass
class TrainingRecord:
    """How a candidate was trained."""
    __pydantic_config__ = DOCSTRINGS
    methods: list[MethodRun]
    steps: dict[str, list[dict[str, Any]]]
    """Per method, TRL's log of each step."""
    seconds: dict[str, float]
    """load, each method, save."""
    quantization: str | None = None
    stop_conditions: dict[str, StopCondition] = field(default_factory=dict)
    """The stop conditions its steps raised or not (trainer/diagnostics.py)."""


@dataclass
class DataSources:
    """The label and record ids each method's examples came from."""
    sft: list[str] = field(default_factory=list)
    pairs: list[str] = field(default_factory=list)
    kto: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)


@dataclass
class TrainingData:
    """What a candidate was trained on: examples per kind, what was skipped, and their sources."""
    __pydantic_config__ = DOCSTRINGS
    sft: int = 0
    liked_sft: int = 0
    validation: int = 0
    pairs: int = 0
    kto: int = 0
    prompts: int = 0
    labelled_prompts: int = 0
    records: int = 0
    groups: int = 0
    """Served groups (every completion one request sampled) its GRPO could train on."""
    labelled_groups: int = 0
    """Of those, groups of a request that carried a reference or later got a correction: scored with it."""
    earlier_groups: int = 0
    """Of those, groups the policy served before the round's new records, read again because no
    round has yet made a version from them (its candidates were rejected, or none trained)."""
    skipped: dict[str, int] = field(default_factory=dict)
    sources: DataSources = field(default_factory=DataSources)


@dataclass
class PlanStep:
    method: str
    why: str


@dataclass
class TrainingStart:
    """What a candidate started from: the active version's weights, a rejected candidate's, or the base model."""
    weights: str
    """"active", "base", or the version of the rejected candidate it continues (`trainer.methods.continued`)."""
    why: str


@dataclass
class TaskOutcome:
    """What a round did with one task."""
    __pydantic_config__ = DOCSTRINGS
    outcome: Outcome
    why: str
    """Why the task trained, or not: its new labels or records."""
    labels: int = 0
    """The task's labels when the round read them."""
    data: TrainingData | None = None
    plan: list[PlanStep] = field(default_factory=list)
    """The methods in order, each with why `auto` chose it."""
    start: TrainingStart | None = None
    version: str | None = None
    """The candidate version it trained."""
    method: str | None = None
    training: list[MethodRun] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time per phase: training, load, gate, shadow, flip."""
    peak_rss_gb: float | None = None
    """The round process's peak resident memory once this task had trained (it only grows over a round)."""
    stop_conditions: dict[str, StopCondition] = field(default_factory=dict)
    gate: GateRecord | None = None
    """What judged the candidate: the gate's decision, against which incumbent, and the shadow replay."""
    retired: Retirement | None = None
    reason: str | None = None
    """The outcome in words: the gate's reason, or why it was not trained or failed."""


@dataclass
class RoundSummary:
    """One training round."""
    __pydantic_config__ = DOCSTRINGS
    round: str
    """The round's id, r<UTC time>-<hex>."""
    started: float
    """When it started (epoch seconds)."""
    records: int = 0
    """New records it read from the stream."""
    tasks: dict[str, TaskOutcome] = field(default_factory=dict)
    orphans_removed: list[str] = field(default_factory=list)
    stale_candidates: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    """The settings its outcome depends on."""
    acknowledged: int = 0
    """Records it acknowledged when done."""
    seconds: float = 0.0
    """How long it took."""

    def outcomes(self) -> dict[str, Outcome]:
        return {task: entry.outcome for task, entry in self.tasks.items()}


def encode_round(summary: RoundSummary) -> bytes:
    return msgspec.json.encode(summary)


def decode_round(raw: bytes | str) -> RoundSummary:
    """A stored summary, including one written before the outcome was typed."""
    data = msgspec.json.decode(raw)
    for entry in data.get("tasks", {}).values():
        if "status" in entry and "outcome" not in entry:  # "not trained: <why>", "failed: <why>", "promoted"
            outcome, _, why = str(entry.pop("status")).partition(":")
            entry["outcome"] = outcome.strip()
            if why.strip():
                entry["reason"] = why.strip()
            entry.setdefault("why", entry.get("reason") or "")
        if isinstance(entry.get("start"), dict) and "from" in entry["start"]:
            entry["start"]["weights"] = entry["start"].pop("from")
        if "trained_on" in entry and isinstance(entry.get("data"), dict):
            entry["data"]["sources"] = entry.pop("trained_on")
        if entry.get("decision") is not None and "gate" not in entry:  # kept flat before the gate's record was nested
            entry["gate"] = {"decision": entry.pop("decision"), "incumbent": entry.pop("incumbent", None) or "base",
                             "shadow": entry.pop("shadow", None)}
        for flat in ("decision", "incumbent", "shadow"):
            entry.pop(flat, None)
    return msgspec.convert(data, RoundSummary)
