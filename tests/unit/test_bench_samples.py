"""`tucano bench samples`' verdicts from answers it would have got: each arm's answer scored with
the row's reference (never the served score), the gain over one sample paired by row, how often a
group's samples disagreed, and the p95 latency ratio with its interval over resampled blocks."""
from __future__ import annotations

import random

from bench.samples import LATENCY_TARGET, measure, table
from tests.unit.conftest import _db

GOOD = "SELECT COUNT(*) FROM olist_orders_dataset"
BAD = "SELECT 1"


def rows(count: int) -> list[dict]:
    return [{"input": {"question": f"Quantos pedidos existem? ({i})"}, "reference": {"sql": GOOD}} for i in range(count)]


def arm(rng, raws: list[str], seconds: float, totals: list[float] | None, cut: int = 0) -> list[list[dict]]:
    answers = [{"seconds": seconds * rng.uniform(0.9, 1.1), "raw": raw, "completion_tokens": 12,
                "sample": {"chosen": 0, "of": len(totals), "totals": totals, "cut": cut} if totals else None} for raw in raws]
    return [answers[i:i + 5] for i in range(0, len(answers), 5)]


def test_a_group_that_picks_the_right_query_more_often_gains_and_its_cost_is_judged():
    from common.settings import load_settings

    settings = load_settings(data_dir=_db["path"].parent)  # its commerce.db is the small one
    rng, held = random.Random(3), rows(20)
    one = arm(rng, [GOOD if i % 4 == 0 else BAD for i in range(20)], 1.0, None)
    four = arm(rng, [GOOD if i % 2 == 0 else BAD for i in range(20)], 1.2, [0.5, 0.1, 0.1, 0.1])
    slow = arm(rng, [BAD] * 20, 3.0, [0.2, 0.2, 0.2, 0.2])
    first_two = arm(rng, [GOOD if i % 2 == 0 else BAD for i in range(20)], 1.05, [0.5, 0.1], cut=2)
    result = measure(settings, "sql", held, {"1": one, "4": four, "8": slow, "4/2": first_two})
    assert result["1"]["reward"]["n"] == 20 and "gain" not in result["1"]
    assert result["4"]["gain"]["mean"] > 0 and result["4"]["reward"]["mean"] > result["1"]["reward"]["mean"]
    assert result["4"]["groups_disagreeing"] == 1.0 and result["8"]["groups_disagreeing"] == 0.0
    assert result["4"]["p95_ratio"]["verdict"] == "met" and result["4"]["p95_ratio"]["ci95"][1] <= LATENCY_TARGET
    assert result["8"]["p95_ratio"]["verdict"] == "missed" and result["8"]["reward_verdict"] == "lower"
    assert result["4/2"]["cut_mean"] == 2.0 and result["4"]["cut_mean"] == 0.0 and result["4/2"]["p95_ratio"]["verdict"] == "met"
    text = table({"tasks": {"sql": {**result, "seconds": 1.0}}})
    assert len(text.splitlines()) == 2 + 4 and "(met)" in text and "(missed)" in text and "| sql | 4/2 |" in text


def test_the_arms_answer_from_the_first_finished_samples_as_asked_and_an_arm_that_is_no_choice_is_refused():
    import pytest

    from bench.samples import arm_options, arms_of, run
    assert arms_of([8, 4], [0, 2]) == ["1", "4", "4/2", "8", "8/2"] and arms_of([4]) == ["1", "4"]
    assert arm_options("1") == {"samples": 1}
    assert arm_options("4") == {"samples": 4, "first_finished": 0}  # waits for all, whatever the task's default
    assert arm_options("4/2") == {"samples": 4, "first_finished": 2}
    for first_finished in ([1], [4], [0, 5]):
        with pytest.raises(ValueError, match="K must be 0"):
            run(None, ("sql",), [4], 10, None, first_finished=first_finished)


def test_a_first_finished_arm_that_is_no_choice_is_refused_before_anything_runs(tmp_path):
    from typer.testing import CliRunner

    from cli import main as cli

    for args in (["--first-finished", "1"], ["--samples", "4", "--first-finished", "4"], ["--first-finished", "-1"]):
        result = CliRunner().invoke(cli.app, ["bench", "samples", "--task", "sql", *args], env={"TUCANO_DATA_DIR": str(tmp_path)})
        assert result.exit_code == 2, result.output
        assert "--first-finished" in result.output
    assert list(tmp_path.iterdir()) == []
