"""The learning loop against the real stack (vLLM engines, Valkey, the gateway, TRL on CPU):
traffic in, a round trains and evaluates candidates, the gate promotes, served answers on the
held-out eval split improve; rounds that must not train do not; the lock holds."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from common.datasets import load_split
from common.settings import load_settings
from common.store import FAILURES, Store
from deploy.hotswap import HotSwap
from trainer.round import RoundError, run_round

LOOP_TASKS = ("extraction", "push")
TRAFFIC_PER_TASK = 120
EVAL_ROWS = 48


def fleet(settings, store) -> HotSwap:
    return HotSwap(store, settings.base_model_path, settings.base_engine_urls or None, settings.drain_seconds)


def loop_settings(built, redis_url, **overrides):
    values = dict(data_dir=built.data_dir, redis_url=redis_url, min_records_per_task=32, train_max_steps=30,
                  eval_rows_per_task=EVAL_ROWS, drain_seconds=0.5, promote_margin=0.005)
    values.update(overrides)
    return load_settings(**values)


def _last_engine_failure(store: Store) -> str:
    entries = store.redis.xrevrange(FAILURES, count=1)
    return entries[0][1]["failure"] if entries else "no engine failure recorded"


async def _send(gateway, task: str, bodies: list[dict], concurrency: int = 8) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(body):
            async with gate:
                response = await client.post(f"{gateway.url}/v1/tasks/{task}", json=body)
                if response.status_code == 503:
                    raise AssertionError(f"{response.text}; {_last_engine_failure(gateway.state.store)}")
                assert response.status_code == 200, response.text
                return response.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def served_eval_score(gateway, settings, task: str) -> tuple[float, set[str]]:
    """Mean reward of the gateway's answers on the held-out eval rows, with fixed per-row seeds."""
    rows = load_split(settings.datasets_dir, task, "eval")[:EVAL_ROWS]
    bodies = [{"input": row["input"], "reference": row["reference"], "options": {"seed": settings.seed + i}}
              for i, row in enumerate(rows)]
    answers = asyncio.run(_send(gateway, task, bodies))
    return sum(a["scores"]["total"] for a in answers) / len(answers), {a["route"]["version"] for a in answers}


@pytest.fixture(scope="module")
def loop(built, redis_url, gateway):
    store = gateway.state.store
    store.register_engines("base", [e.url for e in gateway.state.pools["base"].engines])
    yield loop_settings(built, redis_url), store
    # the session's gateway is shared: what a round here promoted is rolled back (admin API),
    # so later modules find every task served by the base model again
    for task, route in store.routes()[1].items():
        if route.get("active"):  # each task here is promoted at most once, from the base model
            response = httpx.post(f"{gateway.url}/v1/adapters/{task}/rollback", timeout=120)
            assert response.status_code == 200 and response.json()["active"] is None, response.text
    time.sleep(0.5)  # gateways see a flip within a second


def test_too_few_records_is_a_clean_no_op(built, redis_url, gateway, loop):
    _settings, store = loop
    strict = loop_settings(built, redis_url, min_records_per_task=10_000)
    before = store.routes()
    summary = run_round(strict, store, fleet(strict, store), ("sql",), say=lambda _: None)
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
            run_round(settings, store, fleet(settings, store), say=lambda _: None)
    finally:
        if saved:
            store.register_engines("base", saved)


