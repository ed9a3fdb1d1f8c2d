"""`tucano bench busy`'s verdicts from answers it would have got: the p95 ratio of the busy phase
over the quiet one with its interval over block pairs, every status that was not a 200, and a
request that waited out the engine (a 504) or got a 503 without Retry-After counted as unserved."""
from __future__ import annotations

import random

import pytest

from bench.busy import LATENCY_TARGET, STEP_MARK, measure, table, train_beside


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


def test_the_bootstrap_load_runs_a_first_serves_fine_tuning_again_and_again_at_its_own_steps(monkeypatch, tmp_path, capsys):
    """Each run is the fine-tuning a first serve starts (its default steps, the bootstrap rows), and a
    step mark per step. It had asked for a million steps in one run, whose examples the fine-tuning
    builds up front: the trainer never reached its first step."""
    from demo import bootstrap, finetune

    runs: list[int] = []

    def fine_tune(model_dir, out_dir, rows, templates, think_tasks, steps, lr, seed, bf16, on_step):
        runs.append(steps)
        on_step(0, 1.0)
        if len(runs) == 3:
            raise KeyboardInterrupt  # what stops the loop here; the bench stops the process
    monkeypatch.setenv("TUCANO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TUCANO_BOOTSTRAP_MODEL", "smollm2")
    monkeypatch.setattr(finetune, "finetune", fine_tune)
    monkeypatch.setattr(bootstrap, "training_rows", lambda settings, tasks: {task: [] for task in tasks})
    with pytest.raises(KeyboardInterrupt):
        train_beside("bootstrap", "sql")
    assert runs == [bootstrap.DEFAULT_SFT_STEPS["smollm2"]] * 3
    assert capsys.readouterr().out.count(STEP_MARK) == 3


def test_the_grpo_load_samples_on_the_engine_it_is_given_pass_after_pass_under_names_never_reused(monkeypatch, tmp_path, capsys):
    """A round's GRPO beside serving: its groups are sampled on the serving engine (train_on_engine
    with that URL), from the task's train rows as its prompts, and each pass names its reloads anew."""
    from bench import busy
    from router import engine_client
    from trainer import grpo, policy

    rows = [{"id": f"push-train-{i:05d}", "input": {"campaign": "cupom", "customer_name": "Ana", "coupon": f"CUPOM{i}"}} for i in range(3)]
    passes: list[tuple] = []

    def train_on_engine(settings, model, tokenizer, task, prompts, engine_url, name_prefix, budget_s, why, progress=None):
        passes.append((task, [p.source for p in prompts], engine_url, name_prefix, budget_s))
        progress("grpo", 1)
        if len(passes) == 3:
            raise KeyboardInterrupt  # what stops the loop here; the bench stops the process
    monkeypatch.setenv("TUCANO_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(busy, "load_split", lambda directory, task, split: rows if (task, split) == ("push", "train") else [])
    monkeypatch.setattr(engine_client.ChatTemplate, "load", classmethod(lambda cls, path: type("T", (), {"render": staticmethod(str)})()))
    monkeypatch.setattr(policy, "load_policy", lambda *args, **kwargs: ("model", "tokenizer"))
    monkeypatch.setattr(grpo, "train_on_engine", train_on_engine)
    with pytest.raises(KeyboardInterrupt):
        train_beside("grpo", "push", "http://127.0.0.1:9/")
    assert [p[0] for p in passes] == ["push"] * 3
    assert all(p[1] == [r["id"] for r in rows] and p[2] == "http://127.0.0.1:9/" and p[4] == float("inf") for p in passes)
    assert len({p[3] for p in passes}) == 3  # a fresh name prefix per pass
    assert capsys.readouterr().out.count(STEP_MARK) == 3


def test_the_grpo_load_without_an_engine_stops_with_a_message_that_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("TUCANO_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="engine"):
        train_beside("grpo", "push", "")


def test_a_quiet_block_waits_for_the_paused_trainers_last_engine_requests_and_gives_up_loudly(monkeypatch):
    """A rollout request sent before the pause decodes on in the engine: the quiet block must not
    measure it, and an engine that never empties stops the bench rather than measure the load as quiet."""
    from bench import busy

    answers = iter([False, False, True])
    monkeypatch.setattr(busy, "engines_idle", lambda urls: next(answers))
    monkeypatch.setattr(busy.time, "sleep", lambda s: None)
    assert busy.drained(["http://e"]) >= 0.0
    with pytest.raises(StopIteration):
        next(answers)  # polled until the engines were idle, and not after
    monkeypatch.setattr(busy, "engines_idle", lambda urls: False)
    with pytest.raises(RuntimeError, match="still busy"):
        busy.drained(["http://e"], timeout_s=0.0)


def test_the_grpo_loads_table_says_what_trained_beside_serving():
    rng = random.Random(3)
    result = measure([(side(rng, 1.0), side(rng, 1.3)) for _ in range(4)])
    text = table({"settings": {"load": "grpo", "train_task": "push", "pairs": 4, "block_rows": 5, "concurrency": 1, "training_nice": 19},
                  "trainer_threads": 1, "tasks": {"sql": {**result, "trainer_steps_while_busy": 3, "busy_seconds": 20.0}}})
    assert "a round's GRPO of push, its groups sampled on the serving engine" in text
