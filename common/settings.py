"""One Settings object for the whole product, read from TUCANO_* environment variables and
an optional TOML file (TUCANO_CONFIG=path/to/tucano.toml; environment variables win).

Bad settings fail at start-up with a message that names the environment variable, so a
typo in a deployment shows up before any engine or trainer starts.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from common.records import RewardContext
from common.tasks import EngineKind

GrpoAdvantage = Literal["sum", "gdpo", "fields", "relevant"]
"""How GRPO turns a group's scores into advantages (`Settings.grpo_advantage`)."""
GRPO_ADVANTAGES: tuple[str, ...] = get_args(GrpoAdvantage)

ENV_PREFIX = "TUCANO_"
ENGINE_TIMEOUT_S = 120.0
SERVED_LOGPROB_TOLERANCE = 0.1
CONFIG_FILE_ENV = "TUCANO_CONFIG"


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names it."""


# The bounds of the training settings a task may have its own of: one home, for the general
# setting and for a task's own (`TaskTraining`).
TimeBudget = Annotated[float, Field(gt=0)]
LearningRate = Annotated[float, Field(gt=0, le=1)]
BatchSize = Annotated[int, Field(ge=1)]
GroupSize = Annotated[int, Field(ge=2)]
KlCoefficient = Annotated[float, Field(ge=0, le=10)]


class TaskTraining(BaseModel):
    """Training settings that one task trains with instead of the general ones (`task_training`);
    unset: the general setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_learning_rate: LearningRate | None = None
    sft_batch_size: BatchSize | None = None
    train_time_budget_s: TimeBudget | None = None
    sft_from_liked: bool | None = None
    train_gradient_checkpointing: bool | None = None
    grpo_num_generations: GroupSize | None = None
    auto_grpo: bool | None = None
    grpo_beta: KlCoefficient | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    data_dir: Path = Field(Path(".tucano"), description="Where models, DB, datasets, adapters, embedded Redis data and benchmark results live.")
    seed: int = Field(1234, ge=0, description="Seed for bootstrap data, model init and evaluation sampling.")

    # State
    redis_url: str | None = Field(None, description="Redis/Valkey URL; unset starts an embedded Valkey in the data dir.")

    # Engines
    base_engine_urls: list[str] = Field(default_factory=list, description="OpenAI-compatible vLLM base servers (JSON list); empty starts one locally.")
    think_engine_url: str | None = Field(None, description="vLLM server of the Think model; unset starts one locally.")
    base_model: str | None = Field(None, description="Path or hub id of the Base model; default: the bootstrap model in the data dir.")
    think_model: str | None = Field(None, description="Path or hub id of the Think model; default: the bootstrap model in the data dir.")
    engine_device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where locally started engines run; auto picks cuda when a GPU is visible.")
    engine_cpu_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="The vLLM engines a CPU machine starts itself: bf16 or fp32 weights and compute; auto: bf16 where the "
                            "CPU computes it natively (AVX512-BF16, AMX), where it answered a gate's burst 1.2-1.6x faster here.")
    engine_timeout_s: float = Field(ENGINE_TIMEOUT_S, gt=0, le=3600, description="How long the gateway waits for an engine's "
                                    "answer (a stream: for its next token) before it answers 504 engine_timeout. On two CPU cores "
                                    "with 8 insights requests in flight, the longest answer took 106 s and one went past 120 s.")

    # Gateway
    host: str = Field("127.0.0.1", description="Gateway bind address.")
    port: int = Field(8000, ge=1, le=65535, description="Gateway port.")
    gateway_workers: int = Field(1, ge=1, le=64, description="Gateway worker processes (uvicorn workers): more use more cores for routing, scoring, records.")
    user_api_key: SecretStr | None = Field(None, description="Bearer key of user routes (tasks, chat, feedback, lists).")
    admin_api_key: SecretStr | None = Field(None, description="Bearer key of admin routes (promote, rollback, canary) and of user routes.")
    allow_open_bind: bool = Field(False, description="Let `serve` listen on a non-loopback address with no key configured.")
    rate_limit_per_minute: int = Field(1200, ge=0, description="Requests per minute per key (or per client address without keys); 0: off.")
    feedback_rate_limit_per_minute: int = Field(600, ge=0, description="Feedback posts per minute per key; 0: off.")
    max_reference_bytes: int = Field(16 * 1024, ge=256, description="Largest reference or correction (JSON bytes).")
    access_log: bool = Field(False, description="Log every HTTP request (uvicorn's access log). Off by default: it costs "
                             "the gateway ~0.4 ms per request on the request path; answered requests are in the records "
                             "stream and every error response is counted in /metrics.")
    max_request_bytes: int = Field(256 * 1024, ge=1024, description="Largest accepted request body.")
    sql_time_limit_s: float = Field(1.0, gt=0, le=60, description="Wall-clock limit of one SQL query (scoring, and `execute: true`).")
    sql_row_cap: int = Field(1000, ge=1, le=100_000, description="Rows one SQL query may return (scoring, and `execute: true`).")
    records_stream_maxlen: int = Field(200_000, ge=1000, description="Records kept in the stream (trimming never drops unacknowledged ones).")
    stats_max_records: int = Field(50_000, ge=100, le=1_000_000, description="Newest records `/v1/stats` (the dashboard's "
                                   "time series) reads per call; older ones in its window are left out and it says so.")

    # Served answers as rollouts
    serve_samples: dict[str, int] | None = Field(
        None,
        description="Completions the gateway asks vLLM for per request, per task (JSON object; one engine request with `n`, "
                    "its prompt's prefill shared): every one is scored, the best by the served score is answered, and the "
                    "whole group is recorded as a rollout for the round's GRPO. 1 turns it off for that task; once set, a task "
                    "not named gets 1. Unset: each task's own (tasks/: push and extraction 4, the others 1, as measured in "
                    "bench samples and bench learn, docs/results.md). Streaming requests are always sampled once.")
    serve_samples_cap: int = Field(8, ge=1, le=32, description="Most completions one request may ask for (`options.samples`).")
    serve_first_finished: dict[str, int] | None = Field(
        None,
        description="Per task (JSON object): answer a sampled request with the best of the first K of its samples to finish "
                    "(2 <= K), and cut the rest (vLLM aborts them), so that the answer does not wait for the longest "
                    "sample. 0, or K at least the request's samples, waits for all. Once set, a task not named gets 0. "
                    "Unset: each task's own (tasks/). A cut group is recorded with what was cut and is not trained on.")

    # Corrections that act at once
    examples_tasks: list[str] | None = Field(None, description="Tasks whose prompts carry the team's most similar corrected or "
                                             "liked answers as demonstrations (JSON list; [] turns retrieval off). Unset: each "
                                             "task's own (tasks/: extraction, sql and push).")
    examples_k: int = Field(3, ge=1, le=8, description="Demonstrations per prompt, the most similar first (BM25 over the inputs).")
    train_with_examples: bool = Field(False, description="A round's prompts show each input the team's examples most similar "
                                      "to it, as serving does for the tasks in `examples_tasks` (never the input's own label). "
                                      "Off: on two cores the longer prompts cost SFT steps in the same time budget, and versions "
                                      "trained so did worse as served than versions trained on bare prompts (docs/results.md, bench fix).")
    exact_repeats: bool = Field(True, description="Answer an exact repeat of a corrected input with its correction, without "
                                                  "asking the model (the response and the record say so).")
    examples_poll_s: float = Field(1.0, gt=0, le=60, description="How often a gateway looks for changed labels to re-index.")

    # Training rounds
    train_interval_minutes: float = Field(60.0, gt=0, description="How often `serve` runs a training round.")
    train_enabled: bool = Field(True, description="Whether `serve` runs periodic rounds.")
    min_records_per_task: int = Field(32, ge=1, description="New records that make a round train a task with no new labels.")
    train_method: Literal["auto", "sft", "dpo", "kto", "grpo"] = Field(
        "auto", description="auto orders SFT, DPO or KTO, and GRPO per task from what its data holds; or one method.")
    train_from: Literal["auto", "base"] = Field(
        "auto", description="auto: a candidate continues the task's active version (each round's steps add to the rounds before), "
                            "fresh on the base model when there is none or it was trained on another base model; base: always fresh.")
    train_time_budget_s: TimeBudget = Field(45.0, description="Training seconds per task per round (all its methods); a task's own in task_training wins.")
    train_idle_budget_factor: float = Field(10.0, ge=1, le=20, description="While every engine of a task's model has no request "
                                            "running or waiting (their /metrics), its training runs on past its time budget, a look "
                                            "every 10 s, up to this many times the budget; 1: never past it. 10: enough for one GRPO pass over "
                                            "a round's served push groups on two cores (docs/results.md, 2026-12-02).")
    train_learning_rate: LearningRate = Field(3e-3, description="LoRA learning rate (constant, 5% warm-up); a task's own in task_training wins.")
    train_cpu_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Training on a CPU: bf16 autocast (fp32 master weights) or fp32; auto: bf16 where the CPU computes "
                            "it natively (AVX512-BF16, AMX), which made SFT steps 1.5x faster here.")
    train_quantization: Literal["none", "nf4"] | None = Field(
        None, description="The base model while a round trains: nf4 loads it in 4-bit NF4 with bitsandbytes (QLoRA: double "
                          "quantisation, bf16 compute on a GPU, the CPU's training precision on a CPU), none in full precision; "
                          "unset: nf4 on a GPU, none on a CPU.")
    train_max_length: int = Field(1024, ge=64, le=8192, description="Longest training sequence in tokens (prompt and answer).")
    train_gradient_checkpointing: bool | None = Field(
        None, description="Recompute each layer's activations in the backward pass instead of keeping them (less memory, "
                          "slower steps); unset: on a GPU only; a task's own in task_training wins.")
    task_training: dict[str, TaskTraining] | None = Field(
        None,
        description="Per task, training settings that replace the general ones for it (JSON: {task: {setting: value}}, the "
                    f"settings {', '.join(TaskTraining.model_fields)}); once set, a task not named trains with the general "
                    "ones. Unset: each task's own (tasks/: each is the one its learning was measured with, docs/results.md).")
    min_sft_examples: int = Field(8, ge=1, description="Supervised examples a task needs for `auto` to run SFT.")
    sft_max_epochs: float = Field(12.0, gt=0, description="SFT epochs over the labelled set (early stopping ends sooner).")
    sft_min_steps: int = Field(40, ge=1, description="Fewest SFT optimizer steps (more epochs when there are few labels).")
    sft_from_liked: bool = Field(True, description="A liked answer nobody corrected joins the SFT examples (when the task has any); "
                                 "a task's own in task_training wins.")
    sft_batch_size: BatchSize = Field(8, description="Examples per SFT, DPO and KTO step; a task's own in task_training wins.")
    min_dpo_pairs: int = Field(16, ge=1, description="Preference pairs a task needs for `auto` to run DPO.")
    min_kto_examples: int = Field(16, ge=1, description="Rated answers (of both kinds) a task needs for `auto` to run KTO.")
    preference_epochs: float = Field(2.0, gt=0, description="Epochs of DPO or KTO over their examples.")
    dpo_beta: float = Field(0.1, gt=0, description="DPO and KTO beta.")
    preference_learning_rate: LearningRate = Field(1e-4, description="DPO's and KTO's LoRA learning rate, apart from the supervised "
                                                   "methods' (`train_learning_rate`): TRL's own LoRA recipe for both is 1e-4; at "
                                                   "insights' supervised rate (2e-3) a KTO candidate scored 0.017 against the base "
                                                   "model's 0.335 (docs/training.md).")
    auto_far_worse_tries: int = Field(2, ge=0, le=10, description="`auto` leaves a method out of a task's plan once this many of "
                                      "its latest candidates for the task, each trained by that method alone, were far worse than "
                                      "the incumbent (the gate's whole interval below -auto_far_worse_margin), and says so in the "
                                      "plan; 0: never. A method named by TUCANO_TRAIN_METHOD always runs.")
    auto_far_worse_margin: float = Field(0.05, ge=0, le=1, description="How far below the incumbent the gate's interval must lie "
                                         "for a candidate to count as far worse (`auto_far_worse_tries`).")
    auto_grpo: bool = Field(True, description="`auto` may choose GRPO for a task that has prompts or served groups and no "
                            "supervised or preference data (the reference-free rewards); off, the plan says it is left out and "
                            "GRPO runs only with TUCANO_TRAIN_METHOD=grpo. A task's own in task_training wins (extraction's is "
                            "off: tasks/extraction.py).")
    preference_after_supervised: bool = Field(False, description="Run DPO or KTO after SFT too (auto runs them only without SFT).")
    grpo_after_supervised: bool = Field(False, description="Run GRPO after SFT/DPO/KTO too (auto runs it only without them).")
    grpo_num_generations: GroupSize = Field(4, description="Completions per prompt in a GRPO group that the round samples on an "
                                            "engine or in the trainer; smaller served groups are completed to it on an engine "
                                            "(larger ones keep their size); a task's own in task_training wins.")
    grpo_learning_rate: LearningRate = Field(1e-4, description="GRPO's LoRA learning rate, apart from the supervised methods' "
                                             "(`train_learning_rate`): 64 steps on push's served groups improved held-out "
                                             "references at 1e-4, collapsed push at 3e-4 and moved it less at 3e-5 "
                                             "(docs/results.md, 2026-12-02).")
    grpo_prompts_per_step: int = Field(2, ge=1, description="Prompts (groups) per GRPO generation batch, at least.")
    grpo_max_batches: int = Field(30, ge=0, description="Most generation batches per pass of a GRPO run: more groups than "
                                  "grpo_prompts_per_step times this make larger batches, not more steps (0: never larger).")
    grpo_groups_per_forward: int = Field(2, ge=1, description="Most groups in one forward and backward pass of GRPO: a larger "
                                         "generation batch is accumulated in passes of this many, so memory follows them, not the batch.")
    grpo_iterations: int = Field(2, ge=1, description="Optimisation passes over each generation batch (>1 lets clip-higher act).")
    grpo_max_steps: int = Field(8, ge=1, description="Most GRPO optimisation steps per task per round.")
    grpo_max_epochs: float = Field(1.0, gt=0, description="Most passes of GRPO over the round's prompts.")
    grpo_max_completion_tokens: int | None = Field(None, ge=8, le=4096, description="Longest GRPO completion; unset: the task's serving limit.")
    grpo_advantage: GrpoAdvantage = Field("sum", description=(
        "sum: the scored total, centred per group (Dr. GRPO); gdpo: each component normalised per group with a std floor, "
        "then weighted; fields: the total, with each JSON field's tokens credited with the change in its own part of it "
        "(a task whose answers are not JSON fields trains with sum, and its run says so); relevant: the total where the served "
        "score finds that a sample addresses its request (the task's `relevance` component above 0), 0 where it does not, so a "
        "group none of whose samples addresses it is flat and dropped (a task without one, or a sample scored with a "
        "reference, trains with sum)."))
    grpo_std_floor: float = Field(0.1, gt=0, le=1, description="GDPO: the least std a component is divided by.")
    grpo_importance_cap: float = Field(2.0, gt=1, le=100, description="GRPO on served groups: the cap of each token's importance "
                                       "ratio between the policy being trained and the version that sampled it (its recorded "
                                       "logprob); a token above it counts as clipped.")
    grpo_min_groups: int = Field(16, ge=1, description="Fewer served groups than this in a round: GRPO samples its groups from "
                                 "the round's prompts on a vLLM engine instead (transformers' generate only where no engine answers).")
    grpo_flat_batches_stop: int = Field(4, ge=0, description="GRPO on the policy's own samples (an engine's or generate's): "
                                        "generation batches in a row with every group flat after which the run stops, since a "
                                        "policy that gets no gradient samples alike again (0: never).")
    grpo_reload_every: int = Field(4, ge=1, description="GRPO on an engine: optimisation steps between reloads of the policy "
                                   "into it (each under a fresh name).")
    grpo_max_groups: int = Field(256, ge=0, description="Newest served groups a round's GRPO trains on per task (0: none; "
                                 "GRPO then generates from the prompts as before groups).")
    grpo_kept_scan: int = Field(5000, ge=0, description="Records a round looks back through for the groups its policy served in "
                                "earlier rounds and no version was made from (a rejected round's), trained on after its own "
                                "(0: only the round's new records).")
    grpo_continue_rejected: int = Field(2, ge=0, le=8, description="Rejected candidates in a row that a round may continue instead "
                                        "of the task's active version: each trained by GRPO alone and not found worse by its gate "
                                        "(mean paired difference >= 0, no component worse), so that rounds without a promotion add "
                                        "up their steps (trainer/methods.py: `continued`); 0: a round always continues the active version.")
    grpo_entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient (TRL's entropy_coef).")
    grpo_beta: KlCoefficient = Field(0.0, description="GRPO's KL penalty to the base model (TRL's beta; the reference is the LoRA's "
                                     "base with the adapter off, so a lineage's drift adds up against one anchor); 0: none, no "
                                     "reference pass. A task's own in task_training wins.")
    grpo_adaptive_entropy: bool = Field(False, description="TRL's adaptive entropy coefficient.")
    unlabelled_prompts_per_round: int = Field(64, ge=0, description="Newest distinct unlabelled inputs a round uses for GRPO.")
    lora_rank: int = Field(16, ge=1, le=16, description="LoRA rank (the engines accept up to 16).")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha.")
    team_eval_share: float = Field(0.2, ge=0, lt=1, description="Share of a task's labelled inputs held out as the team's eval set.")
    max_corrections_per_record: int = Field(3, ge=1, description="How often one record's correction may be set.")

    # The promotion gate, shadow replay and canary
    gate_max_rows: int = Field(64, ge=8, description="Most eval rows per task a gate decision scores (a rotating sample beyond).")
    gate_min_rows: int = Field(16, ge=4, description="Fewest eval rows a decision needs; with fewer the candidate is rejected.")
    gate_look_rows: int = Field(32, ge=0, description="The gate scores its sample in blocks of this many rows and stops after a "
                                "block once the outcome is plain (trainer/gate.py); 0: one look at every row.")
    promote_margin: float = Field(0.01, ge=-1, le=1, description="The paired difference's 95% lower bound must exceed this: "
                                  "a gain the gate is sure of but smaller than this is not one (trainer/gate.py).")
    component_tolerance: float = Field(0.05, ge=0, le=1, description="A component (each extraction field too) is significantly "
                                       "worse when its whole 95% interval lies below minus this.")
    serve_alone: bool = Field(True, description="Where a task shows the team's examples, the gate also judges a candidate "
                              "without them against the incumbent as served, and where that wins by more, the version is "
                              "promoted to be served without them (trainer/gate.py). Off: versions are judged and served "
                              "with the examples.")
    shadow_records: int = Field(16, ge=0, description="Recent real inputs a candidate answers in shadow before promotion (0: off).")
    shadow_margin: float = Field(0.02, ge=0, le=1, description="Shadow replay rejects when the candidate's whole 95% interval of "
                                 "the reference-free difference lies below minus this.")
    canary_share: float = Field(0.2, ge=0, lt=1, description="Share of its task's traffic a passed candidate serves first, as a canary "
                                "(0: promote at once).")
    canary_min_requests: int = Field(30, ge=4, description="Canary requests before it is judged.")
    canary_max_minutes: float = Field(60.0, gt=0, description="A canary still short of its requests by then is rolled back.")
    drain_seconds: float = Field(30.0, ge=0, description="How long an old version keeps serving in-flight requests before it is unloaded.")
    served_logprob_tolerance: float = Field(SERVED_LOGPROB_TOLERANCE, gt=0, le=10, description="Trained is served: the most an engine's logprobs of a "
                                            "version's probe may differ from the trainer's (mean absolute, nats) when it loads the "
                                            "version; beyond it the version is unloaded and nothing flips.")
    round_lock_seconds: float = Field(120.0, ge=5, description="Lifetime of the round lock unless renewed; a crashed trainer's lock expires after it.")
    round_lock_wait_s: float = Field(3600.0, ge=0, description="How long a trainer waits for another trainer's round to end before "
                                     "it gives up its own (0: it does not wait).")
    records_trim_seconds: float = Field(60.0, gt=0, description="How often `serve` trims the records stream.")

    # Bootstrap sizes
    bootstrap_orders: int = Field(6000, ge=500, description="Orders in the synthetic commerce DB.")
    bootstrap_model: Literal["smollm2", "gemma3", "tiny"] = Field(
        "smollm2", description="The demo models: smollm2 (SmolLM2-135M-Instruct from its wheel's GGUF), gemma3 (Gemma 3 270M), "
                               "or tiny (2-layer Qwen3 models trained from scratch, for the fastest tests).")
    bootstrap_lm_steps: int = Field(100, ge=0, description="Language-model steps per tiny model (tiny only).")
    bootstrap_sft_steps: int | None = Field(None, ge=0, description="Supervised steps of the bootstrap on the bootstrap split; "
                                            "unset: 80 for a pretrained model, 120 for the tiny ones; 0: the pretrained weights as they are.")

    @field_validator("base_engine_urls")
    @classmethod
    def _urls_are_http(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return [u.rstrip("/") for u in urls]

    @field_validator("serve_samples")
    @classmethod
    def _samples_in_range(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        bad = {task: n for task, n in (value or {}).items() if not 1 <= n <= 32}
        if bad:
            raise ValueError(f"completions per request must be 1 to 32, not {bad}")
        return value

    @field_validator("serve_first_finished")
    @classmethod
    def _first_finished_in_range(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        bad = {task: k for task, k in (value or {}).items() if k == 1 or not 0 <= k <= 32}
        if bad:
            raise ValueError(f"first finished samples must be 0 (all) or 2 to 32 (the best of one is no choice), not {bad}")
        return value

    @model_validator(mode="after")
    def _samples_within_cap(self) -> Settings:
        over = {task: n for task, n in (self.serve_samples or {}).items() if n > self.serve_samples_cap}
        if over:
            raise ValueError(f"serve_samples {over} exceeds serve_samples_cap {self.serve_samples_cap}")
        return self

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{url!r} must start with redis://, rediss:// or unix://")
        return url

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    # Derived paths: one place decides the data dir's layout.
    @property
    def root(self) -> Path:
        return _resolved(self.data_dir)

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def db_path(self) -> Path:
        return self.root / "commerce.db"

    @property
    def datasets_dir(self) -> Path:
        return self.root / "datasets"

    @property
    def adapters_dir(self) -> Path:
        return self.root / "adapters"

    @property
    def rounds_dir(self) -> Path:
        return self.root / "rounds"

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    @property
    def bench_dir(self) -> Path:
        return self.root / "bench"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def base_model_path(self) -> str:
        return self.base_model or str(self.models_dir / "base")

    @property
    def think_model_path(self) -> str:
        return self.think_model or str(self.models_dir / "think")

    def model_path_for(self, engine: EngineKind) -> str:
        """The model an engine kind serves (and its tasks train on): the Base model or the Think model."""
        return self.base_model_path if engine == EngineKind.BASE else self.think_model_path

    @property
    def loopback_only(self) -> bool:
        """Whether the gateway listens on a loopback address only (then no one else can reach it)."""
        import ipaddress

        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def reward_context(self, task_input: BaseModel) -> RewardContext:
        """What `tasks.score` gets besides the completion: the task's input (its model), and the commerce DB
        with this deployment's time limit and row cap on a query (rewards read no settings)."""
        return RewardContext(task_input, str(self.db_path), self.sql_time_limit_s, self.sql_row_cap)


@lru_cache(maxsize=64)
def _resolved(path: Path) -> Path:
    """A data dir as an absolute path (cached by value: `model_copy` with another data dir resolves anew)."""
    return Path(path).expanduser().resolve()


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else "?"
        name = ENV_PREFIX + field.upper()
        lines.append(f"invalid setting {name}: {item['msg']}")
    return "\n".join(lines)


def load_settings(**overrides) -> Settings:
    """Read the settings; raise ConfigError naming each bad setting."""
    config_file = os.environ.get(CONFIG_FILE_ENV)
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"invalid setting {CONFIG_FILE_ENV}: no such file {config_file!r}")
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None
    except SettingsError as error:  # an environment variable of a list or dict setting that is not JSON
        named = re.search(r'field "(\w+)" from source "EnvSettingsSource"', str(error))
        if named is None:
            raise ConfigError(f"invalid setting {CONFIG_FILE_ENV}: {error}") from None
        raise ConfigError(f"invalid setting {ENV_PREFIX}{named.group(1).upper()}: not JSON ({error.__cause__})") from None
    except ValueError as error:  # a TOML file that does not parse
        raise ConfigError(f"invalid setting {CONFIG_FILE_ENV}: {error}") from None
