"""The served score's calibration against labels: the measures themselves, their breakdown in
`/v1/stats`, and the target on the demo model's own answers (rank correlation of at least 0.7 with
the reference score on each structured task)."""
from __future__ import annotations

import random

import pytest

from rewards.calibration import MIN_PAIRS, Pair, calibrate, pairs_of, verdict
from server.stats import calibration
from tasks import score
from tests.unit.conftest import ctx
from tests.unit.test_trivial_answers import _model_rows


def test_a_served_score_that_ranks_as_the_labels_do_is_calibrated():
    pairs = [Pair(i / 20, i / 20 + 0.01, "liked" if i >= 10 else "corrected") for i in range(20)]
    result = calibrate(pairs)
    assert result.rank_correlation == 1.0 and result.separation == 1.0 and result.weak is False
    assert (result.n, result.liked, result.corrected) == (20, 10, 10)


def test_a_served_score_that_says_nothing_of_the_labels_is_weak():
    rng = random.Random(3)
    pairs = [Pair(rng.random(), rng.random(), rng.choice(("liked", "corrected"))) for _ in range(200)]
    result = calibrate(pairs)
    assert abs(result.rank_correlation) < 0.3 and 0.3 < result.separation < 0.7 and result.weak is True
    constant = calibrate([Pair(1.0, i / 20, None) for i in range(20)])  # every answer served at 1.0
    assert constant.rank_correlation == 0.0 and constant.weak is True


def test_too_few_labels_measure_nothing():
    result = calibrate([Pair(0.5, 0.5, "liked")] * (MIN_PAIRS - 1))
    assert result.rank_correlation is None and result.separation is None and result.weak is None


def test_verdicts_and_pairs_of_labels():
    assert verdict("correction", None) == "corrected" and verdict(None, -1) == "corrected"
    assert verdict("reference", 1) == "liked" and verdict("reference", None) is None

    class Label:
        def __init__(self, answer, source, rating):
            self.served, self.input, self.answer, self.answer_source, self.rating = "x", {}, answer, source, rating

    seen = []
    pairs = pairs_of([Label({"a": 1}, "correction", None), Label(None, None, 1), Label(None, None, None)],
                     lambda completion, reference, task_input: seen.append(reference) or (0.3 if reference is None else 0.9))
    assert pairs == [Pair(0.3, 0.9, "corrected"), Pair(0.3, None, "liked")] and seen == [None, {"a": 1}, None]


def test_stats_break_calibration_down_per_version():
    pairs = [("sql-v1", Pair(i / 10, i / 10, None)) for i in range(10)] + [("base", Pair(0.5, 0.1 * i, None)) for i in range(10)]
    result = calibration(pairs)
    assert result.n == 20 and set(result.versions) == {"sql-v1", "base"}
    assert result.versions["sql-v1"].rank_correlation == 1.0 and result.versions["base"].weak is True


@pytest.mark.parametrize("task", ["extraction", "sql", "push"])
def test_the_served_score_ranks_the_demo_models_answers_as_their_references_do(task):
    rows = _model_rows()[task]
    pairs = [Pair(score(task, r["completion"], None, ctx(task, **r["input"])).total,
                  score(task, r["completion"], r["reference"], ctx(task, **r["input"])).total, None) for r in rows]
    result = calibrate(pairs)
    assert result.rank_correlation >= 0.7, f"{task}: {result}"


def test_bench_calibration_tables_each_source_with_an_interval():
    from bench import calibration as bench

    pairs = [Pair(i / 30, (i + (3 if i % 2 else 0)) / 33, "liked" if i > 15 else "corrected") for i in range(30)]
    s = bench.summary(pairs)
    low, high = s["rank_correlation_ci95"]
    assert low <= s["rank_correlation"] <= high and s["n"] == 30 and s["separation"] > 0.9
    results = {"answers": {"sql": s}, "team": {"sql": {**s, "versions": {"sql-v1": s}}}}
    lines = bench.table(results).splitlines()
    assert len(lines) == 5 and lines[2].startswith("| answers | sql | all | 30 |") and lines[4].startswith("| team | sql | sql-v1 |")
    assert bench.summary([])["rank_correlation"] is None
