"""The scoring entry point: `score(task, completion, reference=None, context=None)`.

Each task module returns its components in [0, 1], their weights and readable reasons; the
total is their weighted mean (a refused SQL statement has every component at 0). Components
of form are paid by the task modules in proportion to the content (their docstrings say how),
so the weighted mean never pays a well-formed answer that does no work. The
record of a scored answer stores `REWARD_VERSION`, so scores from different reward code are
never mixed in training or promotion decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import mul
from pathlib import Path

from common.tasks import TASKS, TRAITS
from rewards import extraction, insights, push, sql

REWARD_VERSION = "7"


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 4x, on every score
class Score:
    total: float
    components: dict[str, float]
    reference_used: bool
    valid: bool
    details: dict[str, str] = field(default_factory=dict)
    output: object = None  # the parsed answer: a dict, the SQL text, or the insights answer
    weights: dict[str, float] = field(default_factory=dict)  # how the components make the total
    fields: dict[str, float] = field(default_factory=dict)  # extraction with a reference: each field's credit

    def as_dict(self) -> dict:
        return {"total": self.total, "components": self.components, "reference_used": self.reference_used,
                "valid": self.valid, "details": self.details, "version": REWARD_VERSION}


def normalise_reference(task: str, reference):
    """contract §3: sql accepts `{"sql": ...}` or a plain string; insights takes none."""
    field = TRAITS[task].answer_field
    if field and isinstance(reference, str):
        return {field: reference} if reference.strip() else None
    if not TRAITS[task].scored_with_reference:
        return None
    if field and isinstance(reference, dict) and not isinstance(reference.get(field), str):
        return None
    return reference if isinstance(reference, dict) and reference else None


def _valid(task: str, components: dict[str, float], details: dict[str, str], output) -> bool:
    """Whether the answer has its task's shape (what a record's `valid` says), whatever its content."""
    if task == "extraction":
        return extraction.valid(output)
    if task == "push":
        return push.valid(output)
    if task == "sql":
        return sql.valid(components, details)
    return bool(output)


def score(task: str, completion: str, reference=None, context: dict | None = None) -> Score:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    completion = completion if isinstance(completion, str) else ""
    context = context or {}
    reference = normalise_reference(task, reference)
    fields: dict[str, float] = {}
    if task == "extraction":
        components, weights, details, output = extraction.score(completion, reference, context, fields)
    elif task == "sql":
        if not context.get("db_path"):
            raise ValueError("scoring SQL needs the commerce DB: context['db_path']")
        components, weights, details, output = sql.score(completion, reference, context, Path(context["db_path"]))
    elif task == "push":
        components, weights, details, output = push.score(completion, reference, context)
    else:
        components, weights, details, output = insights.score(completion, reference, context)
    # clamped, NaN as 0; only the total is rounded (round() costs as much as a component's check)
    components = {k: v if 0.0 <= v <= 1.0 else (1.0 if v > 1.0 else 0.0) for k, v in components.items()}
    total = sum(map(mul, weights.values(), map(components.__getitem__, weights))) / sum(weights.values())
    return Score(round(min(1.0, max(0.0, total)), 4), components, reference is not None,
                 _valid(task, components, details, output), details, output, weights, fields)
