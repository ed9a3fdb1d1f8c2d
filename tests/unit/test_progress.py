"""Progress in a log (deploy/progress.py): a line when a stage starts and one per tenth of a long
stage, each with the time spent and left; nothing more, so a 30-minute bootstrap writes a few
dozen lines, not one per step."""
from __future__ import annotations

import pytest

from deploy.progress import ProgressLines, duration


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bootstrap_writes_a_line_per_stage_and_per_tenth_of_its_long_stage():
    clock, lines = Clock(), []
    progress = ProgressLines("bootstrap", lines.append, {"commerce_db": 20.0, "datasets": 10.0, "base_model": 870.0}, clock)
    progress("commerce_db", 0, 6000)
    for n in range(1, 6001, 500):  # a short stage: no tenths
        clock.now = 20.0 * n / 6000
        progress("commerce_db", n, 6000)
    clock.now = 30.0
    progress("datasets", 1, 1)
    for step in range(1, 81):  # the long stage goes twice as slowly as expected
        clock.now = 30.0 + 2 * 870.0 * step / 80
        progress("base_model", step, 80)
    assert [line.split(",")[0] for line in lines] == ["bootstrap: commerce_db started", "bootstrap: datasets started",
                                                       "bootstrap: base_model started"] + [f"bootstrap: base_model {p}%" for p in range(10, 100, 10)]
    assert lines[0] == "bootstrap: commerce_db started, 0 s spent, 0% of the whole, about 15 min 00 s left"
    fifty = next(line for line in lines if "base_model 50%" in line)
    # half of the long stage: 465 of 900 expected seconds done in 900 s (1.94x the expected pace), so 435 x 1.94 = 842 s left
    assert fifty == "bootstrap: base_model 50%, 15 min 00 s spent, 52% of the whole, about 14 min 02 s left"


def test_a_round_without_weights_tells_the_stage_time_left():
    clock, lines = Clock(), []
    progress = ProgressLines("round", lines.append, clock=clock)
    progress("sft", 0, 40)
    clock.now = 10.0
    progress("sft", 4, 40)
    clock.now = 20.0
    progress("sft", 8, 40)
    assert lines == ["round: sft started, 0 s spent", "round: sft 10%, 10 s spent, about 1 min 30 s left in this stage",
                     "round: sft 20%, 20 s spent, about 1 min 20 s left in this stage"]
    progress("grpo", 0, 8)
    assert lines[-1] == "round: grpo started, 20 s spent"


def test_durations_read_as_people_say_them():
    assert (duration(0), duration(59.4), duration(60), duration(905)) == ("0 s", "59 s", "1 min 00 s", "15 min 05 s")


@pytest.mark.xdist_group("torch")
def test_a_round_publishes_where_it_stands_at_most_once_a_second_and_at_every_stage():
    from common.rounds import RoundSummary, TaskOutcome
    from trainer.round import stage_seconds

    last = RoundSummary(round="r1", started=0.0, tasks={
        "sql": TaskOutcome(outcome="promoted", why="labels", seconds={"training": 45.0, "load": 2.0, "gate": 60.0, "shadow": 10.0, "flip": 3.0}),
        "push": TaskOutcome(outcome="not trained", why="nothing new")})
    weights = stage_seconds(last, ("extraction", "sql", "push"))
    assert weights == {"sql training": 45.0, "sql gate": 62.0, "sql shadow": 13.0}  # untrained tasks took nothing to expect
    assert stage_seconds(None, ("sql",)) == {}
    clock, published = Clock(), []
    progress = ProgressLines("round", lambda _: None, weights, clock, publish=published.append)
    progress("sql training", 0, 1)
    for tick in range(1, 41):  # steps every 0.25 s: four a second, one published
        clock.now = tick * 0.25
        progress("sql training", tick * 25, 1000)
    clock.now = 60.0  # training took 60 s, not the 45 expected: the pace scales what is left
    progress("sql gate", 0, 1)
    assert [p.stage for p in published] == ["sql training"] * 11 + ["sql gate"]
    gate = published[-1]
    assert gate.job == "round" and gate.of_whole and gate.share == round(45 / 120, 4)
    assert gate.seconds_left == round(60 / 45 * 75, 1) and "about 1 min 40 s left" in gate.text
    unweighted = ProgressLines("round", lambda _: None, {}, clock, publish=published.append)
    clock.now = 100.0
    unweighted("extraction training", 0, 1)
    assert published[-1].seconds_left is None and not published[-1].of_whole  # no pace known yet
    clock.now = 130.0
    unweighted("extraction training", 500, 1000)
    assert published[-1].seconds_left == 30.0 and published[-1].share == 0.5
