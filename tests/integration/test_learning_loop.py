"""The learning loop against the real stack (vLLM engines with runtime LoRA, Valkey, the gateway,
TRL on CPU): traffic and feedback in, rounds train on every signal, the gate decides with an
interval, and the served model improves on held-out rows that no round trained on; labels are
kept and replayed, a rejected or interrupted round loses nothing, bad corrections store nothing."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.learn import served_scores
from common.datasets import input_key, load_split
from common.rounds import Outcome
from common.stats import mean_interval
from common.store import FAILURES, RECORDS, Store
from tests.integration.conftest import fleet_for, loop_settings
from trainer import gate
from trainer.round import RoundError, run_round

HELD_OUT = 24  # the first train-split rows, never sent as traffic: with the rows after the second round's, where the served reward is measured
MORE_HELD_OUT = 40  # (24 rows left the gain's interval at +-0.06: one run in CI came out at +0.054 [-0.009, +0.111])
TRAFFIC = 200  # 160 corrected: one round on ~50 corrections gained +0.0001 to +0.06 on the gate from run to run
CORRECTED = 8  # of every 10 answers (a team that corrects most of them: enough labels for one round to show)


def _last_engine_failure(store: Store) -> str:
    entries = store.redis.xrevrange(FAILURES, count=1)
    return entries[0][1]["failure"] if entries else "no engine failure recorded"


async def _send(url: str, store: Store, task: str, bodies: list[dict], concurrency: int = 8) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(body):
            async with gate:
                response = await client.post(f"{url}/v1/tasks/{task}", json=body)
                if response.status_code == 503:
                    raise AssertionError(f"{response.text}; {_last_engine_failure(store)}")
                assert response.status_code == 200, response.text
                return response.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def served(settings, fleet, task: str, version: str | None, rows: list[dict]) -> list[float]:
    """`version`'s answers (None: the base model) to held-out rows through the engines, with the
    task's serving prompt, sampling and a fixed seed per row, scored against their references.
    Without the team's examples: what one round adds to the tiny model is what is measured (beside
    it, the demonstrations move the tiny model's extraction more than any round, and not up)."""
    return [s.total for s in asyncio.run(served_scores(settings, fleet, task, version, rows))]


def test_a_round_with_nothing_new_is_a_clean_no_op(built, redis_url, gateway, loop):
    settings, store = loop
    store.mark_trained("sql")  # labels that earlier modules' traffic left (the API fuzz sends references) are not news
    before = store.routes()
    summary = run_round(loop_settings(built, redis_url, min_records_per_task=10_000), store, fleet_for(settings, store, gateway),
                        ("sql",), say=lambda _: None)
    assert summary.tasks["sql"].outcome == Outcome.NOT_TRAINED and store.routes() == before


def test_auto_leaves_grpo_out_of_extractions_unlabelled_traffic_and_the_round_says_why(built, redis_url, gateway, loop):
    """Extraction's own training settings turn `auto_grpo` off (tasks/extraction.py): a round on its
    unlabelled traffic, its served groups, trains nothing, registers nothing and says why."""
    settings, store = loop
    rows = load_split(settings.datasets_dir, "extraction", "train")[-8:]
    asyncio.run(_send(gateway.url, store, "extraction", [{"input": row["input"]} for row in rows]))
    # the task's own settings (task_training unset); labels earlier tests left are too few for SFT, DPO or KTO here
    chosen = loop_settings(built, redis_url, task_training=None, min_records_per_task=1, min_sft_examples=10_000,
                           min_dpo_pairs=10_000, min_kto_examples=10_000)
    before = (store.routes(), [meta.version for meta in store.adapters("extraction")])
    entry = run_round(chosen, store, fleet_for(chosen, store, gateway), ("extraction",), say=print).tasks["extraction"]
    assert entry.outcome == Outcome.NOT_TRAINED and entry.plan == [] and entry.version is None, entry
    assert entry.data.groups >= 8 and "grpo left out: auto_grpo is off for this task" in entry.reason, entry
    assert (store.routes(), [meta.version for meta in store.adapters("extraction")]) == before


def test_a_round_refuses_without_engines(built, redis_url):
    store = Store(redis_url)
    from deploy.hotswap import HotSwap

    empty = HotSwap(store, {"base": built.base_model_path, "think": built.think_model_path}, {}, 0, retire_examples=None)
    saved = {kind: (store.engine_urls(kind), store.engine_numerics(kind)) for kind in ("base", "think")}
    store.redis.hdel("tucano:engines", "base", "think")
    try:
        with pytest.raises(RoundError, match=r"no .*engine is registered"):
            run_round(loop_settings(built, redis_url), store, empty, say=lambda _: None)
    finally:
        for kind, (urls, numerics) in saved.items():
            if urls:
                store.register_engines(kind, urls, numerics)


