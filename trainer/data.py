"""A round's data, built from the records the trainers' consumer group has not acknowledged.

Per task: the GRPO prompt set (distinct inputs, re-rendered with the base model's own chat
template, since the policy regenerates completions for them) and DPO pairs (for one input,
the best- against the worst-scored logged answer when they differ by a margin; a user's
correction as the chosen answer against what was served). Records are re-scored with the
current reward functions, so records logged under an older reward version still rank right.
Records that cannot be used are skipped and counted by reason, never fatal.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from common.datasets import input_key
from rewards import score
from router.prompts import build_messages

PAIR_MARGIN = 0.1  # smaller reward differences are mostly sampling noise


@dataclass
class TaskData:
    task: str
    entry_ids: list[str] = field(default_factory=list)
    prompts: list[dict] = field(default_factory=list)  # {prompt, task, reference, context}
    pairs: list[dict] = field(default_factory=list)  # {prompt, chosen, rejected}
    skipped: Counter = field(default_factory=Counter)

    @property
    def records(self) -> int:
        return len(self.entry_ids)


def _answer_text(task: str, correction) -> str:
    return correction if isinstance(correction, str) else json.dumps(correction, ensure_ascii=False)


def collect(stored, render, reward_context, tasks: tuple[str, ...], held_out: frozenset[str] = frozenset()
            ) -> tuple[dict[str, TaskData], Counter, list[str]]:
    """Split stored records by task. Returns the per-task data, the skipped counts of records no
    task could use, and the entry ids of those (acknowledged with the round: they never become usable).

    `held_out` holds the input keys of the eval split: traffic that asks an eval question is
    never trained on, so the promotion gate keeps measuring unseen inputs."""
    data = {task: TaskData(task) for task in tasks}
    unusable, unusable_ids = Counter(), []
    by_input: dict[str, dict[str, list]] = {task: defaultdict(list) for task in tasks}
    for entry in stored:
        record = entry.record
        problem = "unparseable record" if record is None else None
        if problem is None and record.task not in data:
            problem = f"task {record.task} is not trained by rounds"
        if problem:
            unusable[problem] += 1
            unusable_ids.append(entry.entry_id)
            continue
        task_data = data[record.task]
        task_data.entry_ids.append(entry.entry_id)
        key = input_key(record.input)
        if key in held_out:
            task_data.skipped["held-out eval input"] += 1
            continue
        try:
            prompt = render(build_messages(record.task, record.input))
        except (KeyError, TypeError, ValueError):
            task_data.skipped["input the prompt cannot be built from"] += 1
            continue
        context = reward_context(record.input)
        reference = record.reference
        total = score(record.task, record.raw, reference, context).total
        by_input[record.task][key].append((total, record.raw, prompt, reference, context))
        correction = record.feedback.correction if record.feedback else None
        if correction is not None:
            chosen = _answer_text(record.task, correction)
            if chosen.strip() and chosen != record.raw:
                task_data.pairs.append({"prompt": prompt, "chosen": chosen, "rejected": record.raw})
    for task, groups in by_input.items():
        for answers in groups.values():
            answers.sort(key=lambda a: a[0])
            worst, best = answers[0], answers[-1]
            if best[0] - worst[0] >= PAIR_MARGIN and best[1] != worst[1]:
                data[task].pairs.append({"prompt": best[2], "chosen": best[1], "rejected": worst[1]})
            reference = next((a[3] for a in reversed(answers) if a[3] is not None), None)
            data[task].prompts.append({"prompt": best[2], "task": task,
                                       "reference": json.dumps(reference, ensure_ascii=False) if reference is not None else "",
                                       "context": json.dumps(best[4], ensure_ascii=False)})
    return data, unusable, unusable_ids
