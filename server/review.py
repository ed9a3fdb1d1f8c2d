"""The review queue: a task's recent answers, ranked by how much a label would help, for the
page where a person reads each input and answer and corrects or rates it (`/review`).

An answer ranks higher for each of:
- the model's doubt about it: a low served score, disagreement between samples (the same input
  was served different answers, or the samples of its own group scored apart: a spread of
  `GROUP_SPREAD_FULL` counts as much as a second answer), and the components the last gate found
  the candidate weakest on, where this answer scores low;
- a representative input;
- a canary's answer (the canary's verdict is what the label decides).

Doubt and a representative input are weighed by how many labels the task has (`doubt_weight`):
with none, the representative input alone; at `COLD_START_LABELS`, half each. A label teaches the
next round its input and the inputs like it; while a task has few labels, the lowest scores pick
the oddest inputs, which teach less than random ones, and disagreement at full weight puts first
the inputs that were merely sent twice (sampled answers always differ).

The queue is picked greedily, so that any first n of it stand for the task's recent inputs as a
whole (facility location, as in representative sampling for active learning): an input's coverage
gain is how much more of the recent inputs a label of it would show than the labels so far and
the picks above it do. The first pick is the most typical input; the next is typical of what the
first leaves uncovered. (Static typicality listed several answers of one campaign before any of
another.)

How much of input j a label of input i shows is the share of j's content words that i has too;
for SQL, the mean of that and the share of what j's question asks that i's asks too (tables,
aggregate, shape, kinds of value: `rewards.sql_question.question_intent`), since a label teaches
a query's shape whatever its wording; for push, the mean of that and the share of j's shape, its
campaign and which fields it fills whatever their values (`tasks.push`), since a label shows how
its campaign's copy says a name, a product, a discount or a deadline whichever they are. It is a
share of j, not an overlap of the two (Jaccard), because a label teaches what its input shows: an
input with the customer's name, the product and the discount shows all of one without the name,
not the other way round, and by overlap a name (a word no other input shares) made an input look
less like every other.

Each answer also loses `REDUNDANCY` times the share of it that an input labelled or listed above
it shows, so the same question served three times, or ten reviews of one complaint, do not take
the top of the queue: a team that labels the first answers of a queue of near-repeats teaches the
next round one thing many times.

What each of these choices gained against random labels, run by run, is in docs/results.md
(`tucano bench labels`, `tucano bench learn --label-choice queue`).

Answers already labelled (rated, corrected), answered from a correction, or that came from
another key than the reviewer's (feedback needs the key that made the request, or the admin key)
are left out. Pure functions over what the route read.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict

import numpy as np
from pydantic import BaseModel
from scipy.sparse import csr_matrix

from common.datasets import input_hash
from common.records import Label, Record
from common.rounds import RoundSummary
from rewards.text import STOP_WORDS, fold
from tasks import definition, typed_input

DISAGREEMENT = 0.3
GROUP_SPREAD_FULL = 0.5  # a group whose served scores span this much (or more) is as doubtful as an input served two answers
CANARY = 0.2
WEAK_COMPONENT = 0.2
REDUNDANCY = 1.0  # an identical input above an answer costs it a whole served score's worth of priority
COLD_START_LABELS = 100  # the task's labels at which a low score and a representative input weigh the same


def input_features(task: str, task_input: BaseModel) -> tuple[frozenset[str], ...]:
    """The content words of an input's values, and its task's other reading of it where it has one
    (its entry's `review_view`: what a SQL question asks, which other words can ask too; push's
    shape); the other tasks' inputs are a review or data rows, their words alone."""
    text = " ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for _, v in task_input if v is not None)
    words = frozenset(word for word in re.findall(r"\w+", fold(text)) if len(word) > 2 and word not in STOP_WORDS)
    view = definition(task).review_view
    return (words, view(task_input)) if view else (words,)


def _shown(sets: list[frozenset[str]]) -> tuple[np.ndarray, np.ndarray]:
    """For every pair (row i, column j), the share of set j's items that set i holds too, and
    whether set j has any items to show; in one sparse product: 500 insights inputs, pair by pair in
    Python, took a second of the page's request."""
    vocabulary: dict[str, int] = {}
    rows = [i for i, items in enumerate(sets) for _ in items]
    columns = [vocabulary.setdefault(item, len(vocabulary)) for items in sets for item in items]
    matrix = csr_matrix((np.ones(len(rows)), (rows, columns)), shape=(len(sets), max(1, len(vocabulary))))
    shared = (matrix @ matrix.T).toarray()
    sizes = np.broadcast_to(np.asarray([len(items) for items in sets], dtype=float)[None, :], shared.shape)
    return np.divide(shared, sizes, out=np.zeros_like(shared), where=sizes > 0), sizes > 0


def similarities(features: list[tuple[frozenset[str], ...]], inputs: list[str]) -> np.ndarray:
    """How much of each input a label of another would show (`features`: each one's
    `input_features`): row i, column j is the mean, over its words and what else it says
    (`VIEWS`), of the share of input j's that input i has too; so two wordings of one query are
    half alike by what they ask alone, two questions worded alike but asking different things are
    not one, and any named push input shows a named one's name. An input whose view is empty is
    judged by its words alone; 1 from an input to itself or an identical one (`inputs`: their
    hashes). Not symmetric: a campaign's input with every field shows all of one with fewer, not
    the other way round."""
    total, compared = np.zeros((len(features), len(features))), np.zeros((len(features), len(features)))
    for part in range(len(features[0]) if features else 0):
        shown, defined = _shown([f[part] for f in features])
        total += shown
        compared += defined
    similarity = np.divide(total, compared, out=np.zeros_like(total), where=compared > 0)
    hashes = np.asarray(inputs, dtype=object)
    similarity[hashes[:, None] == hashes[None, :]] = 1.0
    return similarity


