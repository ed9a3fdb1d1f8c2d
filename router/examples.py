"""The team's corrections acting at once, before any round: each correction, reference and
liked answer of a task is an example; a request retrieves the `examples_k` most similar
examples of its task (BM25 over the inputs' text, `bm25s`) and its prompt shows them as
demonstrations; an exact repeat of a corrected input is answered with its correction.

What a round has absorbed is retired (`Label.retired_by`: the promoted version trained on it and
now answers it right), so prompts stay short as the adapters learn. The team's eval-split labels
are never demonstrations: the gate measures on them, and a demonstration of the very row it
measures would measure recall. An exact repeat of one is still answered with its correction: the
user who corrected it sees the fix.

While the engines serve the demo model's pretrained weights (the first `tucano serve`, until its
fine-tuning is done; the store says so), a task's prompts also show the most similar rows of the
bootstrap split, the very rows that fine-tuning trains on: an instruct model that has never seen
the store's schema, fields or campaigns copies their shape from the demonstrations. The team's
own examples come first for an input both have.

`ExampleBook` is one task's index, built from its labels (and those rows); `Examples` keeps every
task's book, rebuilt when the store's label counter for the task moves or the pretrained weights
stop serving (checked at most every `examples_poll_s`, so a correction acts from the next
request a second later at most).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import NamedTuple

import bm25s
import numpy as np
from pydantic import BaseModel
from redis.exceptions import RedisError

from common.datasets import input_hash, load_split
from common.records import Label
from rewards.text import STOP_WORDS, fold
from router.prompts import answer_text
from tasks import typed_input


class Example(NamedTuple):
    id: str  # the label's record id
    input: BaseModel  # the task's input model
    answer: str  # as the model writes it
    source: str  # correction, reference, liked, or bootstrap (a row of the bootstrap split, its id the row's)


def examples_of(task: str, labels: list[Label]) -> tuple[list[Example], dict[str, Example]]:
    """(what may be retrieved, the corrections of every input by its hash), the newest label of an
    input winning: train-split labels with an answer or a like, not retired."""
    retrievable: dict[str, Example] = {}
    corrected: dict[str, Example] = {}
    for label in sorted(labels, key=lambda label: label.updated or label.time):
        if label.answer is not None:
            example = Example(label.id, typed_input(task, label.input), answer_text(task, label.answer), label.answer_source or "reference")
            if label.answer_source == "correction":
                corrected[label.input_hash] = example
        elif label.rating is not None and label.rating > 0:
            example = Example(label.id, typed_input(task, label.input), label.served, "liked")
        else:
            retrievable.pop(label.input_hash, None)  # a dislike: what was served is no example
            continue
        if label.split == "train" and label.retired_by is None:
            retrievable[label.input_hash] = example
        else:
            retrievable.pop(label.input_hash, None)
    return list(retrievable.values()), corrected


def bootstrap_examples(task: str, rows: list[dict]) -> list[Example]:
    """The bootstrap split's rows as demonstrations: each row's target, the completion the demo
    model's fine-tuning teaches for its input."""
    return [Example(row["id"], typed_input(task, row["input"]), row["target"], "bootstrap") for row in rows]


def input_text(task_input: BaseModel) -> str:
    """What an input says, for matching: its text and number fields (a review, a question, a
    campaign and product), without the prompt's fixed wording or a table's rows."""
    return " ".join(str(v) for _, v in task_input if isinstance(v, (str, int, float)) and not isinstance(v, bool))


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize([fold(t) for t in texts], stopwords=list(STOP_WORDS), show_progress=False, return_ids=False)