def test_bad_corrections_are_refused_and_store_nothing(gateway, loop):
    _, store = loop
    answer = httpx.post(f"{gateway.url}/v1/tasks/extraction", json={"input": {"review": "Chegou quebrado."}}, timeout=120).json()
    labels_before = store.labels("extraction")
    for correction, needle in [({"sentiment": "furious"}, "sentiment"), ("DROP TABLE x", "JSON object"), ({"title": "x"}, "sentiment")]:
        response = httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": -1, "correction": correction})
        assert response.status_code == 422 and needle in response.json()["error"]["message"], response.text
    sql = httpx.post(f"{gateway.url}/v1/tasks/sql", json={"input": {"question": "Quantos pedidos?"}}, timeout=120).json()
    refused = httpx.post(f"{gateway.url}/v1/feedback", json={"id": sql["id"], "rating": -1, "correction": "DELETE FROM olist_orders_dataset"})
    assert refused.status_code == 422 and "read-only SELECT" in refused.json()["error"]["message"]
    bad_reference = httpx.post(f"{gateway.url}/v1/tasks/sql", json={"input": {"question": "x"}, "reference": "DROP TABLE x"})
    assert bad_reference.status_code == 422 and "reference" in bad_reference.json()["error"]["message"]
    assert store.labels("extraction") == labels_before
    assert store.get_record(answer["id"]).record.feedback is None and store.get_record(sql["id"]).record.feedback is None


