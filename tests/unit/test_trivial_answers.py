"""Rewards no constant can beat: every answer that does no work (constants, empty answers, the
input echoed, the context poured into a fixed template) scores far below the references, with a
reference and without one, on rows built by the demo generators over the small commerce DB; and
below the demo model's own answers (tests/unit/data/demo_model_answers.jsonl, written by
`tucano bench trivial --save-answers`)."""
from __future__ import annotations

import json
import random
import sqlite3
import statistics
from pathlib import Path

import pytest

import tasks
from demo import datasets
from demo.reviews import make_review
from tasks import definition, typed_input
from tests.unit.conftest import ctx

MODEL_ANSWERS = Path(__file__).parent / "data" / "demo_model_answers.jsonl"
FAR_BELOW = 0.5  # a trivial answer's mean is at most this share of the references' mean
pytestmark = pytest.mark.xdist_group("trivial_answers")  # one worker builds the rows once for the whole module


@pytest.fixture(scope="module")
def rows(small_commerce_db) -> dict[str, list[dict]]:
    rng = random.Random(11)
    con = sqlite3.connect(f"file:{small_commerce_db}?mode=ro", uri=True)
    try:
        by_task = {
            "extraction": [{"input": {"review": text}, "reference": reference, "target": json.dumps(reference, ensure_ascii=False)}
                           for text, reference, _ in (make_review(rng) for _ in range(60))],
            "sql": datasets.sql_rows(con, rng, per_pattern=1),  # every pattern once
            "push": datasets.push_rows(rng, n=60),
            "insights": datasets.insights_rows(con, rng)[:40],
        }
    finally:
        con.close()
    return by_task


def _mean(task: str, completions: list[str], task_rows: list[dict], with_reference: bool) -> float:
    return statistics.fmean(tasks.score(task, c, r["reference"] if with_reference else None, ctx(task, **r["input"])).total
                            for c, r in zip(completions, task_rows))


CASES = [("extraction", True), ("extraction", False), ("sql", True), ("sql", False), ("push", True), ("push", False),
         ("insights", False)]


@pytest.mark.parametrize("task,with_reference", CASES)
def test_every_trivial_answer_scores_far_below_the_references(rows, task, with_reference):
    task_rows = rows[task]
    references = _mean(task, [r["target"] for r in task_rows], task_rows, with_reference)
    assert references >= 0.7, f"the references themselves score {references:.3f}"
    for name, make in definition(task).makers([r["reference"] for r in task_rows]).items():
        trivial = _mean(task, [make(typed_input(task, r["input"])) for r in task_rows], task_rows, with_reference)
        assert trivial <= FAR_BELOW * references, f"{task} ({'with' if with_reference else 'without'} reference): " \
                                                  f"{name!r} scores {trivial:.3f} against the references' {references:.3f}"


def _model_rows() -> dict[str, list[dict]]:
    by_task: dict[str, list[dict]] = {}
    for line in MODEL_ANSWERS.read_text().splitlines():
        row = json.loads(line)
        by_task.setdefault(row["task"], []).append(row)
    return by_task


@pytest.mark.parametrize("task,with_reference", CASES)
def test_every_trivial_answer_scores_below_the_demo_models_answers(task, with_reference):
    task_rows = _model_rows()[task]
    assert len(task_rows) >= 10
    model = _mean(task, [r["completion"] for r in task_rows], task_rows, with_reference)
    for name, make in definition(task).makers([r["reference"] for r in task_rows]).items():
        trivial = _mean(task, [make(typed_input(task, r["input"])) for r in task_rows], task_rows, with_reference)
        assert trivial < model, f"{task}: {name!r} scores {trivial:.3f}, the demo model {model:.3f}"
