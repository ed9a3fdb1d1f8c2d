"""The GRPO reward as one TRL reward function, built on `tasks.score` and weighted exactly as
scoring weighs each sample (its own weights: with a reference or without), so training and
serving never disagree about what a good answer is.

Two ways to turn a group's scores into the values TRL centres into advantages (the trainer runs
TRL with `scale_rewards="none"`, so nothing rescales them afterwards):

- `sum`: the scored total (Dr. GRPO: advantage = total - group mean).
- `gdpo`: each component centred within its group and divided by max(its group std, `std_floor`),
  then combined with the sample's weights. A component that varies only a little moves the
  advantage only a little: the floor keeps a 0.001 spread from becoming a full unit of advantage,
  which plain normalise-then-sum (std + 1e-4) does.
- `fields`: the total, as `sum`, with each sample's score kept for the trainer, which gives each
  JSON field's tokens the change in that field's own part of the total (`trainer.field_credit`).
- `relevant`: the total of a sample the served score finds addresses its request (the task's
  `relevance` component above 0), and 0 for one that does not. Most of SQL's reference-free groups
  hold no query that addresses the question, and their only spread is between queries that run
  and queries that fail, so under `sum` most of the advantage pays a query for running whatever it
  answers (docs/results.md, 2026-12-07). Under `relevant` such a group is flat and dropped, and in
  the others only the queries that address the question are paid. A sample scored with a
  reference, or of a task without a `relevance` component, keeps its total.

Completions arrive in groups of `num_generations` consecutive samples of one prompt (TRL's
sampler repeats each prompt that many times in a row). The dataset carries `task`, `reference`
and `context` columns (JSON strings). Every call also records what it saw for the round's
per-step metrics: the raw total and each component's mean, and the share of groups whose totals
did not vary.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable

from common.records import RewardContext
from common.settings import GRPO_ADVANTAGES
from rewards.scoring import Score
from tasks import definition, score
from trainer.field_credit import FieldCredit


def completion_text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return completion if isinstance(completion, str) else ""


_SCORES: dict[tuple[str, str, str, str], Score] = {}
CACHED_SCORES = 8192


def _score(task: str, completion: str, reference_json: str, context_json: str) -> Score:
    """Scores are kept (a group repeats completions), except an undecided one: a SQL reference that
    failed (a time-out under load) is run again the next time, never remembered as a failure."""
    key = (task, completion, reference_json, context_json)
    if key in _SCORES:
        return _SCORES[key]
    reference = json.loads(reference_json) if reference_json else None
    result = score(task, completion, reference, RewardContext.from_json(context_json, definition(task).input_model))
    if result.components.get("reference_ran", 1.0) == 1.0:
        if len(_SCORES) >= CACHED_SCORES:
            _SCORES.clear()
        _SCORES[key] = result
    return result


def relevant_total(task: str, scored: Score) -> float:
    """`relevant`'s value of one sample (module docstring)."""
    component = definition(task).relevance if task else None
    if component is None or component not in scored.weights:  # scored with a reference: no relevance component
        return scored.total
    return scored.total if scored.components.get(component, 0.0) > 0 else 0.0


def _as_json(value) -> str:
    if value is None or value == "":
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def gdpo_values(scores: list[Score], num_generations: int, std_floor: float) -> list[float]:
    """Per group, each component centred and scaled by max(std, floor), summed with the weights."""
    values = [0.0] * len(scores)
    for start in range(0, len(scores), num_generations):
        group = range(start, min(start + num_generations, len(scores)))
        names = {name for i in group for name in scores[i].weights}
        for name in names:
            column = [scores[i].components.get(name, 0.0) for i in group]
            mean = statistics.fmean(column)
            spread = max(statistics.pstdev(column), std_floor)
            for i, value in zip(group, column):
                weights = scores[i].weights
                values[i] += weights.get(name, 0.0) / sum(weights.values()) * (value - mean) / spread
    return values


class StepLog:
    """What the reward function saw in each generation batch, read back into the round's metrics."""

    def __init__(self):
        self.batches: list[dict[str, float]] = []

    def add(self, scores: list[Score], num_generations: int) -> None:
        components: dict[str, list[float]] = defaultdict(list)
        for s in scores:
            for name, value in s.components.items():
                components[name].append(value)
        groups = [scores[i:i + num_generations] for i in range(0, len(scores), num_generations)]
        flat = sum(1 for g in groups if len({s.total for s in g}) == 1)
        entry = {"reward_total": statistics.fmean(s.total for s in scores), "groups": len(groups),
                 "zero_variance_groups": flat, "zero_variance_share": flat / len(groups) if groups else 0.0}
        entry.update({f"reward/{name}": statistics.fmean(v) for name, v in components.items()})
        self.batches.append(entry)


def reward_function(aggregation: str, num_generations: int, std_floor: float, log: StepLog | None = None,
                    credit: FieldCredit | None = None) -> Callable:
    """The TRL reward function for a GRPO round of any task (the task comes with each sample);
    `credit`, which `fields` needs, receives each batch's scores."""
    if aggregation not in GRPO_ADVANTAGES:
        raise ValueError(f"aggregation must be one of {GRPO_ADVANTAGES}, not {aggregation!r}")
    if (aggregation == "fields") != (credit is not None):
        raise ValueError("the fields aggregation, and only it, takes a FieldCredit")

    def reward(prompts=None, completions=(), task=None, reference=None, context=None, **kwargs) -> list[float]:
        n = len(completions)
        task_names = list(task or [""] * n)
        texts = [completion_text(c) for c in completions]
        scores = [_score(t, text, _as_json(r), _as_json(x))
                  for t, text, r, x in zip(task_names, texts, reference or [None] * n, context or [None] * n)]
        if log is not None:
            log.add(scores, num_generations)
        if credit is not None:
            credit.scored(task_names, texts, scores)
        if aggregation in ("sum", "fields"):
            return [s.total for s in scores]
        if aggregation == "relevant":
            return [relevant_total(t, s) for t, s in zip(task_names, scores)]
        return gdpo_values(scores, num_generations, std_floor)

    reward.__name__ = f"tucano_{aggregation}"
    return reward
