"""`tucano bench learn`'s report: what the served reward on held-out rows is made of."""
import pytest

from rewards.scoring import Score


def _score(total: float, **components: float) -> Score:
    return Score(total=total, components=components, reference_used=True, valid=True)


def test_measured_gives_the_mean_its_interval_and_each_components_mean():
    from deploy.bench.learn import measured

    scores = [_score(0.2, parse=1.0, executes=0.0), _score(0.4, parse=1.0, executes=1.0), _score(0.0, parse=0.0)]
    out = measured(scores)
    assert out["mean"] == pytest.approx(0.2)
    assert out["n"] == 3
    assert out["ci95"][0] <= out["mean"] <= out["ci95"][1]
    # a component a score lacks (an unparsed answer never executes) counts as 0, not as missing
    assert out["components"] == {"executes": pytest.approx(1 / 3, abs=1e-4), "parse": pytest.approx(2 / 3, abs=1e-4)}


def test_the_markdown_shows_each_component_before_after_and_for_the_oracle():
    from deploy.bench.learn import components_table, table

    results = {
        "settings": {"rounds": 1, "requests": 10, "correction_rate": 0.2, "rating_rate": 0.3, "measure_rows": {"sql": 2, "push": 2}},
        "tasks": {
            "sql": {"rounds": [{"round": 0, "version": "base", "mean": 0.05, "ci95": [0.05, 0.05], "n": 2,
                                "components": {"parse": 0.0, "executes": 0.0}},
                               {"round": 1, "version": "sql-v1", "mean": 0.2, "ci95": [0.1, 0.3], "n": 2,
                                "components": {"parse": 0.9, "executes": 0.05}}],
                    "gain": {"mean": 0.15, "ci95": [0.05, 0.25], "n": 2},
                    "oracle": {"mean": 0.1, "ci95": [0.1, 0.1], "n": 2, "components": {"parse": 0.4, "executes": 0.0},
                               "gain": {"mean": 0.05}, "loop_share": 3.0}},
            "push": {"rounds": [{"round": 0, "version": "base", "mean": 0.6, "ci95": [0.5, 0.7], "n": 2,
                                 "components": {"length": 0.5}},
                                {"round": 1, "version": "base", "mean": 0.6, "ci95": [0.5, 0.7], "n": 2,
                                 "components": {"length": 0.5}}],
                     "gain": {"mean": 0.0, "ci95": [0.0, 0.0], "n": 2}},
        },
        "rounds": [{"round": 1, "seconds": 60.0, "tasks": {}}],
    }
    lines = components_table(results).splitlines()
    assert "| sql | executes | 0.000 | 0.050 | 0.000 |" in lines
    assert "| sql | parse | 0.000 | 0.900 | 0.400 |" in lines
    assert "| push | length | 0.500 | 0.500 | - |" in lines  # no oracle trained
    assert components_table(results) in table(results)