def test_closed_loop_round_trains_evaluates_and_gates(gateway, loop):
    settings, store = loop
    before = {task: served_eval_score(gateway, settings, task) for task in LOOP_TASKS}
    # extraction: plain traffic, and users correct most answers (feedback) -> DPO pairs;
    # push: traffic that carries its reference copy (labelled requests) -> GRPO with content rewards
    rows = load_split(settings.datasets_dir, "extraction", "train")[:TRAFFIC_PER_TASK]
    answers = asyncio.run(_send(gateway, "extraction", [{"input": row["input"]} for row in rows]))
    corrected = 0
    for row, answer in zip(rows, answers):
        if answer["scores"]["total"] < 0.999 and corrected < 0.6 * len(rows):
            response = httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": -1,
                                                                      "correction": row["reference"]})
            assert response.status_code == 200
            corrected += 1
    rows = load_split(settings.datasets_dir, "push", "train")[:TRAFFIC_PER_TASK]
    asyncio.run(_send(gateway, "push", [{"input": row["input"], "reference": row["reference"]} for row in rows]))
    messages: list[str] = []
    summary = run_round(settings, store, fleet(settings, store), LOOP_TASKS, say=messages.append)
    print("\n".join(messages))
    print(json.dumps({t: {k: v for k, v in e.items() if k != "evaluation"} for t, e in summary["tasks"].items()}, indent=1)[:4000])
    assert summary["acknowledged"] >= len(LOOP_TASKS) * TRAFFIC_PER_TASK
    for task in LOOP_TASKS:
        entry = summary["tasks"][task]
        assert entry["records"] >= TRAFFIC_PER_TASK and entry["skipped"].get("held-out eval input", 0) >= EVAL_ROWS
        assert entry["training"]["steps"] == settings.train_max_steps
        meta = store.adapter(entry["version"])
        assert meta.status in {"active", "rejected"} and meta.gate["scores"]
    assert summary["tasks"]["extraction"]["method"] == "dpo" and summary["tasks"]["push"]["method"] == "grpo"
    promoted = [t for t in LOOP_TASKS if summary["tasks"][t]["promoted"]]
    # corrections as DPO pairs teach the demo base model what its bootstrap left unlearnt: that
    # candidate must win (push GRPO in 30 steps is a coin toss, and the gate's call either way)
    assert "extraction" in promoted, summary["tasks"]["extraction"].get("reason")
    for task in LOOP_TASKS:  # the gate's decision follows its own measurement and policy
        evaluation = summary["tasks"][task]["evaluation"]
        scores = {s["version"]: s for s in evaluation["scores"]}
        candidate, incumbent = scores[summary["tasks"][task]["version"]], scores[evaluation["incumbent"]]
        better = candidate["total"] - incumbent["total"] >= settings.promote_margin
        kept = all(incumbent["components"][n] - v <= settings.promote_tolerance for n, v in candidate["components"].items())
        assert (task in promoted) == (better and kept)
        assert (store.routes()[1].get(task, {}).get("active") == candidate["version"]) == (task in promoted)
    time.sleep(0.5)  # gateways see a flip within a second
    for task in LOOP_TASKS:
        after = served_eval_score(gateway, settings, task)
        print(f"{task}: served eval score before {before[task][0]:.4f} ({before[task][1]}) "
              f"after {after[0]:.4f} ({after[1]}); {summary['tasks'][task]['status']}")
        if task in promoted:
            assert after[1] == {summary["tasks"][task]["version"]} and after[0] > before[task][0]
        else:
            assert after[1] == before[task][1]
    # `tucano bench train` reads this round's per-phase costs back
    from deploy.bench import train as bench_train
    costs = bench_train.results(bench_train.find_round(settings.rounds_dir, summary["round"]), None)
    assert set(costs["tasks"]) == set(LOOP_TASKS)
    assert all(costs["tasks"][t]["seconds"]["optimisation"] > 0 and costs["tasks"][t]["seconds"]["evaluation"] > 0
               for t in LOOP_TASKS)
    assert costs["tasks"]["push"]["completion_tokens"] > 0  # GRPO generated
    print(bench_train.table(costs))
    # the round read its records once: the next one finds nothing new for these tasks
    again = run_round(settings, store, fleet(settings, store), LOOP_TASKS, say=lambda _: None)
    assert all("too few usable records" in again["tasks"][t]["status"] for t in LOOP_TASKS)


def test_one_round_at_a_time(loop):
    settings, store = loop
    lock = store.round_lock(settings.round_lock_seconds)
    assert lock.acquire()
    try:
        assert run_round(settings, store, fleet(settings, store), say=lambda _: None) == {"status": "locked"}
    finally:
        lock.release()


def test_trainer_killed_mid_training_leaves_everything_as_it_was(built, redis_url, gateway, loop):
    import os
    import signal
    import subprocess
    import sys

    settings, store = loop
    rows = load_split(settings.datasets_dir, "sql", "train")[:40]
    asyncio.run(_send(gateway, "sql", [{"input": row["input"]} for row in rows]))
    routes_before, versions_before = store.routes()[1], {m.version for m in store.adapters("sql")}
    env = dict(os.environ, TUCANO_DATA_DIR=str(built.data_dir), TUCANO_REDIS_URL=redis_url, TUCANO_MIN_RECORDS_PER_TASK="8",
               TUCANO_TRAIN_MAX_STEPS="1000", TUCANO_ROUND_LOCK_SECONDS="6", OMP_NUM_THREADS="1")
    trainer = subprocess.Popen([sys.executable, "-m", "deploy.cli", "train", "--once", "--task", "sql"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in trainer.stdout:
        seen.append(line)
        if "sql: training on" in line:
            break
    time.sleep(8)  # well inside the optimisation
    assert trainer.poll() is None, "".join(seen)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    pending = store.redis.xpending("tucano:records", "trainers")["pending"]
    assert store.routes()[1] == routes_before
    assert {m.version for m in store.adapters("sql")} == versions_before  # nothing half-registered
    assert pending >= len(rows)  # nothing acknowledged
    time.sleep(7)  # the dead trainer's lock expires
    quick = loop_settings(built, redis_url, min_records_per_task=8, train_max_steps=2, eval_rows_per_task=8)
    summary = run_round(quick, store, fleet(quick, store), ("sql",), say=lambda _: None)
    assert summary.get("status") != "locked"
    assert summary["tasks"]["sql"]["records"] >= len(rows) and summary["tasks"]["sql"]["status"] in {"promoted", "rejected"}
    assert not any(p.name.endswith(".partial") for p in settings.adapters_dir.iterdir())