def test_the_served_model_improves_from_corrections_on_rows_no_round_trained_on(built, redis_url, gateway, loop):
    """Extraction traffic with 80% of the answers corrected (the reference as correction) and 10%
    rated: the round runs SFT on the corrections, the gate promotes on a paired interval, and the
    promoted version's greedy answer to held-out train rows (without the team's examples) rises
    beyond its interval over the base model's; served as the best of 4, it is not lower. The labels
    stay, and a second round replays them."""
    settings, store = loop
    rows = load_split(settings.datasets_dir, "extraction", "train")
    traffic, second = rows[HELD_OUT:HELD_OUT + TRAFFIC], rows[HELD_OUT + TRAFFIC:][:12]
    held_out = rows[:HELD_OUT] + rows[HELD_OUT + TRAFFIC + 12:][:MORE_HELD_OUT]
    # the session is shared: an earlier module's request that carried a valid reference (the API fuzz sends some) is a label too
    earlier_labels = {label.id for label in store.labels("extraction")}
    answers = asyncio.run(_send(gateway.url, store, "extraction", [{"input": row["input"]} for row in traffic]))
    corrected, rated = 0, 0
    for i, (row, answer) in enumerate(zip(traffic, answers)):
        body = {"id": answer["id"], "rating": 1 if answer["scores"]["total"] > 0.9 else -1}
        if i % 10 < CORRECTED:
            body["correction"], corrected = row["reference"], corrected + 1
        elif i % 10 < CORRECTED + 1:
            rated += 1
        else:
            continue
        assert httpx.post(f"{gateway.url}/v1/feedback", json=body).status_code == 200
    labels = store.labels("extraction")
    assert sum(1 for label in labels if label.answer_source == "correction") == corrected
    assert sum(1 for label in labels if label.rating is not None) >= corrected + rated
    hotswap = fleet_for(settings, store, gateway)
    # every eval row (a narrow interval); SFT bounded by epochs, not seconds, so a busy CI machine trains as much. The gate
    # compares the models without the team's examples: with 160 demonstrations in its prompts, the gate's difference for the
    # tiny model was +0.054, +0.025, -0.012, and once a field worse, in four runs (without: +0.130); the gate with
    # examples has its own test (test_promotion). 16 epochs: the tiny model rebuilt for push's new prompt gained -0.040 and
    # +0.022 after 8 (rejected), -0.003 after 4, and +0.102 after 16 in two runs.
    settings = loop_settings(built, redis_url, gate_max_rows=128, train_time_budget_s=600, sft_max_epochs=16, examples_tasks=[])
    summary = run_round(settings, store, hotswap, ("extraction",), say=print)
    entry = summary.tasks["extraction"]
    assert [step.method for step in entry.plan][:1] == ["sft"], entry.plan
    train_corrections = [label for label in labels if label.answer_source == "correction" and label.split == "train"]
    counts = entry.data
    train_supervised = [label for label in labels if label.answer is not None and label.split == "train"]  # corrections and references
    assert counts.sft - counts.liked_sft + counts.validation == len(train_supervised)
    assert len(train_corrections) < corrected  # the team's eval share held out
    liked = [label for label in labels if label.rating == 1 and label.answer is None and label.split == "train"]
    assert counts.liked_sft == len(liked)  # a liked answer nobody corrected is a supervised example too
    decision = entry.gate.decision
    assert decision.n >= settings.gate_min_rows and decision.rows["bootstrap"] > 0 and decision.rows["team"] > 0
    assert entry.outcome == Outcome.PROMOTED, entry.reason
    meta = store.adapter(entry.version)
    assert meta.status == "active" and meta.gate.decision.interval[0] > 0
    walked = [change.status for change in meta.history if change.status != "candidate"]  # its life, as the round gave it
    assert walked == ["gated", *(["shadowed"] if entry.gate.shadow else []), "active"], walked
    assert entry.retired.checked > 0, entry.retired  # the examples it trained on, asked of it without demonstrations
    assert meta.training.methods[0].method == "sft" and meta.training.steps["sft"]  # per-step metrics kept
    from bench import train as bench_train  # `tucano bench train` reads this round's phases back
    costs = bench_train.results(bench_train.find_round(settings.rounds_dir, summary.round), None)["tasks"]["extraction"]
    assert costs["seconds"]["training"] > 0 and costs["seconds"]["gate"] > 0 and costs["methods"]["sft"]["steps"] > 0
    # no round trained on the held-out rows, nor on any eval input
    trained = set(meta.data.sources.sft) | set(meta.data.sources.pairs)
    traffic_ids = {a["id"] for a in answers}
    assert trained & traffic_ids and trained <= traffic_ids | earlier_labels
    assert not {input_key(r["input"]) for r in held_out} & {input_key(r["input"]) for r in traffic}
    eval_ids = {label.id for label in labels if label.split == "eval"}
    assert eval_ids and not trained & eval_ids  # the team's eval labels are never trained on
    held_out_inputs = gate.held_out_inputs(settings, store, "extraction") | {input_key(label.input) for label in labels if label.split == "eval"}
    assert not held_out_inputs & {input_key(label.input) for label in labels if label.id in trained}
    # What the round taught the weights is measured on one greedy sample: extraction is served as the best of 4, which on
    # the tiny model lifts the base as far as a round of corrections does (0.290 to 0.393, and the trained version 0.405;
    # docs/results.md, 2026-12-05), so it would hide the round. As served, the version must not be worse.
    greedy = settings.model_copy(update={"serve_samples": {}})
    before, after = served(greedy, hotswap, "extraction", None, held_out), served(greedy, hotswap, "extraction", meta.version, held_out)
    gain, low, high = mean_interval([a - b for a, b in zip(after, before)])
    print(f"extraction reward on {len(held_out)} held-out rows, one greedy sample: {sum(before) / len(before):.3f} -> "
          f"{sum(after) / len(after):.3f}, gain {gain:+.3f} [{low:+.3f}, {high:+.3f}]")
    assert low > 0, (gain, low, high)
    before, after = served(settings, hotswap, "extraction", None, held_out), served(settings, hotswap, "extraction", meta.version, held_out)
    as_served, low, high = mean_interval([a - b for a, b in zip(after, before)])
    print(f"as served (best of 4): {sum(before) / len(before):.3f} -> {sum(after) / len(after):.3f}, "
          f"gain {as_served:+.3f} [{low:+.3f}, {high:+.3f}]")
    assert high > 0, (as_served, low, high)
    # round 2: a little new traffic, no new labels; the first round's labels are still trained on
    asyncio.run(_send(gateway.url, store, "extraction", [{"input": row["input"]} for row in second]))
    again = run_round(settings, store, hotswap, ("extraction",), say=print).tasks["extraction"]
    assert again.version and set(store.adapter(again.version).data.sources.sft) & set(meta.data.sources.sft)


def test_ratings_alone_train_with_kto_and_a_rejected_round_loses_nothing(built, redis_url, gateway, loop):
    settings, store = loop
    rows = load_split(settings.datasets_dir, "push", "train")[:48]
    answers = asyncio.run(_send(gateway.url, store, "push", [{"input": row["input"]} for row in rows]))
    for i, answer in enumerate(answers):
        assert httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": 1 if i % 2 else -1}).status_code == 200
    strict = loop_settings(built, redis_url, promote_margin=0.99, train_time_budget_s=10)
    labels_before = store.labels("push")
    summary = run_round(strict, store, fleet_for(strict, store, gateway), ("push",), say=print)
    entry = summary.tasks["push"]
    assert [step.method for step in entry.plan] == ["kto"] and entry.outcome == Outcome.REJECTED
    assert store.adapter(entry.version).status == "rejected" and store.route("push").active is None
    assert store.labels("push") == labels_before  # nothing consumed
    assert store.redis.xinfo_groups(RECORDS)[0]["pending"] == 0  # records acknowledged; labels are what is kept
    relaxed = loop_settings(built, redis_url, train_time_budget_s=10)
    store.mark_trained("push", 0.0)  # as if nothing had run: the labels alone make it train again
    retry = run_round(relaxed, store, fleet_for(relaxed, store, gateway), ("push",), say=print).tasks["push"]
    assert set(store.adapter(retry.version).data.sources.kto) == set(store.adapter(entry.version).data.sources.kto)


