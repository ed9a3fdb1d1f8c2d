"""One task's optimisation in a round, with TRL: GRPO on the round's prompts (the policy
regenerates `num_generations` completions per prompt, scored component by component by
`rewards/` and combined GDPO-style, `normalize_then_sum`) or DPO on its pairs.

GRPO defaults follow PRODUCT §8: temperature 1.0 set explicitly, beta=0, scale_rewards off
(Dr. GRPO), clip-higher (epsilon_high=0.28), constant learning rate after a 5% warm-up. A group
whose rewards are all equal has zero advantage under these settings, so it adds no gradient;
its share is logged (`frac_reward_zero_std`) rather than hidden.
"""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field

from datasets import Dataset
from transformers.trainer_callback import PrinterCallback, TrainerCallback

from rewards.trl import reward_functions
from trainer.policy import on_gpu

# TRL's log keys kept with the round (means over its logged steps)
KEPT_METRICS = ("loss", "reward", "reward_std", "frac_reward_zero_std", "entropy", "completions/mean_length",
                "completions/clipped_ratio", "clip_ratio/region_mean", "clip_ratio/high_mean", "clip_ratio/low_mean",
                "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "grad_norm")


@dataclass
class Optimized:
    method: str
    steps: int
    seconds: float
    metrics: dict = field(default_factory=dict)
    generation_seconds: float = 0.0
    scoring_seconds: float = 0.0
    completion_tokens: int = 0


def _common(settings, output_dir: str, steps: int) -> dict:
    on_cpu = not on_gpu()
    return dict(output_dir=output_dir, max_steps=steps, learning_rate=settings.train_learning_rate,
                lr_scheduler_type="constant_with_warmup", warmup_steps=max(1, math.ceil(0.05 * steps)),
                logging_steps=1, save_strategy="no", report_to="none", seed=settings.seed, bf16=not on_cpu,
                use_cpu=on_cpu, disable_tqdm=True, dataloader_num_workers=0, gradient_accumulation_steps=1)


def _summarize(log_history: list[dict]) -> dict:
    out = {}
    for key in KEPT_METRICS:
        values = [entry[key] for entry in log_history if isinstance(entry.get(key), (int, float))]
        if values:
            out[key] = round(sum(values) / len(values), 4)
    for entry in log_history:  # per-component reward means (GDPO components)
        for key, value in entry.items():
            if key.startswith("rewards/") and key.endswith("/mean") and isinstance(value, (int, float)):
                out.setdefault(key, []).append(value)
    return {k: (round(sum(v) / len(v), 4) if isinstance(v, list) else v) for k, v in out.items()}


class _Progress(TrainerCallback):
    def __init__(self, name: str, report):
        self.name, self.report = name, report

    def on_step_end(self, args, state, control, **kwargs):
        if self.report:
            self.report(self.name, state.global_step, state.max_steps)


class _Timed:
    """Wraps the reward functions to time scoring apart from generation."""

    def __init__(self, funcs):
        self.seconds = 0.0
        self.funcs = [self._wrap(f) for f in funcs]

    def _wrap(self, func):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        timed.__name__ = func.__name__
        return timed


def grpo(settings, model, tokenizer, task: str, prompts: list[dict], progress=None) -> Optimized:
    from trl import GRPOConfig, GRPOTrainer

    funcs, weights = reward_functions((task,))
    timed = _Timed(funcs)
    generations = settings.grpo_num_generations
    config = GRPOConfig(
        **_common(settings, tempfile.mkdtemp(prefix="tucano-grpo-"), settings.train_max_steps),
        per_device_train_batch_size=2 * generations, num_generations=generations,
        max_completion_length=settings.grpo_max_completion_tokens, temperature=1.0, top_p=1.0,
        beta=0.0, scale_rewards="none", epsilon_high=0.28, multi_objective_aggregation="normalize_then_sum",
        reward_weights=weights, shuffle_dataset=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=timed.funcs, args=config, train_dataset=Dataset.from_list(prompts),
                          processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # metrics are kept with the round, not printed per step
    trainer.add_callback(_Progress(f"{task} grpo", progress))
    generation = _time_generate(trainer.model)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    history = trainer.state.log_history
    tokens = sum(round(e["completions/mean_length"] * config.per_device_train_batch_size) for e in history
                 if "completions/mean_length" in e)
    return Optimized("grpo", trainer.state.global_step, seconds, _summarize(history), generation_seconds=round(generation[0], 2),
                     scoring_seconds=round(timed.seconds, 2), completion_tokens=tokens)


def _time_generate(model) -> list[float]:
    """Time the policy's `generate` (TRL calls it on the model it trains), so a round reports
    generation apart from optimisation."""
    spent = [0.0]
    original = model.generate

    def generate(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started
    model.generate = generate
    return spent


def dpo(settings, model, tokenizer, task: str, pairs: list[dict], progress=None) -> Optimized:
    from trl import DPOConfig, DPOTrainer

    config = DPOConfig(**_common(settings, tempfile.mkdtemp(prefix="tucano-dpo-"), settings.train_max_steps),
                       per_device_train_batch_size=4, max_length=1024, beta=0.1,
                       # DPO alone lowers the chosen answer's likelihood along with the rejected one's
                       # (they share most tokens); an NLL term on the chosen answer (RPO) keeps it up.
                       loss_type=["sigmoid", "sft"], loss_weights=[1.0, 1.0])
    trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(pairs), processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_Progress(f"{task} dpo", progress))
    started = time.perf_counter()
    trainer.train()
    return Optimized("dpo", trainer.state.global_step, time.perf_counter() - started, _summarize(trainer.state.log_history))

