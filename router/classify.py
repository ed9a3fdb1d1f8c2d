"""`tucano-auto`: which task a free-text request is, by rules (cheap, explainable, no model
call). Each task collects points from its entry's cues (`TaskDefinition.cues`) in the folded
text; the highest wins, the task marked `auto_default` on a tie it is part of or when nothing
matches (insights: a general analysis question is the safe default)."""
from __future__ import annotations

import re
from functools import lru_cache

from rewards.text import fold
from tasks import TASKS, definition


@lru_cache(maxsize=64)
def _compiled(task: str) -> tuple[tuple[re.Pattern, float], ...]:
    return tuple((re.compile(pattern, re.M), weight) for pattern, weight in definition(task).cues)


def classify(text: str) -> str:
    folded = fold(text)
    points = {task: sum(w for pattern, w in _compiled(task) if pattern.search(folded)) for task in TASKS}
    fallback = next((task for task in TASKS if definition(task).auto_default), TASKS[0])
    best = max(points.values())
    if best == 0:
        return fallback
    winners = [task for task, p in points.items() if p == best]
    return fallback if len(winners) > 1 and fallback in winners else winners[0]