def test_one_round_at_a_time(loop, gateway):
    settings, store = loop
    lock = store.round_lock(settings.round_lock_seconds)
    assert lock.acquire()
    try:
        impatient = settings.model_copy(update={"round_lock_wait_s": 0})
        assert run_round(impatient, store, fleet_for(settings, store, gateway), say=lambda _: None) is None
        waiting = settings.model_copy(update={"round_lock_wait_s": 1.0})
        said: list[str] = []
        started = time.perf_counter()
        assert run_round(waiting, store, fleet_for(settings, store, gateway), say=said.append) is None
        # redis-py gives up once its next try (every 0.1 s) would fall past the timeout
        assert time.perf_counter() - started >= 0.8 and "waiting up to 1 s" in said[0], said
    finally:
        lock.release()


def test_trainer_killed_mid_training_leaves_everything_as_it_was(built, redis_url, gateway, loop):
    settings, store = loop
    rows = load_split(settings.datasets_dir, "sql", "train")[:40]
    answers = asyncio.run(_send(gateway.url, store, "sql", [{"input": row["input"]} for row in rows]))
    for row, answer in zip(rows[:16], answers):
        assert httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": -1, "correction": row["reference"]}).status_code == 200
    routes_before, versions_before, labels_before = store.routes()[1], {m.version for m in store.adapters("sql")}, store.labels("sql")
    env = dict(os.environ, TUCANO_DATA_DIR=str(built.data_dir), TUCANO_REDIS_URL=redis_url, TUCANO_MIN_RECORDS_PER_TASK="8",
               TUCANO_TRAIN_TIME_BUDGET_S="600", TUCANO_TASK_TRAINING="{}", TUCANO_SFT_MIN_STEPS="100000", TUCANO_ROUND_LOCK_SECONDS="6", OMP_NUM_THREADS="1")
    trainer = subprocess.Popen([sys.executable, "-m", "cli", "train", "--once", "--task", "sql"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in trainer.stdout:
        seen.append(line)
        if "sql:" in line and "training" in line:
            break
    # SFT now optimises until its 600 s budget (more steps than it can take; early stopping only
    # acts after the minimum), so the kill lands in optimisation however fast a step is
    time.sleep(8)
    assert trainer.poll() is None, "".join(seen)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert store.routes()[1] == routes_before
    assert {m.version for m in store.adapters("sql")} == versions_before  # nothing half-registered
    assert store.labels("sql") == labels_before
    assert store.redis.xpending(RECORDS, "trainers")["pending"] >= len(rows)  # nothing acknowledged
    time.sleep(7)  # the dead trainer's lock expires
    quick = loop_settings(built, redis_url, train_time_budget_s=5)
    summary = run_round(quick, store, fleet_for(quick, store, gateway), ("sql",), say=lambda _: None)
    assert summary is not None  # the dead trainer's lock expired
    assert summary.tasks["sql"].outcome in {Outcome.PROMOTED, Outcome.REJECTED}
    assert not any(p.name.endswith(".partial") for p in settings.adapters_dir.iterdir())


def test_a_round_on_a_4bit_nf4_base_makes_an_adapter_vllm_serves_and_the_gate_judges(built, redis_url, gateway, loop):
    """TUCANO_TRAIN_QUANTIZATION=nf4 on the CPU (bitsandbytes computes 4-bit there): SQL requests
    that carry references are the labels; the round trains on the 4-bit base model, and the
    adapter it saves loads into the engine and is judged like any other."""
    settings, store = loop
    rows = load_split(settings.datasets_dir, "sql", "train")[:40]
    asyncio.run(_send(gateway.url, store, "sql", [{"input": row["input"], "reference": row["reference"]} for row in rows]))
    qlora = loop_settings(built, redis_url, train_quantization="nf4", train_method="sft", train_time_budget_s=20)
    entry = run_round(qlora, store, fleet_for(qlora, store, gateway), ("sql",), say=print).tasks["sql"]
    meta = store.adapter(entry.version)
    assert meta.training.quantization == "nf4" and meta.method == "sft"
    assert entry.gate.decision.n >= qlora.gate_min_rows, entry  # the engine loaded it and answered the eval rows with it
    assert entry.outcome in (Outcome.PROMOTED, Outcome.REJECTED), entry

