"""The review queue: a task's recent answers, ranked by how much a label would help, for the
page where a person reads each input and answer and corrects or rates it (`/review`).

An answer ranks higher for each of:
- a low served score (the score's own doubt about it);
- disagreement between samples: the same input was served different answers;
- the components the last gate found the candidate weakest on, where this answer scores low;
- a canary's answer (the canary's verdict is what the label decides).

Answers already labelled (rated, corrected), answered from a correction, or that came from
another key than the reviewer's (feedback needs the key that made the request, or the admin key)
are left out. Pure functions over what the route read.
"""
from __future__ import annotations

from collections import defaultdict

from common.datasets import input_hash
from common.records import Label, Record

DISAGREEMENT = 0.3
CANARY = 0.2
WEAK_COMPONENT = 0.2


def weakest_components(rounds: list[dict], task: str) -> set[str]:
    """The components the newest gate of the task found the candidate behind on."""
    for summary in rounds:  # newest first
        components = summary.get("tasks", {}).get(task, {}).get("decision", {}).get("components")
        if components:
            return {name for name, c in components.items() if c.get("difference", 0.0) < 0 and not name.startswith("field:")}
    return set()


def rank(task: str, records: list[Record], labels: list[Label], rounds: list[dict], key_id: str | None, admin: bool,
         limit: int) -> list[tuple[Record, float, list[str]]]:
    """(record, priority, why) for the answers a label would help most, highest first."""
    labelled = {label.id for label in labels if label.rating is not None or label.answer_source == "correction"}
    answers_of: dict[str, set[str]] = defaultdict(set)
    for record in records:
        answers_of[input_hash(task, record.input)].add(record.raw)
    weak = weakest_components(rounds, task)
    ranked = []
    for record in records:
        if record.id in labelled or record.answered_from or (not admin and record.key_id != key_id):
            continue
        why = [f"served score {record.reward.total:.2f}"]
        priority = 1.0 - record.reward.total
        if len(answers_of[input_hash(task, record.input)]) > 1:
            priority += DISAGREEMENT
            why.append("the same input was served different answers")
        low = sorted(name for name in weak if record.reward.components.get(name, 1.0) < 0.5)
        if low:
            priority += WEAK_COMPONENT
            why.append(f"low on what the last gate found weakest: {', '.join(low[:3])}")
        if record.arm == "canary":
            priority += CANARY
            why.append(f"served by the canary {record.adapter}")
        ranked.append((record, round(priority, 4), why))
    ranked.sort(key=lambda item: -item[1])
    return ranked[:limit]
