"""GRPO with TRL's `GRPOTrainer` on the round's prompts: the policy samples `num_generations`
completions per prompt (temperature 1.0 set explicitly, up to the task's serving limit), each is
scored by `rewards/` (with the prompt's reference when it has one), and the group's values
become advantages (`rewards.trl`: the total, or GDPO per component with a floor on the std).

What makes the recipe act (TRL 1.16 as installed):
- `num_iterations` > 1: each generation batch is optimised more than once, so the policy ratio
  leaves 1 and clip-higher (`epsilon_high=0.28`) can clip; the clip ratios are kept per step.
- `scale_rewards="none"`: no division by the group std after aggregation (Dr. GRPO).
- groups whose rewards did not vary carry no signal: they are counted per group and dropped from
  the loss (their tokens no longer dilute the others'), not left to TRL's batch-wide statistic.
- `beta=0` (no reference model); an optional entropy term (`entropy_coef`, or TRL's adaptive one).
"""
from __future__ import annotations

import time

import torch
from datasets import Dataset

from common.settings import Settings
from rewards.trl import StepLog, reward_function
from router.task_specs import TASK_SPECS
from trainer import methods, trl_internals


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


def train(settings: Settings, model, tokenizer, task: str, prompts: list[dict], budget_s: float, why: str,
          progress=None, aggregation: str | None = None) -> methods.TrainingRun:
    from trl import GRPOConfig

    generations = settings.grpo_num_generations
    aggregation = aggregation or settings.grpo_advantage
    log = StepLog()
    reward = reward_function(aggregation, generations, settings.grpo_std_floor, log)
    scoring = {"seconds": 0.0}

    def timed_reward(*args, **kwargs):
        started = time.perf_counter()
        try:
            return reward(*args, **kwargs)
        finally:
            scoring["seconds"] += time.perf_counter() - started
    timed_reward.__name__ = reward.__name__

    batch = generations * settings.grpo_prompts_per_step
    config = GRPOConfig(
        **{**methods.trainer_args(settings, settings.grpo_max_epochs, batch, len(prompts) * generations),
           "learning_rate": settings.grpo_learning_rate},
        max_steps=settings.grpo_max_steps, num_generations=generations, num_iterations=settings.grpo_iterations,
        max_completion_length=settings.grpo_max_completion_tokens or TASK_SPECS[task].sampling.max_tokens,
        temperature=1.0, top_p=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, scale_rewards="none",
        multi_objective_aggregation="sum_then_normalize", loss_type="dapo", entropy_coef=settings.grpo_entropy_coef,
        use_adaptive_entropy=settings.grpo_adaptive_entropy, shuffle_dataset=True, log_completions=False,
    )
    budget, metrics = methods.TimeBudget(budget_s), methods.StepMetrics()
    trainer_class = trl_internals.group_dropping_grpo_trainer()
    trainer = trainer_class(model=model, reward_funcs=[timed_reward], args=config, processing_class=tokenizer,
                            train_dataset=Dataset.from_list([{k: p[k] for k in ("prompt", "task", "reference", "context")} for p in prompts]),
                            callbacks=[budget, metrics, methods.Progress("grpo", progress)])
    timer = _GenerationTimer(trainer.model)
    outcome = methods.run(trainer, methods.TrainingRun("grpo", f"{why}; advantages: {aggregation}", len(prompts)), budget, metrics)
    if outcome.stopped_by == "epochs" and outcome.steps >= settings.grpo_max_steps:
        outcome.stopped_by = "steps"
    # the reward function's view of each generation batch, beside TRL's per-step logs
    for step, batch_log in enumerate(log.batches):
        outcome.steps_log.append({"generation_batch": step, **{k: round(v, 5) for k, v in batch_log.items()}})
    outcome.seconds_by_phase = {"generation": round(timer.seconds, 2), "scoring": round(scoring["seconds"], 2),
                                "optimisation": round(outcome.seconds - timer.seconds - scoring["seconds"], 2),
                                "groups": trainer.seen_groups, "zero_variance_groups_dropped": trainer.dropped_groups}
    return outcome
