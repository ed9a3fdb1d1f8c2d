"""The learning loop against the real stack (vLLM engines, Valkey, the gateway, TRL on CPU):
traffic in, a round trains and evaluates candidates, the gate promotes, served answers on the
held-out eval split improve; rounds that must not train do not; the lock holds."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from deploy.rounds import RoundError, run_round
from foundation.config import load_settings
from foundation.datasets import load_split
from foundation.store import Store

LOOP_TASKS = ("extraction", "push")
TRAFFIC_PER_TASK = 120
EVAL_ROWS = 48


def loop_settings(built, redis_url, **overrides):
    values = dict(data_dir=built.data_dir, redis_url=redis_url, min_records_per_task=32, train_max_steps=30,
                  eval_rows_per_task=EVAL_ROWS, drain_seconds=0.5, promote_margin=0.005)
    values.update(overrides)
    return load_settings(**values)


async def _send(url: str, task: str, bodies: list[dict], concurrency: int = 8) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(body):
            async with gate:
                response = await client.post(f"{url}/v1/tasks/{task}", json=body)
                assert response.status_code == 200, response.text
                return response.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def served_eval_score(url: str, settings, task: str) -> tuple[float, set[str]]:
    """Mean reward of the gateway's answers on the held-out eval rows, with fixed per-row seeds."""
    rows = load_split(settings.datasets_dir, task, "eval")[:EVAL_ROWS]
    bodies = [{"input": row["input"], "reference": row["reference"], "options": {"seed": settings.seed + i}}
              for i, row in enumerate(rows)]
    answers = asyncio.run(_send(url, task, bodies))
    return sum(a["scores"]["total"] for a in answers) / len(answers), {a["route"]["version"] for a in answers}


@pytest.fixture(scope="module")
def loop(built, redis_url, gateway):
    store = gateway.state.store
    store.register_engines("base", [e.url for e in gateway.state.pools["base"].engines])
    return loop_settings(built, redis_url), store


def test_too_few_records_is_a_clean_no_op(built, redis_url, gateway, loop):
    settings, store = loop
    strict = loop_settings(built, redis_url, min_records_per_task=10_000)
    before = store.routes()
    summary = run_round(strict, store, ("sql",), say=lambda _: None)
    assert "too few usable records" in summary["tasks"]["sql"]["status"]
    # nothing trained, no route changed; only records no round can ever use (other tasks' ones) are acknowledged
    assert store.routes() == before and summary["acknowledged"] == sum(summary["unusable"].values())


def test_round_refuses_without_engines(built, redis_url):
    store = Store(redis_url)
    settings = loop_settings(built, redis_url, base_engine_urls=[])
    saved = store.engine_urls("base")
    store.redis.hdel("tucano:engines", "base")
    try:
        with pytest.raises(RoundError, match="no base engine"):
            run_round(settings, store, say=lambda _: None)
    finally:
        if saved:
            store.register_engines("base", saved)


def test_closed_loop_promotes_a_better_adapter(gateway, loop):
    settings, store = loop
    before = {task: served_eval_score(gateway.url, settings, task) for task in LOOP_TASKS}
    # extraction: plain traffic, and users correct most answers (feedback) -> DPO pairs;
    # push: traffic that carries its reference copy (labelled requests) -> GRPO with content rewards
    rows = load_split(settings.datasets_dir, "extraction", "train")[:TRAFFIC_PER_TASK]
    answers = asyncio.run(_send(gateway.url, "extraction", [{"input": row["input"]} for row in rows]))
    corrected = 0
    for row, answer in zip(rows, answers):
        if answer["scores"]["total"] < 0.999 and corrected < 0.6 * len(rows):
            response = httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": -1,
                                                                      "correction": row["reference"]})
            assert response.status_code == 200
            corrected += 1
    rows = load_split(settings.datasets_dir, "push", "train")[:TRAFFIC_PER_TASK]
    asyncio.run(_send(gateway.url, "push", [{"input": row["input"], "reference": row["reference"]} for row in rows]))
    messages: list[str] = []
    summary = run_round(settings, store, LOOP_TASKS, say=messages.append)
    print("\n".join(messages))
    print(json.dumps({t: {k: v for k, v in e.items() if k != "evaluation"} for t, e in summary["tasks"].items()}, indent=1)[:4000])
    assert summary["acknowledged"] >= len(LOOP_TASKS) * TRAFFIC_PER_TASK
    for task in LOOP_TASKS:
        entry = summary["tasks"][task]
        assert entry["records"] >= TRAFFIC_PER_TASK and entry["skipped"].get("held-out eval input", 0) >= EVAL_ROWS
        assert entry["training"]["steps"] == settings.train_max_steps
        meta = store.adapter(entry["version"])
        assert meta["status"] in {"active", "rejected"} and meta["eval"]["scores"]
    assert summary["tasks"]["extraction"]["method"] == "dpo" and summary["tasks"]["push"]["method"] == "grpo"
    promoted = [t for t in LOOP_TASKS if summary["tasks"][t]["promoted"]]
    assert promoted, "no candidate passed the gate"
    import time
    time.sleep(0.5)  # gateways see a flip within a second
    for task in LOOP_TASKS:
        after = served_eval_score(gateway.url, settings, task)
        print(f"{task}: served eval score before {before[task][0]:.4f} ({before[task][1]}) "
              f"after {after[0]:.4f} ({after[1]})")
        if task in promoted:
            assert after[1] == {summary["tasks"][task]["version"]}
            assert after[0] > before[task][0]
        else:
            assert after[1] == before[task][1]
    # the round read its records once: the next one finds nothing new for these tasks
    again = run_round(settings, store, LOOP_TASKS, say=lambda _: None)
    assert all("too few usable records" in again["tasks"][t]["status"] for t in LOOP_TASKS)


def test_one_round_at_a_time(loop):
    settings, store = loop
    lock = store.round_lock(settings.round_lock_seconds)
    assert lock.acquire()
    try:
        assert run_round(settings, store, say=lambda _: None) == {"status": "locked"}
    finally:
        lock.release()