class ExampleBook:
    """One task's examples, indexed."""

    def __init__(self, task: str, labels: list[Label], demonstrations: list[Example] = ()):
        self.task = task
        examples, self.corrected = examples_of(task, labels)
        labelled = {input_hash(task, e.input) for e in examples}
        examples += [d for d in demonstrations if input_hash(task, d.input) not in labelled]
        tokens = _tokens([input_text(e.input) for e in examples])
        # an input with no word to match (stop words, punctuation) can never be retrieved, and a
        # corpus of only such inputs has no vocabulary, which bm25s cannot index
        self.examples = [e for e, words in zip(examples, tokens) if words]
        self.index = None
        if self.examples:
            self.index = bm25s.BM25()
            self.index.index([words for words in tokens if words], show_progress=False)

    def correction_for(self, task_input: BaseModel) -> Example | None:
        return self.corrected.get(input_hash(self.task, task_input))

    def similar(self, task_input: BaseModel, k: int) -> list[Example]:
        """The k examples most similar to the input (any shared word), never the input itself."""
        if self.index is None:
            return []
        query = _tokens([input_text(task_input)])
        if not query[0]:
            return []
        k_asked = min(len(self.examples), k + 1)
        found, scores = self.index.retrieve(query, k=k_asked, show_progress=False)
        own = input_hash(self.task, task_input)
        picked = [self.examples[i] for i, s in zip(np.asarray(found[0]), np.asarray(scores[0])) if s > 0]
        return [e for e in picked if input_hash(self.task, e.input) != own][:k]

    def shown(self, task_input: BaseModel, k: int) -> tuple[tuple[BaseModel, str], ...]:
        """The demonstrations a prompt for the input shows, as `build_messages` takes them."""
        return tuple((e.input, e.answer) for e in self.similar(task_input, k))


class Examples:
    """Every task's book, kept current with the store's labels."""

    def __init__(self, store, tasks: list[str], k: int, exact_repeats: bool, poll_s: float, datasets_dir: Path | None = None):
        self.store, self.tasks, self.k, self.exact_repeats, self.poll_s = store, set(tasks), k, exact_repeats, poll_s
        self.datasets_dir = datasets_dir  # where the bootstrap split is, for the pretrained weights' demonstrations
        self.bootstrap_rows: dict[str, list[Example]] = {}  # read once: the split does not change while serving
        self.books: dict[str, ExampleBook] = {}
        self.versions: dict[str, tuple[int, bool]] = {}
        self.checked: dict[str, float] = {}
        self.lock = threading.Lock()

    def book(self, task: str) -> ExampleBook | None:
        if task not in self.tasks and not self.exact_repeats:
            return None
        now = time.monotonic()
        if now - self.checked.get(task, -1e9) >= self.poll_s:
            with self.lock:
                self.checked[task] = now
                try:
                    version = self.store.examples_state(task)
                    if version != self.versions.get(task):
                        self.books[task] = ExampleBook(task, self.store.labels(task), self.demonstrations(task, version[1]))
                        self.versions[task] = version
                except RedisError:
                    pass  # the book as last read: a store that is down fails the record's write with a 503, not this
        return self.books.get(task)

    def demonstrations(self, task: str, pretrained: bool) -> list[Example]:
        """The bootstrap split's rows of the task while the pretrained weights serve (none where the
        data dir has no such split: engines and datasets of a team's own)."""
        if not pretrained or self.datasets_dir is None or task not in self.tasks:
            return []
        if task not in self.bootstrap_rows:
            try:
                self.bootstrap_rows[task] = bootstrap_examples(task, load_split(self.datasets_dir, task, "bootstrap"))
            except FileNotFoundError:
                self.bootstrap_rows[task] = []
        return self.bootstrap_rows[task]

    def for_request(self, task: str, task_input: BaseModel) -> tuple[Example | None, list[Example]]:
        """(the correction that answers an exact repeat, or None; the demonstrations of the prompt)."""
        book = self.book(task)
        if book is None:
            return None, []
        repeat = book.correction_for(task_input) if self.exact_repeats else None
        if repeat is not None:
            return repeat, []
        return None, book.similar(task_input, self.k) if task in self.tasks else []
