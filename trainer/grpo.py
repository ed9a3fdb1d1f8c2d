"""GRPO with TRL's `GRPOTrainer`, on one of two kinds of rollouts:

- served groups (`train_on_groups`, the default wherever traffic came in groups): every
  completion a request sampled, as the engine sampled it, on the prompt as it was served. A
  `rollout_func` hands TRL the recorded token ids and logprobs, so nothing is generated in the
  trainer; each token's loss is weighed by its importance ratio to the version that sampled it
  (TRL's truncated importance sampling, capped at `grpo_importance_cap`), which corrects both the
  engine's numerics and a group sampled by an older version of the lineage. The trainer's
  logprobs are taken at the temperature the groups were sampled at, as the engines' processed
  logprobs are (deploy/vllm_server.py). Top-p renormalises the engine's over its nucleus, so a
  token's ratio reads a little below 1 there; the cap acts only above. Groups smaller than
  `grpo_num_generations` (extraction and push are served as the best of 4 and learn from groups of 8) are
  first completed to it on a vLLM engine with more samples of their prompts from the policy as
  the run starts (`EngineRollouts.complete`), where one can be had.
- the round's prompts on a vLLM engine (`train_on_engine`), where traffic gave fewer than
  `grpo_min_groups` served groups: the policy is loaded into the engine under a fresh name every
  `grpo_reload_every` steps and each batch's groups are sampled there at the task's group
  temperature, with their logprobs (`trainer.rollouts`), then trained as served groups are.
- the round's prompts with transformers' `generate` (`train`), only where no engine can be had:
  the policy samples `num_generations` completions per prompt (temperature 1.0 set explicitly,
  up to the task's serving limit). The run's report says which.

Either way each completion is scored by `rewards/` (with the prompt's reference when it has one),
and the group's values become advantages (`trainer.grpo_reward`: the total, GDPO per component with a
floor on the std, or the total with each JSON field's tokens credited with its own part: `trainer.field_credit`).

What makes the recipe act (TRL 1.16 as installed):
- `num_iterations` > 1: each generation batch is optimised more than once, so the policy ratio
  leaves 1 and clip-higher (`epsilon_high=0.28`) can clip; the clip ratios are kept per step.
- `scale_rewards="none"`: no division by the group std after aggregation (Dr. GRPO).
- groups whose rewards did not vary carry no signal: they are counted per group and dropped from
  the loss (their tokens no longer dilute the others'), not left to TRL's batch-wide statistic.
- a KL penalty to the base model where the task's `grpo_beta` is above 0 (TRL's `beta`; else no
  reference pass). Its reference is the LoRA's base with the adapter off, not the version the
  run starts from (TRL's own choice for a PEFT model that already has weights): a round continues
  the active version, so a per-round anchor would let the drift of a lineage add up round after
  round. Reward hacking on push was found that way: with no penalty its policy drifted 0.25 to
  1.53 nats a token from its parent in a round and learned copy only the served score paid
  (docs/results.md, run 65).
- an optional entropy term (`entropy_coef`, or TRL's adaptive one).
- on the policy's own samples (an engine's or `generate`'s), the run stops once
  `grpo_flat_batches_stop` generation batches in a row had every group flat (`NoSignalLeft`).
"""
from __future__ import annotations

import statistics
import time
from collections import Counter

import torch
from datasets import Dataset
from transformers import TrainerCallback

from common.rounds import GrpoReport
from common.settings import Settings
from tasks import definition
from trainer import methods, trl_internals
from trainer.data import GrpoPrompt, RolloutGroup
from trainer.field_credit import FieldCredit, has_fields
from trainer.grpo_reward import StepLog, reward_function
from trainer.probe import group_logprobs
from trainer.rollouts import EngineRollouts, whole_groups

SERVED_GROUPS = "served groups"
ENGINE = "vLLM engine"
GENERATED = "transformers generate"


