"""`tucano bench labels`: which answers each arm labels, and how the report reads the arms."""
import pytest

from tasks import training_settings
from trainer.data import SftExample


def test_the_queue_arm_takes_the_queues_first_answers_and_each_random_draw_its_own_sample():
    from bench.labels import choose

    queue_order = [7, 3, 9, 0, 1, 2, 4, 5, 6, 8]
    chosen = choose(queue_order, answers=10, labels=4, draws=3, seed=11)
    assert chosen["queue"] == [7, 3, 9, 0]
    draws = [chosen[f"random-{d}"] for d in (1, 2, 3)]
    for picked in draws:
        assert len(picked) == len(set(picked)) == 4  # without replacement
        assert set(picked) <= set(range(10))
    assert len({tuple(p) for p in draws}) == 3  # each draw its own sample
    assert choose(queue_order, 10, 4, 3, 11) == chosen  # the same seed, the same labels: a run can be repeated
    assert choose(queue_order, 10, 4, 3, 12) != chosen


def test_answers_follow_the_queues_ranks_and_those_it_does_not_list_come_last_in_their_order():
    from bench.learn import in_queue_order

    answers = [{"id": f"r{i}"} for i in range(5)]
    ranks = {"r3": 0, "r1": 1}  # the queue lists two of the five
    assert in_queue_order(ranks, answers, [4, 0, 1, 2, 3]) == [3, 1, 4, 0, 2]


def _arm(gain: float, labels: int = 30) -> dict:
    return {"labels": labels, "distinct_inputs": labels, "served_score_of_the_chosen": 0.3, "mean": 0.4, "ci95": [0.3, 0.5],
            "gain": {"mean": gain, "ci95": [gain - 0.05, gain + 0.05], "n": 40},
            "training": [{"method": "sft", "steps": 8, "epochs": 2.0}]}


def _results(queue: float, *randoms: float) -> dict:
    arms = {"queue": _arm(queue), **{f"random-{i}": _arm(g) for i, g in enumerate(randoms, start=1)}}
    minus = {f"random-{i}": {"mean": queue - g, "ci95": [queue - g - 0.1, queue - g + 0.1], "n": 40} for i, g in enumerate(randoms, start=1)}
    return {"settings": {"requests": 60, "labels": 30, "draws": len(randoms), "seed": 0, "measure_rows": {"sql": 40},
                         "train_time_budget_s": {"sql": 45.0}},
            "tasks": {"sql": {"base": {"mean": 0.2, "ci95": [0.1, 0.3], "n": 40}, "arms": arms, "queue_minus": minus}}}


def test_the_ratio_is_the_queues_gain_per_label_over_the_random_draws_mean():
    from bench.labels import ratio

    assert ratio(_results(0.30, 0.10, 0.30), "sql") == pytest.approx(1.5)
    assert ratio(_results(0.30, 0.0, -0.02), "sql") is None  # random gained nothing: no ratio to give


def test_the_table_gives_each_arm_its_gain_its_cost_per_label_and_the_queue_against_it():
    from bench.labels import table

    lines = table(_results(0.30, 0.10, -0.01)).splitlines()
    queue = next(line for line in lines if "| queue |" in line)
    first = next(line for line in lines if "| random-1 |" in line)
    second = next(line for line in lines if "| random-2 |" in line)
    assert "+0.300 [+0.250, +0.350]" in queue and "| 1.0 |" in queue  # 30 labels for +0.30: one label per +0.01
    assert "| 3.0 |" in first and "+0.200 [+0.100, +0.300]" in first  # the queue minus this draw, paired
    assert "no gain" in second
    assert any("6.67 times the random draws' mean" in line for line in lines)  # 0.30 / mean(0.10, -0.01) = 0.30 / 0.045


