"""`tucano bench fix`'s latency verdict: the p95 ratio of requests with examples over those
without, with its interval over resampled block pairs, judged against the 1.5x target."""
from __future__ import annotations

import random

from bench.fix import LATENCY_TARGET, latency, table


def blocks(rng: random.Random, count: int, seconds: float, tokens: int, examples: int) -> list[list[dict]]:
    return [[{"seconds": seconds * rng.uniform(0.8, 1.2), "prompt_tokens": tokens, "examples": examples} for _ in range(5)]
            for _ in range(count)]


def test_prompts_that_cost_little_meet_the_target_and_long_ones_miss_it():
    rng = random.Random(1)
    cheap = latency({"with": blocks(rng, 8, 1.1, 700, 3), "without": blocks(rng, 8, 1.0, 500, 0)})
    assert cheap["verdict"] == "met" and cheap["p95_ratio_ci95"][0] <= cheap["p95_ratio"] <= cheap["p95_ratio_ci95"][1] <= LATENCY_TARGET
    assert cheap["with"]["prompt_tokens_mean"] == 700 and cheap["with"]["examples_mean"] == 3 and cheap["without"]["requests"] == 40
    costly = latency({"with": blocks(rng, 8, 3.0, 2000, 3), "without": blocks(rng, 8, 1.0, 500, 0)})
    assert costly["verdict"] == "missed" and costly["p95_ratio_ci95"][0] > LATENCY_TARGET
    straddling = latency({"with": [[{"seconds": s, "prompt_tokens": 900, "examples": 3} for s in (1.0, 1.2, 1.1, 2.2, 1.0)]] * 2
                                  + [[{"seconds": 1.0, "prompt_tokens": 900, "examples": 3}] * 5] * 2,
                          "without": [[{"seconds": 1.0, "prompt_tokens": 500, "examples": 0}] * 5] * 4})
    assert straddling["p95_ratio_ci95"][0] < LATENCY_TARGET < straddling["p95_ratio_ci95"][1] and straddling["verdict"] == "undecided"


def test_the_table_shows_the_latency_line():
    rng = random.Random(2)
    measured = {"mean": 0.5, "ci95": [0.4, 0.6], "n": 40}
    entry = {state: {**measured, "gain": None if state == "before" else {"mean": 0.1, "ci95": [0.0, 0.2]}}
             for state in ("before", "at once", "after the round", "both")}
    entry["repeats"] = {"corrections": 30, "answered_from_correction": 30, "repeats_better": 30, "seconds_to_better": None}
    entry["round"] = {"outcome": "rejected", "seconds": 100.0}
    entry["latency"] = latency({"with": blocks(rng, 8, 1.1, 700, 3), "without": blocks(rng, 8, 1.0, 500, 0)})
    text = table({"tasks": {"sql": entry}})
    assert "| sql | " in text.splitlines()[-1] and "met" in text.splitlines()[-1] and "700 / 500" in text.splitlines()[-1]


def test_the_table_sets_the_two_trainings_side_by_side():
    measured = {"mean": 0.5, "ci95": [0.4, 0.6], "n": 40}
    entry = {state: {**measured, "gain": None} for state in ("before", "at once", "after the round", "both")}
    entry["repeats"] = {"corrections": 30, "answered_from_correction": 30, "repeats_better": 30, "seconds_to_better": None}
    entry["round"] = {"outcome": "promoted", "seconds": 100.0}
    arm = {"steps": {"sft": 9}, "prompt_chars": 1500, "alone": {"mean": 0.61, "ci95": [0.5, 0.7]}, "as served": {"mean": 0.72, "ci95": [0.6, 0.8]}}
    entry["examples in training"] = {"with examples": {**arm, "version": "push-v1"},
                                     "bare prompts": {**arm, "version": "push-v2", "prompt_chars": 400},
                                     "as served, with minus bare": {"mean": 0.041, "ci95": [0.002, 0.08]}}
    lines = table({"tasks": {"push": entry}}).splitlines()
    assert "| push | with examples (push-v1) | sft 9 | 1500 | 0.610 [0.500, 0.700] | 0.720 [0.600, 0.800] |" in lines
    assert "| push | bare prompts (push-v2) | sft 9 | 400 | 0.610 [0.500, 0.700] | 0.720 [0.600, 0.800] |" in lines
    assert "| push | as served, with minus bare | | | | +0.041 [+0.002, +0.080] |" in lines