class _GenerationTimer:
    """Times the policy's `generate` (TRL calls it on the model it trains), so a round reports
    generation apart from optimisation."""

    def __init__(self, model):
        self.seconds, self.tokens, original = 0.0, 0, model.generate

        def generate(*args, **kwargs):
            started = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
            if isinstance(out, torch.Tensor):
                self.tokens += int(out.numel())
            return out
        model.generate = generate


def groups_per_batch(settings: Settings, groups: int) -> int:
    """Groups in one generation batch of a run over `groups`: `grpo_prompts_per_step`, or more where
    a pass would otherwise make more than `grpo_max_batches` batches. More groups make larger
    batches, not more steps: on push, one pass over 180 reference-free groups in 90 batches of 2
    gained +0.023 [-0.011, +0.065] on held-out rows (KL to the parent 0.375), in 30 batches of 6
    +0.093 [+0.044, +0.149] (KL 0.166), and over 60 groups in 30 batches of 2 +0.067 (`tucano
    bench grpo-gain`, docs/results.md). 0 turns it off."""
    if settings.grpo_max_batches <= 0:
        return settings.grpo_prompts_per_step
    return max(settings.grpo_prompts_per_step, -(-groups // settings.grpo_max_batches))


def groups_per_forward(settings: Settings, per_batch: int) -> int:
    """Groups in one forward and backward pass: the most, up to `grpo_groups_per_forward`, that
    divide the generation batch's `per_batch` evenly. The rest of the batch is accumulated, so a
    step still takes in the whole generation batch (TRL's `dapo` loss is normalised by the tokens
    of the whole batch), while memory follows the groups of one pass: round 3 of a traffic-only run
    on extraction, 180 groups in batches of 6 groups of 4 in one pass, was killed for memory at
    17.5 GB (docs/results.md, run 49). On batches of 6 of extraction's groups of 4, passes of 2
    peaked at 7.33 GB against 13.77 GB in one pass, and took 1.29x as long."""
    cap = min(per_batch, settings.grpo_groups_per_forward)
    return max(d for d in range(1, cap + 1) if per_batch % d == 0)


def _config(settings: Settings, size: int, examples: int, temperature: float, max_completion: int, importance: bool, **extra):
    """The GRPO recipe every run shares (module docstring): `size` completions a group, a batch of
    `groups_per_batch` groups, epochs over `examples` completions; `importance`: weigh each
    token by its truncated ratio to the logprobs it was sampled with."""
    from trl import GRPOConfig

    if importance:
        extra.update(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
                     vllm_importance_sampling_clip_max=settings.grpo_importance_cap)
    per_batch = groups_per_batch(settings, examples // size)
    per_forward = groups_per_forward(settings, per_batch)
    # no warm-up: its first step is at learning rate 0, and on two cores a GRPO run is a handful
    # of steps, and a warm-up spent a round's few steps below the rate (docs/results.md, run 27)
    return GRPOConfig(
        **{**methods.trainer_args(settings, settings.grpo_max_epochs, size * per_forward, examples),
           "learning_rate": settings.grpo_learning_rate, "warmup_steps": 0, "gradient_accumulation_steps": per_batch // per_forward},
        num_generations=size, num_iterations=settings.grpo_iterations, max_completion_length=max_completion,
        temperature=temperature, top_p=1.0, beta=settings.grpo_beta, epsilon=0.2, epsilon_high=0.28, scale_rewards="none",
        multi_objective_aggregation="sum_then_normalize", loss_type="dapo", entropy_coef=settings.grpo_entropy_coef,
        use_adaptive_entropy=settings.grpo_adaptive_entropy, shuffle_dataset=True, log_completions=False, **extra)


def _batches_logged(outcome: methods.TrainingRun, log: StepLog) -> None:
    """The reward function's view of each generation batch, beside TRL's per-step logs."""
    for step, batch_log in enumerate(log.batches):
        outcome.steps_log.append({"generation_batch": step, **{k: round(v, 5) for k, v in batch_log.items()}})


def train(settings: Settings, model, tokenizer, task: str, prompts: list[GrpoPrompt], budget_s: float | methods.Budget, why: str,
          progress=None, aggregation: str | None = None) -> methods.TrainingRun:
    generations = settings.grpo_num_generations
    aggregation, credit, said = _advantages(aggregation or settings.grpo_advantage, task)
    log = StepLog()
    timed_reward, scoring = _timed(reward_function(aggregation, generations, settings.grpo_std_floor, log, credit))
    config = _config(settings, generations, len(prompts) * generations, 1.0,
                     settings.grpo_max_completion_tokens or definition(task).sampling.max_tokens, False, max_steps=settings.grpo_max_steps)
    budget, metrics = methods.TimeBudget(budget_s), methods.StepMetrics()
    trainer_class = trl_internals.group_dropping_grpo_trainer()
    trainer = trainer_class(model=model, reward_funcs=[timed_reward], args=config, processing_class=tokenizer,
                            train_dataset=Dataset.from_list([p.row() for p in prompts]),
                            callbacks=[budget, metrics, methods.Progress("grpo", progress)])
    trainer.field_credit = credit
    timer = _GenerationTimer(trainer.model)
    stop = NoSignalLeft(trainer, settings.grpo_flat_batches_stop)
    trainer.add_callback(stop)
    outcome = methods.run(trainer, methods.TrainingRun("grpo", f"{why}; advantages: {said}", len(prompts)), budget, metrics)
    if outcome.stopped_by == "epochs" and outcome.steps >= settings.grpo_max_steps:
        outcome.stopped_by = "steps"
    stop.said(outcome)
    _batches_logged(outcome, log)
    outcome.seconds_by_phase = {"generation": round(timer.seconds, 2), "scoring": round(scoring["seconds"], 2),
                                "optimisation": round(outcome.seconds - timer.seconds - scoring["seconds"], 2),
                                "groups": trainer.seen_groups, "zero_variance_groups_dropped": trainer.dropped_groups}
    _credited(outcome, credit)
    outcome.grpo = report(GENERATED, trainer, outcome, settings.grpo_iterations, timer.tokens / timer.seconds if timer.seconds else None)
    return outcome


def _advantages(aggregation: str, task: str) -> tuple[str, FieldCredit | None, str]:
    """The run's aggregation, the per-field credit it needs, and how the run names it: `fields` on
    a task whose answers are not JSON fields is `sum`, and the run says so."""
    if aggregation != "fields":
        return aggregation, None, aggregation
    if not has_fields(task):
        return "sum", None, f"sum ({task}'s answers have no JSON fields to credit one by one)"
    return "fields", FieldCredit(), "fields"


def _credited(outcome: methods.TrainingRun, credit: FieldCredit | None) -> None:
    if credit is not None:
        outcome.seconds_by_phase.update(field_credit_samples=credit.samples, field_credit_whole=credit.whole)


def _timed(reward):
    """The reward function, and the seconds spent in it."""
    spent = {"seconds": 0.0}

    def timed_reward(*args, **kwargs):
        started = time.perf_counter()
        try:
            return reward(*args, **kwargs)
        finally:
            spent["seconds"] += time.perf_counter() - started
    timed_reward.__name__ = reward.__name__
    return timed_reward, spent


def usable_groups(groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], Counter]:
    """The groups one run can train on together: TRL's groups all have one size, and the policy's
    logprobs are taken at one temperature, so the most common (size, temperature) wins; the rest
    are counted, never trained as if they were of it."""
    if not groups:
        return [], Counter()
    shapes = Counter((g.size, g.temperature) for g in groups)
    (size, temperature), _ = shapes.most_common(1)[0]
    left_out = Counter()
    for (n, t), count in shapes.items():
        if (n, t) != (size, temperature):
            left_out[f"group of {n} samples at temperature {t:g} (this run: {size} at {temperature:g})"] += count
    return [g for g in groups if (g.size, g.temperature) == (size, temperature)], left_out


def train_on_groups(settings: Settings, model, tokenizer, task: str, groups: list[RolloutGroup], budget_s: float | methods.Budget, why: str,
                    progress=None, aggregation: str | None = None, policy: str | None = None, engine_url: str | None = None,
                    name_prefix: str = "complete") -> methods.TrainingRun:
    """GRPO on served groups (module docstring); `policy`: the version the LoRA starts as, whose
    groups are on-policy (the KL to it is measured on those). Groups smaller than
    `grpo_num_generations` are completed to it on the vLLM engine at `engine_url` first (the
    policy loaded under a fresh name from `name_prefix`); with no engine they train as served."""
    groups, left_out = usable_groups(groups)
    if not groups:
        raise ValueError("no served group to train on")
    rollouts, added, served = None, 0, groups[0].size
    if served < settings.grpo_num_generations:
        if engine_url:
            spec = definition(task)
            rollouts = EngineRollouts(engine_url, model, name_prefix, spec.sampling_for(settings.grpo_num_generations, {}),
                                      spec.json_schema, settings.grpo_reload_every, settings.seed, settings.adapters_dir)
            try:
                groups, added = rollouts.complete(groups, settings.grpo_num_generations)
            finally:
                rollouts.close()
            why = f"{why}; groups of {served} completed to {settings.grpo_num_generations} on the engine {engine_url}"
        else:
            why = f"{why}; groups of {served} trained as served (no engine to complete them to {settings.grpo_num_generations})"
    size, temperature = groups[0].size, groups[0].temperature
    by_key = {g.key: g for g in groups}
    aggregation, credit, said = _advantages(aggregation or settings.grpo_advantage, task)
    log = StepLog()
    reward, scoring = _timed(reward_function(aggregation, size, settings.grpo_std_floor, log, credit))

    def replay(prompts: list[str], trainer) -> dict:
        """The served samples of each block of `size` repeats of a group's key, in their order."""
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for key in whole_groups(prompts, size):
            group = by_key[key]
            out["prompt_ids"] += [group.prompt_token_ids] * size
            out["completion_ids"] += group.completion_ids
            out["logprobs"] += group.logprobs
        return out

    config = _config(settings, size, len(groups) * size, temperature or 1.0, max(len(c) for g in groups for c in g.completion_ids), True)
    started_as = policy or groups[0].version
    rows = [{"prompt": g.key, "task": task, "reference": g.reference, "context": g.context} for g in groups]
    parent = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}  # the LoRA it starts as
    budget, metrics = methods.TimeBudget(budget_s), methods.StepMetrics()
    trainer_class = trl_internals.served_groups_grpo_trainer()
    trainer = trainer_class(model=model, reward_funcs=[reward], args=config, processing_class=tokenizer, rollout_func=replay,
                            train_dataset=Dataset.from_list(rows), callbacks=[budget, metrics, methods.Progress("grpo", progress)])
    trainer.field_credit = credit
    older = sum(1 for g in groups if g.version != started_as)
    outcome = methods.run(trainer, methods.TrainingRun("grpo", f"{why}; advantages: {said}", len(groups)), budget, metrics)
    _batches_logged(outcome, log)
    generation = rollouts.seconds if rollouts else 0.0
    outcome.seconds = round(outcome.seconds + generation, 2)
    outcome.seconds_by_phase = {"generation": round(generation, 2), "scoring": round(scoring["seconds"], 2),
                                "optimisation": round(outcome.seconds - generation - scoring["seconds"], 2),
                                "groups": trainer.seen_groups, "zero_variance_groups_dropped": trainer.dropped_groups,
                                **({"samples_completed_on_engine": added, **rollouts.serving_first()} if rollouts else {}),
                                **{f"left out: {k}": v for k, v in left_out.items()}}
    _credited(outcome, credit)
    on_policy = [(g.prompt_token_ids, g.completion_ids) for g in groups if g.version == started_as][:KL_GROUPS]
    kind = f"{SERVED_GROUPS}, completed to {size} on a {ENGINE}" if rollouts else SERVED_GROUPS
    outcome.grpo = report(kind, trainer, outcome, settings.grpo_iterations,
                          rollouts.tokens / rollouts.seconds if rollouts and rollouts.seconds else None,
                          importance=(trainer.importance_tokens, trainer.importance_clipped),
                          kl=kl_to_parent(model, parent, on_policy, temperature), older=older)
    return outcome


def train_on_engine(settings: Settings, model, tokenizer, task: str, prompts: list[GrpoPrompt], engine_url: str, name_prefix: str,
                    budget_s: float | methods.Budget, why: str, progress=None, aggregation: str | None = None) -> methods.TrainingRun:
    """GRPO on the round's prompts, its groups sampled on a vLLM engine from the policy as it
    trains (module docstring). `name_prefix` makes the engine names of this run's reloads unique."""
    spec = definition(task)
    size = settings.grpo_num_generations
    sampling = spec.sampling_for(size, {})
    aggregation, credit, said = _advantages(aggregation or settings.grpo_advantage, task)
    log = StepLog()
    reward, scoring = _timed(reward_function(aggregation, size, settings.grpo_std_floor, log, credit))
    config = _config(settings, size, len(prompts) * size, sampling.temperature or 1.0, sampling.max_tokens, True)
    rollouts = EngineRollouts(engine_url, model, name_prefix, sampling, spec.json_schema, settings.grpo_reload_every, settings.seed,
                              settings.adapters_dir)
    budget, metrics = methods.TimeBudget(budget_s), methods.StepMetrics()
    trainer_class = trl_internals.served_groups_grpo_trainer()
    trainer = trainer_class(model=model, reward_funcs=[reward], args=config, processing_class=tokenizer,
                            rollout_func=lambda batch_prompts, _trainer: rollouts.generate(batch_prompts, size),
                            train_dataset=Dataset.from_list([p.row() for p in prompts]),
                            callbacks=[budget, metrics, methods.Progress("grpo", progress)])
    trainer.vllm_generation, rollouts.step = rollouts, (lambda: trainer.state.global_step)  # TRL's sync hook reloads the policy
    trainer.field_credit = credit
    stop = NoSignalLeft(trainer, settings.grpo_flat_batches_stop)
    trainer.add_callback(stop)
    parent = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    try:
        outcome = methods.run(trainer, methods.TrainingRun("grpo", f"{why}; advantages: {said}", len(prompts)), budget, metrics)
    finally:
        rollouts.close()
    stop.said(outcome)
    _batches_logged(outcome, log)
    outcome.seconds_by_phase = {"generation": round(rollouts.seconds, 2), "scoring": round(scoring["seconds"], 2),
                                "optimisation": round(outcome.seconds - rollouts.seconds - scoring["seconds"], 2),
                                "groups": trainer.seen_groups, "zero_variance_groups_dropped": trainer.dropped_groups,
                                "reloads": len(rollouts.names), **rollouts.serving_first()}
    _credited(outcome, credit)
    outcome.grpo = report(f"{ENGINE} ({len(rollouts.names)} reloads under fresh names)", trainer, outcome, settings.grpo_iterations,
                          rollouts.tokens / rollouts.seconds if rollouts.seconds else None,
                          importance=(trainer.importance_tokens, trainer.importance_clipped),
                          kl=kl_to_parent(model, parent, rollouts.parent_groups, sampling.temperature))
    return outcome


class NoSignalLeft(TrainerCallback):
    """Stops GRPO on the policy's own samples once `batches` generation batches in a row had every
    group flat (0: never). A policy whose samples all score alike gets no gradient, so it stays as
    it is and samples alike again: after sql-v1 collapsed onto one query, run 58's SQL rounds 2 and
    3 each spent 30 steps (8 minutes of two shared cores) on such groups and changed nothing."""

    def __init__(self, trainer, batches: int):
        self.trainer, self.batches, self.hit = trainer, batches, False

    def on_step_end(self, args, state, control, **kwargs):
        if self.batches and self.trainer.flat_batches_in_a_row >= self.batches:
            self.hit = control.should_training_stop = True

    def said(self, outcome: methods.TrainingRun) -> None:
        if self.hit:
            outcome.stopped_by = f"no signal: every group flat in {self.batches} generation batches in a row"


KL_GROUPS = 8  # served groups of the parent that the KL of the trained policy from it is measured on


Sampled = tuple[list[int], list[list[int]]]  # a group as the KL reads it: its prompt's token ids, each sample's


def _logprobs(model, groups: list[Sampled], temperature: float) -> torch.Tensor:
    """Every sample's completion-token logprobs under `model`, at `temperature`, concatenated."""
    return torch.cat([logprobs for prompt, completions in groups for logprobs in group_logprobs(model, prompt, completions, temperature)])


def kl_to_parent(model, parent: dict[str, torch.Tensor], groups: list[Sampled], temperature: float) -> float | None:
    """KL(parent || trained) per token, k3 estimator on the parent's own samples, both policies
    computed by the trainer (the engine's logprobs are not comparable: its JSON grammar forces
    tokens the weights alone would not give). `parent` is the LoRA's trainable weights before the
    run; they are put back for one pass and the trained ones restored after."""
    if not groups:
        return None
    named = dict(model.named_parameters())
    trained = {name: named[name].detach().clone() for name in parent}
    try:
        now = _logprobs(model, groups, temperature)
        with torch.no_grad():
            for name, value in parent.items():
                named[name].copy_(value)
        before = _logprobs(model, groups, temperature)
    finally:
        with torch.no_grad():
            for name, value in trained.items():
                named[name].copy_(value)
    log_ratio = now - before  # log(trained / parent) on tokens the parent sampled
    return float((log_ratio.exp() - 1 - log_ratio).mean())


def _mean(steps: list[dict], key: str) -> float | None:
    values = [s[key] for s in steps if isinstance(s.get(key), (int, float))]
    return round(statistics.fmean(values), 5) if values else None


def report(rollouts: str, trainer, outcome: methods.TrainingRun, iterations: int, generation_tokens_per_s: float | None,
           importance: tuple[int, int] = (0, 0), kl: float | None = None, older: int = 0) -> GrpoReport:
    """The run's watch list from TRL's logged steps and the trainer's counts."""
    steps = [s for s in outcome.steps_log if "loss" in s]
    optimisation_s = outcome.seconds_by_phase.get("optimisation") or outcome.seconds
    tokens = float(trainer.state.num_input_tokens_seen) * iterations  # each generation batch is optimised `iterations` times
    return GrpoReport(
        rollouts=rollouts, groups=trainer.seen_groups, groups_dropped=trainer.dropped_groups, steps=outcome.steps,
        generation_tokens_per_s=round(generation_tokens_per_s, 1) if generation_tokens_per_s else None,
        optimisation_tokens_per_s=round(tokens / optimisation_s, 1) if optimisation_s > 0 else 0.0,
        reward_mean=_mean(steps, "reward") or 0.0, reward_std=_mean(steps, "reward_std") or 0.0,
        clip_ratio=_mean(steps, "clip_ratio/region_mean") or 0.0, entropy=_mean(steps, "entropy"),
        completion_length=_mean(steps, "completions/mean_length") or 0.0, grad_norm=_mean(steps, "grad_norm"),
        importance_tokens=importance[0], importance_clipped=importance[1], kl_to_parent=float(f"{kl:.3g}") if kl is not None else None,
        beta=trainer.beta, kl_to_base=_mean(steps, "kl") if trainer.beta else None,
        older_groups=older, groups_per_batch=trainer.args.generation_batch_size // trainer.args.num_generations,
        group_size=trainer.args.num_generations)
