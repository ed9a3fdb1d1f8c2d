"""What a score is: `Score`, and `total_of`, which makes a task's components one total.

The entry point, `tasks.score(task, completion, reference=None, context=None)`, calls the task's
own reward (its registry entry's `scorer`). Each task module returns its components in [0, 1], their weights and readable reasons; the
total is their weighted mean (a refused SQL statement has every component at 0). Components
of form are paid by the task modules in proportion to the content (their docstrings say how),
so the weighted mean never pays a well-formed answer that does no work. The
record of a scored answer stores `REWARD_VERSION`, so scores from different reward code are
never mixed in training or promotion decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import mul

REWARD_VERSION = "13"


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


def total_of(components: dict[str, float], weights: dict[str, float]) -> tuple[dict[str, float], float]:
    """The components clamped to [0, 1] (NaN as 0) and their weighted mean, rounded; only the total
    is rounded (round() costs as much as a component's check)."""
    components = {k: v if 0.0 <= v <= 1.0 else (1.0 if v > 1.0 else 0.0) for k, v in components.items()}
    total = sum(map(mul, weights.values(), map(components.__getitem__, weights))) / sum(weights.values())
    return components, round(min(1.0, max(0.0, total)), 4)


def first_best(totals: list[float]) -> int:
    """The sample best of n serves: the highest total, the first of equals."""
    return max(range(len(totals)), key=lambda i: (totals[i], -i))