def coverage_gains(similarity: np.ndarray, covered: np.ndarray) -> np.ndarray:
    """For each row's input, how much labelling it would add to how well the labelled inputs stand
    for all of them: the sum, over the inputs, of how much more of each it shows than any labelled
    so far (`covered`: the most of each that one labelled shows)."""
    return np.maximum(similarity - covered[None, :], 0.0).sum(axis=1)


def pick(candidates: list[tuple[int, Record, float, list[str]]], representative_weight: float, similarity: np.ndarray,
         covered: np.ndarray, limit: int) -> list[tuple[Record, float, list[str]]]:
    """The queue, greedily: each pick maximises its own priority (`candidates`: (its row of
    `similarity`, record, priority, why)), plus `representative_weight` times its coverage gain
    (as a share of the highest gain before the first pick), less `REDUNDANCY` times the most of it
    that an input labelled or picked before it shows (`covered` starts with the labelled ones').
    The priorities it returns (as picked) never rise down the list: picking only raises what is
    shown of the others, and so only lowers their gains."""
    rows = np.asarray([row for row, _, _, _ in candidates], dtype=int)
    own = np.asarray([priority for _, _, priority, _ in candidates], dtype=float)
    candidate_similarity = similarity[rows]  # indexing copies the rows: once, not at every pick
    covered = covered.copy()
    top: float | None = None  # the highest gain before the first pick, the unit of the shares
    left = np.ones(len(rows), dtype=bool)
    picked: list[tuple[Record, float, list[str]]] = []
    while left.any() and len(picked) < limit:
        gains = coverage_gains(candidate_similarity, covered)
        if top is None:
            top = float(gains.max())
        gains = gains / top if top > 0 else np.zeros(len(rows))
        totals = np.where(left, own + representative_weight * gains - REDUNDANCY * covered[rows], -np.inf)
        best = int(np.argmax(totals))  # the first of equals: the order `candidates` came in
        left[best] = False
        _, record, _, why = candidates[best]
        why = [*why, f"representative input {gains[best]:.2f}"]
        closest = covered[rows[best]]
        if closest > 0:
            why.append(f"like an input labelled or listed above it (which shows {closest:.0%} of it)")
        picked.append((record, round(float(totals[best]), 4), why))
        covered = np.maximum(covered, similarity[rows[best]])
    return picked


def weakest_components(rounds: list[RoundSummary], task: str) -> set[str]:
    """The components the newest gate of the task found the candidate behind on."""
    for summary in rounds:  # newest first
        entry = summary.tasks.get(task)
        if entry and entry.gate and entry.gate.decision.components:
            return {name for name, c in entry.gate.decision.components.items() if c.difference < 0 and not name.startswith("field:")}
    return set()


def doubt_weight(labels: int) -> float:
    """How much the model's doubt (a low served score, disagreement, weak components) counts
    against a representative input (which counts 1 minus it), for a task with `labels` answers
    or ratings so far: nothing at the first label, half at `COLD_START_LABELS`, towards all of it
    after (why: the module's docstring)."""
    return labels / (labels + COLD_START_LABELS)


def rank(task: str, records: list[Record], labels: list[Label], rounds: list[RoundSummary], key_id: str | None, admin: bool,
         limit: int) -> list[tuple[Record, float, list[str]]]:
    """(record, priority, why) for the answers a label would help most, highest first."""
    labelled = {label.id for label in labels if label.rating is not None or label.answer_source == "correction"}
    doubt_share = doubt_weight(sum(label.rating is not None or label.answer is not None for label in labels))
    inputs = [input_hash(task, record.input) for record in records]
    answers_of: dict[str, set[str]] = defaultdict(set)
    for record, hashed in zip(records, inputs):
        answers_of[hashed].add(record.raw)
    weak = weakest_components(rounds, task)
    similarity = similarities([input_features(task, typed_input(task, record.input)) for record in records], inputs)
    covered = np.zeros(len(records))
    candidates = []
    for row, (record, hashed) in enumerate(zip(records, inputs)):
        if record.id in labelled or record.answered_from:  # its input has a label: it stands for the inputs like it already
            covered = np.maximum(covered, similarity[row])
            continue
        if not admin and record.key_id != key_id:
            continue
        why = [f"served score {record.reward.total:.2f}"]
        doubt = 1.0 - record.reward.total
        if len(answers_of[hashed]) > 1:
            doubt += DISAGREEMENT
            why.append("the same input was served different answers")
        if record.group is not None and (spread := max(record.group.rewards) - min(record.group.rewards)) > 0:
            doubt += DISAGREEMENT * min(1.0, spread / GROUP_SPREAD_FULL)  # the model's own samples of it disagreed
            why.append(f"its {len(record.group.samples)} samples scored {min(record.group.rewards):.2f} to {max(record.group.rewards):.2f}")
        low = sorted(name for name in weak if record.reward.components.get(name, 1.0) < 0.5)
        if low:
            doubt += WEAK_COMPONENT
            why.append(f"low on what the last gate found weakest: {', '.join(low[:3])}")
        priority = doubt_share * doubt
        if record.arm == "canary":
            priority += CANARY
            why.append(f"served by the canary {record.adapter}")
        candidates.append((row, record, priority, why))
    return pick(candidates, 1.0 - doubt_share, similarity, covered, limit)