def test_more_labels_than_answers_is_refused_before_anything_runs(tmp_path):
    from typer.testing import CliRunner

    from cli import main as cli

    result = CliRunner().invoke(cli.app, ["bench", "labels", "--requests", "20", "--labels", "30"], env={"TUCANO_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert "--labels (30) cannot be more than --requests (20)" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("epochs", ["0", "-1", "many", "21"])
def test_epochs_out_of_range_are_refused_before_anything_runs(tmp_path, epochs):
    from typer.testing import CliRunner

    from cli import main as cli

    result = CliRunner().invoke(cli.app, ["bench", "labels", "--epochs", epochs], env={"TUCANO_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert "--epochs" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.xdist_group("torch")
def test_with_epochs_every_arm_trains_those_epochs_with_no_clock_and_the_tasks_own_settings():
    from bench.labels import UNBOUNDED_S, arm_training
    from common.settings import Settings
    from trainer.data import TaskData, split_validation
    from trainer.sft import planned_epochs

    settings = Settings()
    assert arm_training(settings, "sql", None) == training_settings(settings, "sql")  # default: the round's own budget
    assert arm_training(settings, "extraction", None).train_time_budget_s == 120.0
    extraction = arm_training(settings, "extraction", 3)
    assert extraction.train_time_budget_s == UNBOUNDED_S
    assert extraction.train_learning_rate == training_settings(settings, "extraction").train_learning_rate  # the task's own rate stays
    data = TaskData("sql")
    data.sft = [SftExample(f"q{i}", f"a{i}", f"r{i}") for i in range(30)]  # thirty labels, as the bench gives
    split_validation(data, settings.seed)
    for task in ("sql", "push", "extraction"):
        arm = arm_training(settings, task, 3)
        assert planned_epochs(arm, len(data.sft)) == 3  # the same epochs, so the same steps, for every arm of a task
    assert planned_epochs(training_settings(settings, "sql"), len(data.sft)) > 3  # unlike the round's: as many as 40 steps need


def test_with_epochs_every_label_trains_and_without_a_rounds_validation_slice_is_held_out():
    from bench.learn import sft_data
    from trainer.data import MIN_VALIDATION

    examples = [SftExample(f"q{i}", f"a{i}", f"r{i}") for i in range(15)]
    every = sft_data("sql", list(examples), seed=1234, validation=False)
    assert every.sft == examples and every.validation == []  # nothing left to stop an arm early
    held = sft_data("sql", list(examples), seed=1234, validation=True)
    assert len(held.validation) == MIN_VALIDATION and len(held.sft) == 15 - MIN_VALIDATION
    assert sorted(held.sft + held.validation, key=lambda e: int(e.source[1:])) == examples


def test_the_report_says_how_the_arms_trained():
    from bench.labels import table

    results = _results(0.30, 0.10)
    assert "within one round's budget ({'sql': 45.0} s)" in table(results)
    results["settings"]["epochs"] = 3.0
    assert "3 epochs over all its labels (no validation slice), no time budget" in table(results)


def test_an_arm_trained_several_times_is_read_row_by_row_as_the_mean_over_its_trainings():
    from bench.labels import mean_totals, table

    assert mean_totals([[0.0, 1.0, 0.5], [1.0, 1.0, 0.0], [0.5, 0.25, 0.0]]) == [0.5, 0.75, round(0.5 / 3, 4)]
    assert mean_totals([[0.2, 0.4]]) == [0.2, 0.4]  # one training: its own rewards
    with pytest.raises(ValueError):
        mean_totals([[0.2, 0.4], [0.1]])  # trainings measured on other rows cannot be averaged row by row
    results = _results(0.30, 0.10)
    assert "trained once" in table(results)
    results["settings"]["trainings"] = 3
    assert "trained 3 times (training seeds 0 to 2), each row's reward the mean over the trainings" in table(results)


@pytest.mark.parametrize("trainings", ["0", "6", "two"])
def test_trainings_out_of_range_are_refused_before_anything_runs(tmp_path, trainings):
    from typer.testing import CliRunner

    from cli import main as cli

    result = CliRunner().invoke(cli.app, ["bench", "labels", "--trainings", trainings], env={"TUCANO_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert "--trainings" in result.output
    assert list(tmp_path.iterdir()) == []
