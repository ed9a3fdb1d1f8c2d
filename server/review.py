"""The review queue: a task's recent answers, ranked by how much a label would help, for the
page where a person reads each input and answer and corrects or rates it (`/review`).

An answer ranks higher for each of:
- a low served score (the score's own doubt about it) and a typical input (its mean word overlap
  with the task's recent inputs, as a share of the most typical one's: information density),
  weighed by how many labels the task has (`score_weight`): with none, the typical input alone;
  at `COLD_START_LABELS`, half each. A label teaches the next round its input and the inputs like
  it, and while a task has few labels the model has yet to learn what most inputs look like: the
  lowest scores picked the oddest inputs, whose labels taught less than random ones in every
  side-by-side run; the most typical inputs, spread, taught more (`tucano bench labels`,
  docs/results.md);
- disagreement between samples: the same input was served different answers;
- the components the last gate found the candidate weakest on, where this answer scores low;
- a canary's answer (the canary's verdict is what the label decides).

Then the list is spread over the inputs (maximal marginal relevance): each answer, in turn, loses
`REDUNDANCY` times its input's word overlap (Jaccard) with the most similar input ranked above it,
so the same question served three times, or ten reviews of one complaint, do not take the top of
the queue from the rest. A label teaches the next round its input; a team that labels the first
answers of a queue of near-repeats teaches it one thing many times (`tucano bench learn
--label-choice queue` against random labels measured that: docs/results.md).

Answers already labelled (rated, corrected), answered from a correction, or that came from
another key than the reviewer's (feedback needs the key that made the request, or the admin key)
are left out. Pure functions over what the route read.
"""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
from scipy.sparse import csr_matrix

from common.datasets import input_hash
from common.records import Label, Record
from common.rounds import RoundSummary
from rewards.text import STOP_WORDS, fold

DISAGREEMENT = 0.3
CANARY = 0.2
WEAK_COMPONENT = 0.2
REDUNDANCY = 1.0  # an identical input above an answer costs it a whole served score's worth of priority
COLD_START_LABELS = 100  # the task's labels at which a low score and a typical input weigh the same


def input_words(task_input: dict) -> frozenset[str]:
    """The content words of an input's values (a review, a question, a campaign's fields, data rows)."""
    text = " ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in task_input.values())
    return frozenset(word for word in fold(text).split() if len(word) > 2 and word not in STOP_WORDS)


def overlap(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def spread(ranked: list[tuple[Record, float, list[str]]], limit: int, words_of: dict[str, frozenset[str]]
           ) -> list[tuple[Record, float, list[str]]]:
    """Greedy maximal marginal relevance over `ranked`: each pick maximises its priority less
    `REDUNDANCY` times its overlap with the closest input picked before it. The priorities it
    returns (as picked) never rise down the list: picking only raises the others' overlaps.
    `words_of`: each record's input words, by record id."""
    words = [words_of[record.id] for record, _, _ in ranked]
    inputs = [input_hash(record.task, record.input) for record, _, _ in ranked]
    closest = [0.0] * len(ranked)  # each candidate's overlap with the most similar input picked so far
    left = list(range(len(ranked)))
    picked: list[tuple[Record, float, list[str]]] = []
    while left and len(picked) < limit:
        best = max(left, key=lambda i: (ranked[i][1] - REDUNDANCY * closest[i], -i))
        left.remove(best)
        record, priority, why = ranked[best]
        if closest[best] > 0:
            why = [*why, f"like an input above it (word overlap {closest[best]:.2f})"]
        picked.append((record, round(priority - REDUNDANCY * closest[best], 4), why))
        for i in left:
            closest[i] = max(closest[i], 1.0 if inputs[i] == inputs[best] else overlap(words[i], words[best]))
    return picked


def typicality(words: list[frozenset[str]]) -> list[float]:
    """Each input's (its `input_words`) mean word overlap (Jaccard) with the others, divided by the
    highest such mean (0 when no two inputs share a word). One sparse product for all the pairs:
    500 insights inputs, pair by pair in Python, took a second of the page's request."""
    if len(words) < 2:
        return [0.0] * len(words)
    vocabulary: dict[str, int] = {}
    rows = [i for i, ws in enumerate(words) for _ in ws]
    columns = [vocabulary.setdefault(word, len(vocabulary)) for ws in words for word in ws]
    matrix = csr_matrix((np.ones(len(rows)), (rows, columns)), shape=(len(words), max(1, len(vocabulary))))
    shared = (matrix @ matrix.T).toarray()
    sizes = np.asarray([len(ws) for ws in words], dtype=float)
    union = sizes[:, None] + sizes[None, :] - shared
    jaccard = np.divide(shared, union, out=np.zeros_like(shared), where=union > 0)
    np.fill_diagonal(jaccard, 0.0)
    means = jaccard.sum(axis=1) / (len(words) - 1)
    top = float(means.max())
    return [float(mean) / top if top else 0.0 for mean in means]


def weakest_components(rounds: list[RoundSummary], task: str) -> set[str]:
    """The components the newest gate of the task found the candidate behind on."""
    for summary in rounds:  # newest first
        entry = summary.tasks.get(task)
        if entry and entry.gate and entry.gate.decision.components:
            return {name for name, c in entry.gate.decision.components.items() if c.difference < 0 and not name.startswith("field:")}
    return set()


def score_weight(labels: int) -> float:
    """How much a low served score counts against a typical input (which counts 1 minus it), for a
    task with `labels` answers or ratings so far: nothing at the first label, half at
    `COLD_START_LABELS`, towards all of it after. With few labels the model has not yet learned
    what most inputs look like, and an odd input's label teaches it little of that."""
    return labels / (labels + COLD_START_LABELS)


def rank(task: str, records: list[Record], labels: list[Label], rounds: list[RoundSummary], key_id: str | None, admin: bool,
         limit: int) -> list[tuple[Record, float, list[str]]]:
    """(record, priority, why) for the answers a label would help most, highest first."""
    labelled = {label.id for label in labels if label.rating is not None or label.answer_source == "correction"}
    low_score = score_weight(sum(label.rating is not None or label.answer is not None for label in labels))
    answers_of: dict[str, set[str]] = defaultdict(set)
    for record in records:
        answers_of[input_hash(task, record.input)].add(record.raw)
    weak = weakest_components(rounds, task)
    words_of = {record.id: input_words(record.input) for record in records}  # read once, by typicality and spread
    typical = dict(zip(words_of, typicality(list(words_of.values()))))
    ranked = []
    for record in records:
        if record.id in labelled or record.answered_from or (not admin and record.key_id != key_id):
            continue
        why = [f"served score {record.reward.total:.2f}", f"typical input {typical[record.id]:.2f}"]
        priority = low_score * (1.0 - record.reward.total) + (1.0 - low_score) * typical[record.id]
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
    return spread(ranked, limit, words_of)
