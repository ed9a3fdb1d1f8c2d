"""The reward components as separate TRL reward functions, for GDPO
(`GRPOConfig(multi_objective_aggregation="normalize_then_sum", reward_weights=...)`): each
component is normalised across a group before the weighted sum, so a component that rarely
varies is not drowned by one that always does.

A function answers None for samples of other tasks, and for samples where its component does
not apply (content without a reference), as TRL allows. The dataset carries `task`,
`reference` and `context` columns (dicts or JSON strings); a completion is scored once and its
components served to every function from a small cache.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache

from common.tasks import TASKS
from rewards import extraction, insights, push, sql
from rewards.scoring import score

COMPONENTS: dict[str, dict[str, float]] = {
    "extraction": {**extraction.WEIGHTS_WITH_REFERENCE, **extraction.WEIGHTS_WITHOUT_REFERENCE},
    "sql": {k: v for k, v in {**sql.WEIGHTS_WITHOUT_REFERENCE, **sql.WEIGHTS_WITH_REFERENCE}.items() if k != "safety"},
    "push": {**push.WEIGHTS, "reference_overlap": 0.1},
    "insights": dict(insights.WEIGHTS),
}


def _as_json(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


@lru_cache(maxsize=8192)
def _components(task: str, completion: str, reference_json: str, context_json: str) -> dict[str, float]:
    reference = json.loads(reference_json) if reference_json else None
    context = json.loads(context_json) if context_json else {}
    return score(task, completion, reference, context).components


def completion_text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return completion if isinstance(completion, str) else ""


def _make(own_task: str, component: str) -> Callable:
    def reward(prompts=None, completions=(), task=None, reference=None, context=None, **kwargs):
        tasks = task or [own_task] * len(completions)
        references = reference or [None] * len(completions)
        contexts = context or [None] * len(completions)
        out: list[float | None] = []
        for sample_task, completion, ref, ctx in zip(tasks, completions, references, contexts):
            if sample_task != own_task:
                out.append(None)
                continue
            components = _components(own_task, completion_text(completion), _as_json(ref) if ref else "", _as_json(ctx) if ctx else "")
            out.append(components.get(component))
        return out

    reward.__name__ = f"{own_task}_{component}"
    return reward


def reward_functions(tasks: tuple[str, ...] = TASKS) -> tuple[list[Callable], list[float]]:
    """TRL reward functions for the tasks' components, with their weights (for `reward_weights`)."""
    funcs, weights = [], []
    for task in tasks:
        for component, weight in COMPONENTS[task].items():
            funcs.append(_make(task, component))
            weights.append(weight)
    return funcs, weights
