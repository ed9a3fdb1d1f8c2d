"""`tucano bench busy`'s verdicts from answers it would have got: the p95 ratio of the busy phase
over the quiet one with its interval over block pairs, every status that was not a 200, and a
request that waited out the engine (a 504) or got a 503 without Retry-After counted as unserved."""
from __future__ import annotations

import random

from bench.busy import LATENCY_TARGET, measure, table


def side(rng, seconds: float, statuses: list[int] | None = None, retry_after: bool = True) -> list[dict]:
    statuses = statuses or [200] * 5
    return [{"seconds": seconds * rng.uniform(0.9, 1.1), "status": s, "retry_after": retry_after and s == 503} for s in statuses]


def test_training_that_slows_serving_a_little_meets_the_target_and_one_that_slows_it_a_lot_misses_it():
    rng = random.Random(1)
    gentle = measure([(side(rng, 1.0), side(rng, 1.2)) for _ in range(8)])
    assert gentle["p95_ratio"]["verdict"] == "met" and gentle["p95_ratio"]["ci95"][1] <= LATENCY_TARGET
    assert gentle["quiet"]["requests"] == gentle["busy"]["requests"] == 40 and gentle["waited_out_or_unanswered"] == 0
    harsh = measure([(side(rng, 1.0), side(rng, 2.5)) for _ in range(8)])
    assert harsh["p95_ratio"]["verdict"] == "missed" and harsh["p95_ratio"]["ci95"][0] > LATENCY_TARGET


def test_every_status_but_200_is_counted_and_a_504_or_a_bare_503_is_a_request_not_served():
    rng = random.Random(2)
    pairs = [(side(rng, 1.0), side(rng, 1.1, [200, 200, 503, 200, 504])) for _ in range(3)]
    pairs.append((side(rng, 1.0, [200, 503, 200, 200, 200], retry_after=False), side(rng, 1.1)))
    result = measure(pairs)
    assert result["busy"]["not_200"] == {"503 with Retry-After": 3, "504": 3}
    assert result["quiet"]["not_200"] == {"503": 1}
    assert result["waited_out_or_unanswered"] == 3 + 1  # the 504s and the 503 that said nothing of when to come back
    text = table({"settings": {"load": "round", "train_task": "sql", "pairs": 4, "block_rows": 5, "concurrency": 1, "training_nice": 19},
                  "trainer_threads": 1, "tasks": {"sql": {**result, "trainer_steps_while_busy": 7, "busy_seconds": 20.0}}})
    assert "a round's SFT of sql" in text and "| sql |" in text and "504" in text
