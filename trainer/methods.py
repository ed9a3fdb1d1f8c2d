"""What the methods of a round share, and which methods a task gets (`plan`).

`auto` chooses the methods from what the task's data holds, and each step says why: SFT when
there are supervised examples (corrections, reference-bearing requests); without them, DPO when
there are enough preference pairs (a liked and a disliked answer to one input), else KTO when
there are enough rated answers of both kinds; GRPO when the task has prompts and nothing of the
above (unlabelled traffic, on the reference-free rewards). DPO after SFT is left to
`preference_after_supervised` and GRPO after either to `grpo_after_supervised`: on the same
labels and held-out rows, DPO after SFT helped no task and lowered push and SQL, and `tucano
bench learn`'s ablation found GRPO after SFT lowering push too (docs/results.md).

Every method runs TRL's own trainer on the round's LoRA, for epochs over its data bounded by
the task's time budget, with a constant learning rate after a 5% warm-up, and keeps its per-step
metrics (`StepMetrics`) with the round.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import datasets
import transformers
from transformers.trainer_callback import TrainerCallback

from common.processes import bf16_on_cpu, return_freed_memory
from common.records import BASE_VERSION, AdapterMeta
from common.rounds import GateDecision, GrpoReport, MethodRun, RoundSummary
from common.settings import Settings
from trainer import trl_internals
from trainer.data import TaskData
from trainer.policy import on_gpu

# A round keeps its own per-step record; the libraries' progress bars and version notices (TRL
# names the vLLM versions it was tested with; it does not use vLLM here) only bury it.
datasets.disable_progress_bars()
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
warnings.filterwarnings("ignore", message=".*TRL currently supports vLLM.*")
warnings.filterwarnings("ignore", message=".*is_vllm_available.*")
warnings.filterwarnings("ignore", message=".*'rollout_func', which is an experimental feature.*")  # GRPO's rollouts (trainer/grpo.py)


# log keys of TRL's trainers kept per step with the round
STEP_KEYS = ("loss", "grad_norm", "learning_rate", "epoch", "entropy", "eval_loss", "mean_token_accuracy",
             "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
             "completions/mean_terminated_length", "clip_ratio/region_mean", "clip_ratio/high_mean", "clip_ratio/low_mean",
             "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "kl",
             "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max",
             "sampling/sampling_logp_difference/mean")


@dataclass
class TrainingRun:
    method: str
    why: str
    examples: int
    steps: int = 0
    epochs: float = 0.0
    seconds: float = 0.0
    stopped_by: str = "epochs"  # epochs, time budget, early stopping, steps
    steps_log: list[dict] = field(default_factory=list)
    seconds_by_phase: dict[str, float] = field(default_factory=dict)  # grpo: generation, scoring
    grpo: GrpoReport | None = None

    def summary(self) -> MethodRun:
        last = {k: v for entry in self.steps_log for k, v in entry.items()}
        return MethodRun(method=self.method, why=self.why, examples=self.examples, steps=self.steps, epochs=round(self.epochs, 2),
                         seconds=round(self.seconds, 2), stopped_by=self.stopped_by, last={k: last[k] for k in STEP_KEYS if k in last},
                         phases=self.seconds_by_phase or None, grpo=self.grpo)


def far_worse(history: list[RoundSummary], task: str, settings: Settings) -> dict[str, str]:
    """The methods `auto` leaves out of `task`'s plan, and why: those whose latest
    `auto_far_worse_tries` candidates for the task, each trained by that method alone, were far
    worse than their incumbent (the gate's whole interval below -`auto_far_worse_margin`).
    `history`: the rounds, newest first. A method that keeps making far worse candidates wastes
    every round's budget on a version the gate must keep out (KTO on insights: 0.017 against the
    base model's 0.335, round after round)."""
    tries, margin = settings.auto_far_worse_tries, settings.auto_far_worse_margin
    decisions: dict[str, list] = {}
    for summary in history:
        entry = summary.tasks.get(task)
        if entry is not None and entry.gate is not None and len(entry.plan) == 1:
            decisions.setdefault(entry.plan[0].method, []).append(entry.gate.decision)
    left_out = {}
    for method, latest in decisions.items():
        latest = latest[:tries]
        if tries and len(latest) == tries and all(d.interval[1] < -margin for d in latest):
            left_out[method] = (f"its last {tries} candidates were far worse than the incumbent "
                                f"({', '.join(f'{d.difference:+.3f}' for d in latest)}; each interval below -{margin})")
    return left_out


def left_out(history: list[RoundSummary], task: str, settings: Settings) -> dict[str, str]:
    """The methods `auto` leaves out of `task`'s plan, and why: those `far_worse` names, and GRPO
    where the task's `auto_grpo` is off (`settings` as the task trains with them)."""
    leave = far_worse(history, task, settings)
    if not settings.auto_grpo and "grpo" not in leave:
        leave["grpo"] = "auto_grpo is off for this task (its own training settings; TUCANO_TASK_TRAINING turns it on)"
    return leave


def plan(setting: str, data: TaskData, settings: Settings, left_out: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """[(method, why)] for the task, in order. `left_out`: methods `auto` must not choose, with
    why (`left_out`: the far worse ones, and GRPO where the task's `auto_grpo` is off); a method
    named by the setting runs whatever they say."""
    left_out = left_out or {}
    if setting != "auto":
        usable = {"sft": len(data.sft), "dpo": len(data.pairs), "kto": len(data.kto), "grpo": len(data.groups) + len(data.prompts)}[setting]
        return [(setting, f"TUCANO_TRAIN_METHOD={setting}")] if usable else []
    steps, skipped = [], []

    def add(method: str, why: str) -> None:
        if method in left_out:
            skipped.append(f"{method} left out: {left_out[method]}")
        else:
            steps.append((method, why))
    if len(data.sft) >= settings.min_sft_examples:
        add("sft", f"{len(data.sft)} supervised examples (corrections and references) >= {settings.min_sft_examples}")
    kinds = {e.label for e in data.kto}
    if steps and not settings.preference_after_supervised:
        pass  # preference methods after SFT measured worse here (module docstring)
    elif len(data.pairs) >= settings.min_dpo_pairs:
        add("dpo", f"{len(data.pairs)} preference pairs >= {settings.min_dpo_pairs}")
    elif len(data.kto) >= settings.min_kto_examples and len(kinds) == 2:
        add("kto", f"{len(data.kto)} rated answers of both kinds >= {settings.min_kto_examples}, "
                   f"too few pairs for DPO ({len(data.pairs)} < {settings.min_dpo_pairs})")
    if (data.groups or data.prompts) and (not steps or settings.grpo_after_supervised) and "grpo" not in left_out:
        why = ("; ".join(skipped) or "no supervised or preference data") if not steps else "TUCANO_GRPO_AFTER_SUPERVISED"
        if data.groups:
            labelled = sum(1 for g in data.groups if g.reference)
            earlier = f", {data.earlier_groups} served before this round" if data.earlier_groups else ""
            steps.append(("grpo", f"{why}: GRPO on {len(data.groups)} served groups ({labelled} scored with a label{earlier})"))
        else:
            steps.append(("grpo", f"{why}: GRPO on the prompts, no served groups "
                                  f"({len(data.prompts)} prompts, {sum(1 for p in data.prompts if p.reference)} with a reference)"))
    return steps


class Start(NamedTuple):
    """Where a candidate's LoRA starts: `weights` "base" or "active", why, and the version it
    continues (`parent`, None for the base model), which the trainer loads and the round's
    served groups follow."""
    weights: str
    why: str
    parent: AdapterMeta | None = None


def start(settings: Settings, active: AdapterMeta | None, model: str) -> Start:
    """Where a candidate's LoRA starts, "base" or "active", and why. `auto` continues the task's
    active version, so each round's steps add to what the rounds before trained: on two CPU cores a
    task's time budget buys the demo model about one epoch over a team's labels, so a fresh LoRA
    each round would relearn the same few steps over and over. A version trained on another base
    model cannot be continued: then it starts fresh.

    A round whose plan is GRPO alone may continue a rejected candidate instead (`continued`)."""
    if settings.train_from == "base":
        return Start("base", "TUCANO_TRAIN_FROM=base")
    if active is None:
        return Start("base", "no active version: a fresh LoRA on the base model")
    if active.base_model and active.base_model != model:
        return Start("base", f"the active version {active.version} was trained on another base model ({active.base_model})")
    why = "TUCANO_TRAIN_FROM=active" if settings.train_from == "active" else "each round's steps add to the rounds before"
    return Start("active", f"continues {active.version}: {why}", active)


def found_worse(decision: GateDecision) -> str | None:
    """How a gate's deciding comparison found the candidate worse than its incumbent (a mean paired
    difference below 0, or a component significantly worse), or None: what `continued` may not
    carry forward."""
    deciding = decision.deciding()
    worse = [name for name, c in deciding.components.items() if c.worse]
    if deciding.difference >= 0 and not worse:
        return None
    return f"{deciding.difference:+.4f}" + (f", {', '.join(worse)} significantly" if worse else "")


def continued(settings: Settings, active: AdapterMeta | None, model: str, adapters: list[AdapterMeta],
              plan: list[str]) -> tuple[AdapterMeta | None, str]:
    """The rejected candidate a round continues instead of `active` (the version `start` chose,
    None for the base model), and why; (None, why not) where it continues `start`'s choice.

    GRPO from traffic moves a version a little each round: `bench grpo-gain` measured +0.015 to
    +0.046 on extraction's groups of 8, while the gate's interval on 32 rows is about +-0.04, so
    such a candidate is rejected as often as one that learned nothing, and its steps were thrown
    away: every round restarted from the active version. Continuing the task's newest candidate
    lets rounds without a promotion add up their steps until the gate is sure, when all of these
    hold:
    - this round's plan is GRPO alone, and so was the candidate's (continuing a rejected SFT
      candidate on labels gained nothing and left insights worse: docs/results.md, run 4);
    - the gate rejected it comparing it with `active` itself, with a mean paired difference at
      or above 0 and no component significantly worse (a candidate the gate passed and shadow
      replay, the probe or a canary then rejected is never continued);
    - it descends from `active` through rejected candidates only, at most
      `grpo_continue_rejected` of them in a row counting itself, so a line that never passes is
      dropped for the active version again;
    - it was trained on the same base model and its files are there.
    The gate always compares a candidate with the active version, whatever it started from."""
    limit = settings.grpo_continue_rejected
    if limit <= 0 or settings.train_from == "base":
        return None, "continuing rejected candidates is off"
    if plan != ["grpo"]:
        return None, f"the plan is {'+'.join(plan) or 'empty'}, not GRPO alone"
    if not adapters:
        return None, "no earlier candidate"
    newest = max(adapters, key=lambda meta: meta.created)
    incumbent = active.version if active else BASE_VERSION
    if newest.status != "rejected":
        return None, f"the newest version {newest.version} is {newest.status}"
    gate = newest.gate
    if newest.method != "grpo" or gate is None or gate.decision.promote or gate.incumbent != incumbent:
        return None, f"{newest.version} was not a GRPO candidate rejected by its gate against {incumbent}"
    worse = found_worse(gate.decision)
    if worse:
        return None, f"{newest.version}'s gate found it worse ({worse})"
    by_version, node, depth = {meta.version: meta for meta in adapters}, newest, 0
    while node is not None and node.status == "rejected" and depth <= limit:
        node, depth = by_version.get(node.parent) if node.parent else None, depth + 1
    if depth > limit:
        return None, f"{newest.version} ends a line of more than {limit} rejected candidates: the round starts again from {incumbent}"
    if (node.version if node is not None else None) != (active.version if active else None):
        return None, f"{newest.version} does not descend from {incumbent} through rejected candidates"
    if newest.base_model and newest.base_model != model:
        return None, f"{newest.version} was trained on another base model ({newest.base_model})"
    if not os.path.isdir(newest.path):
        return None, f"{newest.version}'s files are gone ({newest.path})"
    decision = gate.decision.deciding()
    low, high = decision.interval
    return newest, (f"continues {newest.version}, rejected by its gate but not worse than {incumbent} "
                    f"({decision.difference:+.4f} [{low:+.4f}, {high:+.4f}], n={decision.n}): rounds of GRPO add up their steps "
                    f"until the gate is sure ({depth} of at most {limit} rejected in a row)")


def bf16(settings: Settings) -> bool:
    """Whether a method computes in bf16 (autocast over fp32 weights on a CPU): always on a GPU;
    on a CPU as `train_cpu_precision` says."""
    if on_gpu():
        return True
    return bf16_on_cpu(settings.train_cpu_precision)


def trainer_args(settings: Settings, epochs: float, batch_size: int, examples: int, **extra) -> dict:
    """What every method's TRL config shares: epochs over its data (at least one step), a constant
    learning rate after a 5% warm-up, every step logged, nothing saved but the final adapter.
    The output dir is only named here, never made: TRL and transformers make it when they train,
    and `run` removes it after, so a config built and never trained leaves nothing behind.
    Gradient checkpointing as `checkpointing` says. bf16 per `bf16`: on a CPU with bf16
    arithmetic, SFT steps of the demo model take about two thirds of their fp32 time at the same
    losses (docs/results.md)."""
    steps = max(1, math.ceil(epochs * examples / batch_size))
    on_cpu = not on_gpu()
    output_dir = os.path.join(tempfile.gettempdir(), f"tucano-round-{uuid.uuid4().hex}")
    return dict(output_dir=output_dir, num_train_epochs=epochs, learning_rate=settings.train_learning_rate,
                lr_scheduler_type="constant_with_warmup", warmup_steps=max(1, math.ceil(0.05 * steps)), logging_steps=1,
                save_strategy="no", report_to="none", seed=settings.seed, bf16=bf16(settings), use_cpu=on_cpu,
                disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=batch_size,
                gradient_checkpointing=checkpointing(settings), gradient_checkpointing_kwargs={"use_reentrant": False}, **extra)


def checkpointing(settings: Settings) -> bool:
    """Whether a method recomputes activations in the backward pass: as `train_gradient_checkpointing`
    says; unset, on a GPU (TRL's default, for a real model) and not on a CPU, where it made the
    demo model's SFT steps 20% slower and a short task's activations are small."""
    if settings.train_gradient_checkpointing is not None:
        return settings.train_gradient_checkpointing
    return on_gpu()


class StepMetrics(TrainerCallback):
    """Keeps every logged step (loss, grad norm, and what the trainer adds) for the round."""

    def __init__(self):
        self.steps: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.steps.append({"step": state.global_step, **{k: round(v, 5) if isinstance(v, float) else v
                                                             for k, v in logs.items() if isinstance(v, (int, float))}})


@dataclass(frozen=True)
class Budget:
    """A method's time: `seconds`, and while `idle()` says serving has nothing to do, more, a
    look at a time, up to `ceiling_s` in all (`trainer.idle`)."""
    seconds: float
    idle: Callable[[], bool] | None = None
    ceiling_s: float | None = None


IDLE_LOOK_S = 10.0  # past the budget, how long training goes on before serving is looked at again


class TimeBudget(TrainerCallback):
    """Stops training at the end of the step that reaches the deadline. A `Budget` with an idle
    probe moves the deadline on while the probe says the engines are idle, never past its ceiling;
    `extended_s` says by how much."""

    def __init__(self, budget: float | Budget):
        budget = budget if isinstance(budget, Budget) else Budget(float(budget))
        self.started = time.monotonic()
        self.deadline = self.budgeted = self.started + budget.seconds
        self.idle, self.ceiling = budget.idle, self.started + max(budget.ceiling_s or 0.0, budget.seconds)
        self.hit = False

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        if now < self.deadline:
            return
        if self.idle is not None and now < self.ceiling and self.idle():
            self.deadline = min(now + IDLE_LOOK_S, self.ceiling)
            return
        self.hit = control.should_training_stop = True

    @property
    def extended_s(self) -> float:
        """How far past its budget the deadline moved while serving was idle."""
        return round(max(0.0, self.deadline - self.budgeted), 2)


class ReturnFreedMemory(TrainerCallback):
    """After each step, the heap's free pages go back to the system (`return_freed_memory`)."""

    def on_step_end(self, args, state, control, **kwargs):
        return_freed_memory()


class Progress(TrainerCallback):
    def __init__(self, name: str, report):
        self.name, self.report = name, report

    def on_step_end(self, args, state, control, **kwargs):
        if self.report:
            self.report(self.name, state.global_step, state.max_steps)


def run(trainer, outcome: TrainingRun, budget: TimeBudget, metrics: StepMetrics) -> TrainingRun:
    """Train, then fill the outcome from the trainer's state."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # metrics are kept with the round, not printed per step
    trainer.add_callback(ReturnFreedMemory())
    trl_internals.project_labelled_positions_only()
    started = time.perf_counter()
    try:
        trainer.train()
    finally:  # nothing is saved there (save_strategy "no"), but TRL and transformers make the dir
        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    outcome.seconds = time.perf_counter() - started
    outcome.steps, outcome.epochs = trainer.state.global_step, float(trainer.state.epoch or 0.0)
    outcome.steps_log = metrics.steps
    if budget.hit:
        outcome.stopped_by = "time budget"
    if budget.extended_s:
        outcome.stopped_by += f" ({budget.extended_s:g} s past it while serving was idle)"
    return outcome
