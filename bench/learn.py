"""`tucano bench learn`: does the served model get better from a team's own traffic?

It plays a team against the real stack (vLLM engines with runtime LoRA, the gateway, an embedded
Valkey, all throwaway, in a scratch data dir that links the bootstrap's models, DB and datasets):
per round and task it sends `requests` requests drawn from the task's train split, corrects a
share of the answers through `/v1/feedback` (the row's reference as the correction) and rates
another share (+1 when the answer scores at least `LIKED` against the reference, else -1), then
runs a training round in process, exactly as `tucano train --once` does.

Served reward is measured before the first round and after each on held-out rows (each version
alone, and as served: with the team's examples in its prompts as the gateway shows them, or
without them where its gate chose to serve it alone): the test split,
the demo store's own rows that are never sent as traffic, never in the demo model's bootstrap
(pretraining, SFT or tokenizer), and never seen by the gate (which uses the eval split and the
team's eval labels). Rows are answered through
the engines with the version the route serves, the task's serving sampling and a fixed seed per
row, and scored against their references; gains come with 95% paired intervals.

It also trains an oracle per task (SFT, from the base model, on the references of all the traffic
the loop saw) and reports the loop's gain as a share of the oracle's; optionally a label curve
(the same SFT on the references of the first K requests, for each K given), which tells a task
that more labels would lift from one its model limits; runs a GRPO ablation (the
same prompts, `sum` against `gdpo` advantages, from the same start); and times a canary driven
by live traffic to its verdict. The round's own seconds per phase (training, gate, shadow
replay, flip) come from the round summaries.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx
import msgspec
import redis
from scipy.stats import spearmanr

from bench.stack import start, wait_ready
from common import lifecycle
from common.datasets import load_split
from common.processes import free_port
from common.settings import Settings
from common.stats import block_interval, mean_interval, rank_correlation_interval
from common.store import UNKNOWN_NUMERICS, Store
from deploy.embedded_redis import EmbeddedRedis
from deploy.hotswap import HotSwap
from rewards import Score
from router.engine_client import ChatTemplate, EnginePool
from tasks import TASK_ENGINE, TRAITS, definition, model_path_of, score, training_settings, typed_input
from trainer import gate
from trainer.data import GrpoPrompt, SftExample, TaskData, split_validation

LIKED = 0.8  # a simulated user likes an answer that scores at least this against the reference
CONCURRENCY = 8
TRIES = 4  # a 503 or 504 is sent again, up to this many tries in all
MAX_RETRY_AFTER_S = 30.0
LINKED = ("models", "commerce.db", "datasets", "manifest.json")


def _link_bootstrap(settings: Settings, scratch: Path) -> None:
    """Links the bootstrap's models, DB and datasets into a bench's scratch data dir."""
    for name in LINKED:
        if (settings.root / name).exists():
            (scratch / name).symlink_to(settings.root / name)


class Team:
    """The simulated team: traffic from each task's train split, a share of the answers corrected
    with the reference, another share rated; measured on the test split (never sent, never in the
    demo model's bootstrap)."""

    def __init__(self, settings: Settings, gateway_url: str, tasks: tuple[str, ...], measure_rows: int, seed: int,
                 label_choice: str = "random"):
        self.settings, self.url, self.rng, self.label_choice = settings, gateway_url, random.Random(seed), label_choice
        self.held_out: dict[str, list[dict]] = {}
        self.pool: dict[str, list[dict]] = {}
        for task in tasks:
            self.held_out[task] = load_split(settings.datasets_dir, task, "test")[:measure_rows]
            self.pool[task] = load_split(settings.datasets_dir, task, "train")
        self.sent: dict[str, list[dict]] = {task: [] for task in tasks}
        self.last: dict[str, list[tuple[dict, dict]]] = {}  # the newest traffic of each task: (row, the gateway's answer)

    def answer_of(self, task: str, row: dict) -> object:
        return row["reference"] if TRAITS[task].scored_with_reference else row["target"]

    async def review_ranks(self, client: httpx.AsyncClient, task: str) -> dict[str, int]:
        """Each record id the review queue (`GET /v1/review/{task}`) lists, with its place: 0 for
        the answer a label would help most."""
        response = await client.get(f"{self.url}/v1/review/{task}", params={"limit": 200})
        if response.is_error:
            raise TrafficFailed(f"GET /v1/review/{task}: HTTP {response.status_code}: {response.text[:500]}")
        return {item["id"]: i for i, item in enumerate(response.json()["items"])}

    async def queue_order(self, client: httpx.AsyncClient, task: str, answers: list[dict], order: list[int]) -> list[int]:
        """`order` (indices of `answers`) sorted as the review queue ranks the answers; answers it
        leaves out keep their place in `order`, after the ones it lists."""
        return in_queue_order(await self.review_ranks(client, task), answers, order)

    async def play(self, task: str, requests: int, correction_rate: float, rating_rate: float) -> dict:
        rows = [self.pool[task][self.rng.randrange(len(self.pool[task]))] for _ in range(requests)]
        gate_ = asyncio.Semaphore(CONCURRENCY)
        unavailable: list[str] = []
        async with httpx.AsyncClient(timeout=600) as client:
            async def ask(row: dict) -> dict:
                async with gate_:
                    return await post_as_a_client(client, f"{self.url}/v1/tasks/{task}", {"input": row["input"]}, unavailable)
            answers = await asyncio.gather(*(ask(row) for row in rows))
            order = list(range(len(rows)))
            self.rng.shuffle(order)
            if self.label_choice == "queue":
                order = await self.queue_order(client, task, answers, order)
            corrected = order[:round(correction_rate * len(rows))]
            rated = order[len(corrected):len(corrected) + round(rating_rate * len(rows))]
            feedback = []
            for index in corrected + rated:
                row, answer = rows[index], answers[index]
                context = self.settings.reward_context(typed_input(task, row["input"]))
                quality = score(task, answer["raw"], row["reference"], context).total
                body = {"id": answer["id"], "rating": 1 if quality >= LIKED else -1}
                if index in corrected:
                    body["correction"] = self.answer_of(task, row)
                feedback.append(post_as_a_client(client, f"{self.url}/v1/feedback", body, unavailable))
            await asyncio.gather(*feedback)
        self.sent[task] += rows
        self.last[task] = list(zip(rows, answers))
        return {"requests": len(rows), "corrected": len(corrected), "rated": len(rated),
                "served_reward": round(statistics.fmean(a["scores"]["total"] for a in answers), 4),
                **answer_shape(task, answers),
                "retried_503": sum(m.startswith("HTTP 503") for m in unavailable),
                "retried_504": sum(m.startswith("HTTP 504") for m in unavailable), "first_retried": unavailable[:3]}


def in_queue_order(ranks: dict[str, int], answers: list[dict], order: list[int]) -> list[int]:
    """`order` (indices of `answers`) sorted by the review queue's `ranks`; unlisted answers last, in `order`'s order."""
    return sorted(order, key=lambda i: ranks.get(answers[i]["id"], len(ranks)))


class TrafficFailed(RuntimeError):
    """The gateway refused the team's traffic; the message is its own answer."""


def answer_shape(task: str, answers: list[dict]) -> dict:
    """How long the answers ran and took: completion tokens (median, 95th percentile, longest),
    how many stopped at the task's token limit (an answer that repeats itself until cut off), and
    the gateway's latency. A version that writes long answers shows here before it times out. An
    answer picked from a group is billed every sample's tokens, so its tokens are the group's mean
    per sample, and it is at the limit only when that mean is (every sample ran to it)."""
    tokens = sorted(round(a["usage"]["completion_tokens"] / _samples(a)) for a in answers)
    seconds = sorted(a["latency_ms"] / 1000 for a in answers)
    limit = definition(task).sampling.max_tokens

    def at(values: list, share: float):
        return values[min(len(values) - 1, int(share * len(values)))]

    return {"answer_tokens": {"p50": at(tokens, 0.5), "p95": at(tokens, 0.95), "max": tokens[-1]},
            "at_token_limit": sum(t >= limit for t in tokens),
            "latency_s": {"p50": round(at(seconds, 0.5), 1), "p95": round(at(seconds, 0.95), 1), "max": round(seconds[-1], 1)}}


def _samples(answer: dict) -> int:
    """How many completions the answer's request sampled (finished and cut)."""
    sample = answer.get("sample")
    return 1 if not sample else sample["of"] + sample.get("cut", 0)


async def post_as_a_client(client: httpx.AsyncClient, url: str, body: dict, unavailable: list[str]) -> dict:
    """The answer's JSON, as a team's client gets it: a 503 (an engine or the store down for now)
    is sent again after its Retry-After, and a 504 (an engine that did not answer in time) at
    once, up to `TRIES` times, each message noted in `unavailable` with its status (the run
    reports them per round); any other error, or a 503 or 504 on every try, stops the run with the
    gateway's own message."""
    for attempt in range(1, TRIES + 1):
        response = await client.post(url, json=body)
        if response.status_code in (503, 504) and attempt < TRIES:
            unavailable.append(f"HTTP {response.status_code}: {response.text[:300]}")
            await asyncio.sleep(_retry_after_s(response) if response.status_code == 503 else 0.0)
            continue
        if response.is_error:
            raise TrafficFailed(f"POST {url}: HTTP {response.status_code} on try {attempt} of {TRIES}: {response.text[:500]}")
        return response.json()
    raise AssertionError("the last try returns or raises")


def _retry_after_s(response: httpx.Response) -> float:
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:  # an HTTP date, or nothing readable: wait a second
        return 1.0


async def served_scores(settings: Settings, fleet: HotSwap, task: str, version: str | None, rows: list[dict],
                        examples_from: Store | None = None, reference_free: list | None = None,
                        samples: list | None = None) -> list[Score]:
    """Each held-out row answered by `version` through the engines, scored with its reference;
    with `examples_from`, each prompt shows that store's examples as the gateway would; with
    `reference_free`, it receives each answer's served (reference-free) score too; with `samples`,
    each row's (served score, reference score) of every sample its answer was picked from
    (`sample_pairs`)."""
    kind = TASK_ENGINE[task]
    eval_rows = [gate.EvalRow.of(task, row, "bench") for row in rows]
    shown = gate.demonstrations(settings, examples_from, task, {row.id: row.input for row in eval_rows})
    pool = EnginePool.for_task(settings, task, fleet.urls(kind))
    groups: list[list[str]] = []
    try:
        scores = await gate.answer(pool, settings, task, version, eval_rows, settings.seed, shown=shown, reference_free=reference_free,
                                   free_sources=frozenset({"bench"}), groups=groups)
    finally:
        await pool.close()
    if samples is not None and any(len(texts) > 1 for texts in groups):  # groups of one: the picks are all there is
        samples += sample_pairs(settings, task, eval_rows, groups)
    return scores


def sample_pairs(settings: Settings, task: str, rows: list, groups: list[list[str]]) -> list[list[tuple[float, float]]]:
    """Per row with a reference, each sample of its group scored twice: (served score, reference
    score). A row served greedily is a group of one."""
    out = []
    for row, texts in zip(rows, groups):
        if row.reference is None:
            continue
        context = settings.reward_context(row.input)
        out.append([(score(task, text, None, context).total, score(task, text, row.reference, context).total) for text in texts])
    return out


def _pooled_rho(blocks: list[list[tuple[float, float]]]) -> float:
    served, referenced = zip(*[pair for block in blocks for pair in block])
    return float(spearmanr(served, referenced).statistic) if len(set(served)) > 1 and len(set(referenced)) > 1 else math.nan


def within_group_rhos(blocks: list[list[tuple[float, float]]]) -> list[float]:
    """Each group's Spearman rho of its samples' served score against their reference score, where
    both sides vary: what GRPO's centred advantages act on (a group whose served scores tie is
    dropped from training anyway)."""
    rhos = []
    for block in blocks:
        served, referenced = zip(*block) if block else ((), ())
        if len(set(served)) > 1 and len(set(referenced)) > 1:
            rhos.append(float(spearmanr(served, referenced).statistic))
    return rhos


def samples_check(blocks: list[list[tuple[float, float]]]) -> dict | None:
    """How the served score ranks every sample a version's held-out answers were picked from, which
    is what a round's GRPO trains on: Spearman's rho over all samples (95% interval with whole
    groups resampled: a group's samples share a prompt), and the mean of each group's own rho
    (`within_group_rhos`, as `bench grpo-gain` reports it for its train rows; interval over
    groups). None where every group is one sample: the picks are then all there is (`scorer_check`)."""
    blocks = [block for block in blocks if block]
    if not blocks or max(map(len, blocks)) < 2:
        return None
    rho = _pooled_rho(blocks)
    low, high = block_interval(blocks, _pooled_rho) if rho == rho else (math.nan, math.nan)
    rhos = within_group_rhos(blocks)
    within = interval(rhos) if len(rhos) >= 2 else None
    return {"samples": sum(map(len, blocks)), "groups": len(blocks),
            "rank_correlation": None if rho != rho else round(rho, 3),
            "ci95": None if low != low or high != high else [round(low, 3), round(high, 3)],
            "within_group": None if within is None else {"mean": round(within["mean"], 3), "ci95": [round(v, 3) for v in within["ci95"]],
                                                          "groups": len(rhos)}}


def scorer_check(free: list[Score | None], scores: list[Score], samples: list | None = None) -> dict | None:
    """How far the served score ranks a version's held-out answers as their references do:
    Spearman's rho with its 95% interval (issue 64: at least 0.7 on each structured task as the
    model learns), and the reference-free mean beside the reference-scored one (a policy that
    learns to please the scorer gains on the first and not on the second). Where the answers
    were picked from groups, `samples` (`sample_pairs`) adds the same over every sample
    (`samples_check`): a pick is the sample the served score liked best, partly by its own error,
    so the picks alone understate how it ranks what GRPO trains on. `tied`: the most answers that
    share one served score. A rank correlation over answers that mostly tie measures little of the
    served score (push's base model: most picks are fluent, personal, state the offer and never say
    the campaign, and all score 0.275; the references tell them apart by their template's words).
    None where the task has no reference."""
    pairs = [(f, s) for f, s in zip(free, scores) if f is not None]
    if len(pairs) < 3:
        return None
    served, referenced = zip(*((f.total, s.total) for f, s in pairs))
    over = samples_check(samples) if samples else None
    common = {"n": len(pairs), "tied": max(Counter(served).values()), "served_mean": round(statistics.fmean(served), 4),
              **reference_only(pairs),
              **({"over_samples": over} if over else {})}
    rho, low, high = rank_correlation_interval(served, referenced)
    if rho != rho:  # every answer scored alike on one side: no ranking to compare
        return {"rank_correlation": None, "ci95": None, **common}
    return {"rank_correlation": round(rho, 3), "ci95": [round(low, 3), round(high, 3)] if low == low else None, **common}


def reference_only(pairs: list[tuple[Score, Score]]) -> dict:
    """The part of the reference-scored total that components only a reference scores make (push's
    `reference_overlap`: 0.35 of its weights), as a mean over the answers, and their names. Where
    the other components are the served score's own (push), the reference-free gain runs ahead of
    the reference-scored one by exactly that weight times the served gain, less this part's gain
    (docs/results.md, 2026-12-07, `bench grpo-gain --beta`), so a lead is read beside it. Empty where
    the reference score has no such component or its weights are unknown."""
    names = sorted({k for f, s in pairs for k in s.weights if k not in f.weights})
    parts = [sum(s.weights[k] * s.components.get(k, 0.0) for k in names if k in s.weights) / sum(s.weights.values())
             for f, s in pairs if s.weights]
    if not names or not parts:
        return {}
    return {"reference_only": names, "reference_only_mean": round(statistics.fmean(parts), 4)}


def interval(values: list[float]) -> dict:
    mean, low, high = mean_interval(values)
    return {"mean": round(mean, 4), "ci95": [round(low, 4), round(high, 4)], "n": len(values)}


def paired_gain(after: list[Score], before: list[Score]) -> dict:
    """The change in served reward, paired by held-out row."""
    return interval([a.total - b.total for a, b in zip(after, before)])


def measured(scores: list[Score]) -> dict:
    """The mean served reward with its interval, and what it is made of: each part the gate
    compares, every component's mean (SQL's total, for one, moves with `parse` long before
    `execution_match` does) and each extraction field's (whose content is one component)."""
    each = [gate.parts(s) for s in scores]
    names = sorted({name for parts in each for name in parts})
    return {**interval([s.total for s in scores]),
            "components": {name: round(statistics.fmean(parts.get(name, 0.0) for parts in each), 4) for name in names}}


def distinct(rows: list[dict]) -> list[dict]:
    """The requests in the order they were first sent, each input once."""
    first: dict[str, dict] = {}
    for row in rows:
        first.setdefault(row["id"], row)
    return list(first.values())


def reference_examples(settings: Settings, task: str, rows: list[dict]) -> list[SftExample]:
    """SFT examples of `rows` (every one of them labelled): the serving prompt, its reference."""
    render = ChatTemplate.load(model_path_of(settings, task)).render
    from router.prompts import answer_text, build_messages

    return [SftExample(render(build_messages(task, typed_input(task, row["input"]))),
                       answer_text(task, row["reference"] if TRAITS[task].scored_with_reference else row["target"], think_opened=True),
                       row["id"]) for row in rows]


def sft_data(task: str, examples: list[SftExample], seed: int, validation: bool) -> TaskData:
    """SFT on `examples`; with `validation`, a slice held out as a round holds it (its loss stops
    the SFT early and picks the best epoch), else every example trains for every planned epoch."""
    data = TaskData(task)
    data.sft = examples
    if validation:
        split_validation(data, seed)
    return data


def sft_from_base(settings: Settings, store: Store, fleet: HotSwap, team: Team, task: str, rows: list[dict], why: str,
                  baseline: list[Score], validation: bool = True, training_seed: int | None = None) -> tuple[dict, list[Score]]:
    """A fresh LoRA on the base model, SFT on the rows' references (`validation`: as `sft_data`),
    measured on the held-out rows; with how many references it trained on and its steps, epochs and
    seconds. Also its held-out scores, row by row. `training_seed` (default: the settings' seed)
    seeds the training alone: the held-out rows are answered with the settings' seeds whatever it is."""
    from trainer.candidate import train_candidate  # the trainers are imported where a bench trains: torch and TRL take seconds

    started = time.perf_counter()
    data = sft_data(task, reference_examples(settings, task, rows), settings.seed, validation)
    trained_with = settings if training_seed is None else settings.model_copy(update={"seed": training_seed})
    meta = train_candidate(trained_with, store, data, [("sft", why)], "oracle", None)
    asyncio.run(fleet.load(meta.version, meta.path, TASK_ENGINE[task]))
    scores = asyncio.run(served_scores(settings, fleet, task, meta.version, team.held_out[task]))
    return ({"version": meta.version, **measured(scores), "gain": paired_gain(scores, baseline),
             "seconds": round(time.perf_counter() - started, 1), "labels": len(rows), "training": msgspec.to_builtins(meta.training.methods)},
            scores)


async def _canary_run(settings: Settings, store: Store, fleet: HotSwap, team: Team, task: str, version: str, say) -> dict:
    """A canary at half the traffic, fed by the team until the watcher's verdict."""
    from deploy.serve import watch_canaries

    started = time.perf_counter()
    await fleet.start_canary(version, 0.5)
    requests = 0
    while store.route(task).canary == version and time.perf_counter() - started < 900:
        requests += (await team.play(task, 16, 0.0, 0.0))["requests"]
        await asyncio.to_thread(watch_canaries, settings, store, fleet, say)
    meta = store.adapter(version)
    return {"task": task, "version": version, "requests": requests, "seconds": round(time.perf_counter() - started, 1),
            "outcome": (meta.canary and meta.canary.outcome) or meta.status, "reason": meta.canary and meta.canary.reason}


ABLATION_ARMS = (("sum", "grpo"), ("gdpo", "grpo"), ("sum at the supervised rate", "supervised"))


def grpo_prompts(settings: Settings, task: str, rows: list[dict]) -> list[GrpoPrompt]:
    """GRPO prompts of dataset rows, unlabelled: each row's serving prompt (no examples) and its
    reward context, as a round's prompts are without served groups."""
    from router.prompts import build_messages

    render = ChatTemplate.load(model_path_of(settings, task)).render
    prompts = []
    for row in rows:
        task_input = typed_input(task, row["input"])
        prompts.append(GrpoPrompt(render(build_messages(task, task_input)), task, row["id"],
                                  context=settings.reward_context(task_input).to_json()))
    return prompts


def _ablation(settings: Settings, store: Store, fleet: HotSwap, team: Team, task: str, say) -> dict:
    """GRPO from the task's active version (or the base model) on the same prompts (the loop's
    traffic, unlabelled), each arm measured on the held-out rows: `sum` against `gdpo` advantages
    at GRPO's learning rate, and `sum` at the supervised methods' rate (the task's
    `train_learning_rate`, which GRPO used until it had its own)."""
    from trainer import grpo
    from trainer.candidate import register
    from trainer.policy import load_policy

    sent = list({r["id"]: r for r in team.sent[task]}.values())[: settings.unlabelled_prompts_per_round]
    prompts = grpo_prompts(settings, task, sent)
    active = store.route(task).active
    parent = store.adapter(active) if active else None
    out = {"task": task, "prompts": len(prompts), "start": active or "base"}
    held_out_scores: dict[str, list[Score]] = {}
    for arm, rate in ABLATION_ARMS:
        aggregation = arm.split()[0]
        model, tokenizer = load_policy(model_path_of(settings, task), parent.path if parent else None, settings.lora_rank, settings.lora_alpha,
                                       seed=settings.seed)
        own = training_settings(settings, task)
        if rate == "supervised":
            own = own.model_copy(update={"grpo_learning_rate": own.train_learning_rate})
        outcome = grpo.train(own, model, tokenizer, task, prompts, own.train_time_budget_s, "ablation", aggregation=aggregation)
        meta = register(settings, store, model, task, parent, f"bench-ablation-{arm}", [outcome], {})
        version = meta.version
        asyncio.run(fleet.load(version, meta.path, TASK_ENGINE[task]))
        scores = asyncio.run(served_scores(settings, fleet, task, version, team.held_out[task]))
        out[arm] = {**measured(scores), "learning_rate": own.grpo_learning_rate, "steps": outcome.steps, "seconds": round(outcome.seconds, 1),
                    "zero_variance_groups_dropped": outcome.seconds_by_phase.get("zero_variance_groups_dropped")}
        held_out_scores[arm] = scores
        say(f"ablation {task} grpo {arm} (learning rate {own.grpo_learning_rate}): {out[arm]['mean']}")
    start_scores = asyncio.run(served_scores(settings, fleet, task, active, team.held_out[task]))
    out["start_measured"] = measured(start_scores)
    out["gdpo_minus_sum"] = paired_gain(held_out_scores["gdpo"], held_out_scores["sum"])
    for arm, _ in ABLATION_ARMS:
        out[arm]["gain_over_start"] = paired_gain(held_out_scores[arm], start_scores)
    return out


def start_stack(settings: Settings, scratch: Path, stack: ExitStack, say, update: dict | None = None,
                gateway_env: dict[str, str] | None = None) -> tuple[Settings, Store, HotSwap, str]:
    """The throwaway stack a team plays against, in `scratch` (linked to the bootstrap's models, DB
    and datasets): an embedded Valkey, the engines, one gateway worker and the fleet as `tucano
    train` runs it. `update` changes the bench's settings and
    `gateway_env` the gateway's (as TUCANO_* variables). Returns the bench's settings, the store,
    the fleet and the gateway's URL; `stack` stops them all."""
    _link_bootstrap(settings, scratch)
    redis_url = stack.enter_context(EmbeddedRedis(scratch / "redis"))
    engines = bench_engines(settings, scratch, stack, say)
    urls = {kind: kind_urls for kind, (kind_urls, _) in engines.items()}
    bench = settings.model_copy(update={"data_dir": scratch, "redis_url": redis_url, "base_engine_urls": urls["base"],
                                        "think_engine_url": urls["think"][0], "train_enabled": False, "canary_share": 0.0,
                                        **(update or {})})
    store = Store(redis_url)
    store.ensure_group()
    for kind, (kind_urls, numerics) in engines.items():
        store.register_engines(kind, kind_urls, numerics)
    gateway_url = start_gateway(bench, stack, "gateway", {**bench_env(bench), **(gateway_env or {})})
    return bench, store, HotSwap.for_settings(store, bench, drain="later"), gateway_url


def set_aside(store: Store, fleet: HotSwap, version: str, task: str, why: str) -> None:
    """A version a benchmark trained only to measure: unloaded (an engine holds a few LoRAs at a
    time) and marked rejected with `why`, never gated or served."""
    asyncio.run(fleet.unload(version, TASK_ENGINE[task]))
    lifecycle.reject(store, version, why)


def start_gateway(bench: Settings, stack: ExitStack, name: str, env: dict[str, str]) -> str:
    """One gateway worker on the bench's store and engines, logging to `<scratch>/<name>.log`; its URL once ready."""
    port = free_port()
    scratch = bench.data_dir
    gateway = start(stack, "bench.stack:serve_gateway", scratch / f"{name}.log", str(scratch), bench.redis_url,
                    bench.base_engine_urls[0], bench.think_engine_url, str(port), "1", str(scratch / f"metrics-{name}"), "off",
                    env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    wait_ready(gateway, name, f"{url}/readyz", scratch / f"{name}.log", timeout_s=300)
    return url


def run(settings: Settings, rounds: int, requests: int, correction_rate: float, rating_rate: float, measure_rows: int,
        tasks: tuple[str, ...], oracle: bool, ablation: tuple[str, ...], canary_task: str | None, label_curve: tuple[int, ...] = (),
        keep: Path | None = None, say=print, label_choice: str = "random") -> dict:
    """The run's results. With `keep` (`<data dir>/bench/<name>`), what it measured so far is kept
    after each round, a run that fails keeps its processes' logs (`keep_what_ran`), and each
    measured version's held-out answers go to `<name>.answers.jsonl` (`keep_answers`)."""
    from trainer.round import run_round

    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-learn-")))
        if keep is not None:
            answers_path(keep).unlink(missing_ok=True)  # a run of the same name starts its answers afresh
        results: dict = {}
        store: Store | None = None
        try:
            bench, store, fleet, gateway_url = start_stack(settings, scratch, stack, say)
            team = Team(bench, gateway_url, tasks, measure_rows, settings.seed, label_choice)
            results = {"settings": {"rounds": rounds, "requests": requests, "correction_rate": correction_rate, "label_choice": label_choice,
                                    "rating_rate": rating_rate, "measure_rows": {t: len(team.held_out[t]) for t in tasks},
                                    "recipe": bench.model_dump(mode="json", include={"train_method", "train_time_budget_s", "train_learning_rate",
                                                                                      "task_training", "grpo_advantage", "promote_margin",
                                                                                      "team_eval_share"})},
                       "tasks": {t: {"rounds": []} for t in tasks}, "rounds": []}
            free: dict[str, list] = {t: [] for t in tasks}  # the served score of the latest measurement's answers
            samples: dict[str, list] = {t: [] for t in tasks}  # and of every sample they were picked from
            baseline = {t: asyncio.run(served_scores(bench, fleet, t, None, team.held_out[t], reference_free=free[t], samples=samples[t]))
                        for t in tasks}
            for t in tasks:
                results["tasks"][t]["rounds"].append({"round": 0, "version": "base", **measured(baseline[t]),
                                                      "scorer": scorer_check(free[t], baseline[t], samples[t])})
                say(f"{t}: served reward before any round {results['tasks'][t]['rounds'][0]['mean']}")
                if keep is not None:
                    keep_answers(answers_path(keep), t, 0, "base", team.held_out[t], baseline[t], free[t])
            latest = dict(baseline)
            for number in range(1, rounds + 1):
                played = {t: asyncio.run(team.play(t, requests, correction_rate, rating_rate)) for t in tasks}
                started = time.perf_counter()
                summary = run_round(bench, store, fleet, tasks, say=say)
                round_seconds = time.perf_counter() - started
                asyncio.run(fleet.unload_drained())  # what serve's periodic job does after a round
                time.sleep(1.0)  # gateways see a flip within a second
                entry = {"round": number, "seconds": round(round_seconds, 1), "tasks": {}}
                for t in tasks:
                    active = store.route(t).active
                    before = results["tasks"][t]["rounds"][-1]["version"]
                    if (active or "base") != before:
                        free[t], samples[t] = [], []
                        scores = asyncio.run(served_scores(bench, fleet, t, active, team.held_out[t], reference_free=free[t],
                                                           samples=samples[t]))
                        if keep is not None:
                            keep_answers(answers_path(keep), t, number, active or "base", team.held_out[t], scores, free[t])
                    else:
                        scores = latest[t]
                    measurement = {"round": number, "version": active or "base", **measured(scores),
                                   "scorer": scorer_check(free[t], scores, samples[t])}
                    if (active or "base") != before:  # a promotion: the new version against the one it replaced, row by row
                        measurement["against_previous"] = {"previous": before, **paired_gain(scores, latest[t])}
                    latest[t] = scores
                    shows = store if store.shows_examples(active) else None  # as the gateway serves it (its gate's choice)
                    served = asyncio.run(served_scores(bench, fleet, t, active, team.held_out[t], examples_from=shows))
                    measurement["as_served"] = {**measured(served), "gain": paired_gain(served, baseline[t]), "examples": shows is not None}
                    task_entry = msgspec.to_builtins(summary.tasks[t])
                    results["tasks"][t]["rounds"].append(measurement)
                    gate_record = task_entry.get("gate") or {}
                    entry["tasks"][t] = {"traffic": played[t], "decision": gate_record.get("decision"), "shadow": gate_record.get("shadow"),
                                         **{key: task_entry.get(key) for key in (
                                             "outcome", "reason", "plan", "start", "training", "seconds", "peak_rss_gb", "stop_conditions")}}
                    say(f"round {number} {t}: {task_entry['outcome']}; served reward {results['tasks'][t]['rounds'][-1]['mean']}")
                results["rounds"].append(entry)
                for t in tasks:
                    results["tasks"][t]["gain"] = paired_gain(latest[t], baseline[t])  # so far
                if keep is not None:
                    keep_what_ran(keep, results)
            # the oracle and the label curve train SFT from the base model with the whole run's time budget
            for t in tasks:
                own = training_settings(bench, t)  # the task's own training settings, its budget times the rounds
                sft_settings = own.model_copy(update={"train_time_budget_s": own.train_time_budget_s * rounds})
                sent = distinct(team.sent[t])
                if oracle:
                    entry, _ = sft_from_base(sft_settings, store, fleet, team, t, sent, "oracle: every request labelled", baseline[t])
                    loop_gain = results["tasks"][t]["gain"]["mean"]
                    entry["loop_share"] = round(loop_gain / entry["gain"]["mean"], 3) if entry["gain"]["mean"] > 0 else None
                    results["tasks"][t]["oracle"] = entry
                    say(f"{t}: oracle {entry['mean']} (gain {entry['gain']['mean']}), loop gain {loop_gain}")
                for labels in sorted(set(label_curve)):
                    rows = sent[:labels]
                    entry, _ = sft_from_base(sft_settings, store, fleet, team, t, rows, f"label curve: the first {len(rows)} requests' references",
                                             baseline[t])
                    results["tasks"][t].setdefault("label_curve", []).append(entry)
                    say(f"{t}: SFT from base on {len(rows)} references: {entry['mean']} (gain {entry['gain']['mean']})")
            results["ablation"] = [_ablation(bench, store, fleet, team, t, say) for t in ablation if t in tasks]
            if canary_task in tasks and oracle:
                results["canary"] = asyncio.run(_canary_run(bench, store, fleet, team, canary_task,
                                                            results["tasks"][canary_task]["oracle"]["version"], say))
        except BaseException as error:
            if keep is not None:
                keep_what_ran(keep, results, scratch, error, engine_failures(store))
            raise
    return results


def answers_path(keep: Path) -> Path:
    """Where a run keeps each measured version's held-out answers (`keep_answers`)."""
    return keep.with_name(f"{keep.name}.answers.jsonl")


def keep_answers(path: Path, task: str, number: int, version: str, rows: list[dict], scores: list[Score],
                 free: list[Score | None]) -> int:
    """Appends one line per held-out row to `path`: the version's answer beside the row's reference,
    with its score against the reference and its served (reference-free) score and their
    components, so that a reader can see what a gain is made of. Returns the lines written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    free = free or [None] * len(rows)  # no served scores taken
    if not len(rows) == len(scores) == len(free):  # scores of other rows are a bug, not a default: nothing is written
        raise ValueError(f"{len(rows)} rows, {len(scores)} scores and {len(free)} served scores")
    with path.open("a", encoding="utf-8") as out:
        for row, scored, served in zip(rows, scores, free):
            line = {"round": number, "task": task, "version": version, "id": row["id"], "input": row["input"],
                    "reference": row.get("reference"), "answer": scored.output, "score": scored.total,
                    "components": scored.components, "served_score": served.total if served else None,
                    "served_components": served.components if served else None}
            out.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
    return len(rows)


def partial_path(keep: Path) -> Path:
    """Where `keep_what_ran` keeps a run's results while it runs."""
    return keep.with_name(f"{keep.name}.partial.json")


FAILURES_KEPT = 50


def engine_failures(store: Store | None) -> list[dict]:
    """The engine errors the gateway answered with a 503 (`Store.add_failure`), newest first: their
    cause (a timeout, an engine gone), which a 503's own message does not say and which the scratch
    dir's Redis would otherwise take with it."""
    if store is None:
        return []
    try:
        return store.recent_failures(FAILURES_KEPT)
    except redis.RedisError as error:
        return [{"error": f"the store could not be read for its failures: {error}"}]


def keep_what_ran(keep: Path, results: dict, scratch: Path | None = None, error: BaseException | None = None,
                  failures: list[dict] | None = None) -> Path:
    """`<keep>.partial.json`: what a run has measured so far, rewritten after each round (a run cut
    off by the OOM killer or a reset keeps its finished rounds) and when it fails, with its error and
    the engine failures the gateway recorded; a failing run also copies its processes' logs (gateway,
    engines) to `<keep>-logs/`, which its scratch dir would otherwise take with it. A run that ends
    well removes the partial file."""
    keep.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(keep)
    kept = {"rounds_done": len(results.get("rounds", [])), "results": results}
    if error is not None:
        kept["error"] = f"{type(error).__name__}: {error}"
        kept["engine_failures"] = failures or []
        if scratch is not None:
            logs = keep.with_name(f"{keep.name}-logs")
            logs.mkdir(exist_ok=True)
            for log in scratch.glob("*.log"):
                shutil.copyfile(log, logs / log.name)
            kept["logs"] = str(logs)
    written = partial.with_name(partial.name + ".tmp")
    written.write_text(json.dumps(kept, indent=2, ensure_ascii=False))
    written.replace(partial)
    return partial


def bench_env(settings: Settings) -> dict[str, str]:
    """The gateway process's settings: what the bench changed, as TUCANO_* variables."""
    return {"TUCANO_TEAM_EVAL_SHARE": str(settings.team_eval_share), "TUCANO_TRAIN_ENABLED": "false",
            "TUCANO_MAX_CORRECTIONS_PER_RECORD": str(settings.max_corrections_per_record)}


def bench_engines(settings: Settings, scratch: Path, stack: ExitStack, say,
                  kinds: tuple[str, ...] = ("base", "think")) -> dict[str, tuple[list[str], str]]:
    """Each kind's engine URLs and numerics (`VllmServer.numerics`): the configured ones where the
    settings name every kind asked for, else one of each started here, as `serve` starts them."""
    configured = {"base": settings.base_engine_urls, "think": [settings.think_engine_url] if settings.think_engine_url else []}
    if all(configured[kind] for kind in kinds):
        return {kind: (configured[kind], UNKNOWN_NUMERICS) for kind in kinds}
    from deploy.vllm_server import local_engine, run_engines

    servers = [local_engine(kind, settings.model_path_for(kind), "cpu", scratch, settings.engine_cpu_precision) for kind in kinds]
    run_engines(stack, servers, say)
    return {server.name: ([server.url], server.numerics) for server in servers}


def trained(entry: dict) -> str:
    """A round's training of one task in a few words: each method's steps and epochs, why it
    stopped, and where its LoRA started (the same labels give different versions as the steps
    that a time budget buys vary)."""
    outcomes = entry.get("training") or []
    if not outcomes:
        return "+".join(step["method"] for step in entry.get("plan") or []) or "-"
    start = (entry.get("start") or {}).get("weights")
    done = " + ".join(f"{o['method']} {o['steps']} steps, {o['epochs']:g} epochs ({o['stopped_by']})" for o in outcomes)
    return f"{done}, from {start}" if start else done


def table(results: dict) -> str:
    tasks = list(results["tasks"])
    rounds = len(results["rounds"])
    lines = ["| task | " + " | ".join(f"round {r}" for r in range(rounds + 1)) + " | gain (95% interval) | oracle | oracle gain | loop share |",
             "|---|" + "---:|" * (rounds + 1) + "---|---:|---:|---:|"]
    for t in tasks:
        entry = results["tasks"][t]
        cells = [f"{r['mean']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]" for r in entry["rounds"]]
        gain = entry["gain"]
        oracle = entry.get("oracle") or {}
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] | "
                     f"{oracle.get('mean', '-')} | {oracle.get('gain', {}).get('mean', '-')} | {oracle.get('loop_share', '-')} |")
    if any("as_served" in r for entry in results["tasks"].values() for r in entry["rounds"]):
        lines += ["", as_served_table(results)]
    lines += ["", targets_table(results), "", components_table(results)]
    if any(r.get("scorer") for entry in results["tasks"].values() for r in entry["rounds"]):
        lines += ["", scorer_table(results)]
    lines += ["", "| round | task | traffic (corrected, rated) | plan | outcome | training s | gate s | shadow s | flip s | peak GB "
              "| gate difference [95%] n |",
              "|---:|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for entry in results["rounds"]:
        for t, e in entry["tasks"].items():
            seconds, decision = e.get("seconds") or {}, e.get("decision") or {}
            plan = trained(e)
            diff = "-"
            if decision:
                early = f" of {decision['planned']}" if decision.get("planned", decision["n"]) > decision["n"] else ""  # a look stopped it
                diff = f"{decision['difference']:+.3f} [{decision['interval'][0]:+.3f}, {decision['interval'][1]:+.3f}] n={decision['n']}{early}"
                if decision.get("alone"):  # judged again without the examples (trainer/gate.py's `serve_alone`)
                    alone = decision["alone"]
                    diff += (f"; alone {alone['difference']:+.3f} [{alone['interval'][0]:+.3f}, {alone['interval'][1]:+.3f}] "
                             f"n={alone['n']}{', served alone' if decision.get('served_alone') else ''}")
            traffic = e["traffic"]
            lines.append(f"| {entry['round']} | {t} | {traffic['requests']} ({traffic['corrected']}, {traffic['rated']}) | {plan} | "
                         f"{e.get('outcome') or '-'} | {seconds.get('training', '-')} | {seconds.get('gate', '-')} | "
                         f"{seconds.get('shadow', '-')} | {seconds.get('flip', '-')} | {e.get('peak_rss_gb') or '-'} | {diff} |")
        lines.append(f"| {entry['round']} | all | | | | | | | | | round {entry['seconds']} s |")
    if any(entry.get("label_curve") for entry in results["tasks"].values()):
        lines += ["", label_curve_table(results)]
    for ablation in results.get("ablation", []):
        d = ablation["gdpo_minus_sum"]
        lines.append(f"\nGRPO ablation, {ablation['task']} ({ablation['prompts']} prompts from {ablation['start']}): sum "
                     f"{ablation['sum']['mean']:.3f}, gdpo {ablation['gdpo']['mean']:.3f}; gdpo - sum {d['mean']:+.3f} "
                     f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]")
        if "start_measured" in ablation:  # since GRPO has its own learning rate: each arm against where it started, paired
            lines += ["", f"| {ablation['task']}: GRPO arm | learning rate | steps | held-out reward | gain over {ablation['start']} [95%] |",
                      "|---|---:|---:|---:|---|"]
            for arm, _ in ABLATION_ARMS:
                a, g = ablation[arm], ablation[arm]["gain_over_start"]
                lines.append(f"| {arm} | {a['learning_rate']:g} | {a['steps']} | {a['mean']:.3f} | "
                             f"{g['mean']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] |")
    if results.get("canary"):
        c = results["canary"]
        lines.append(f"\ncanary of {c['version']} ({c['task']}, half the traffic): {c['outcome']} after {c['requests']} requests "
                     f"in {c['seconds']} s ({c['reason']})")
    for task, line in labels_per_gain(results).items():
        lines.append(f"\n{task}: {line}")
    s = results["settings"]
    lines.append(f"\n{s['rounds']} rounds of {s['requests']} requests per task, {s['correction_rate']:.0%} corrected, "
                 f"{s['rating_rate']:.0%} rated; served reward on the test split (never sent as traffic, never in the bootstrap) "
                 f"({s['measure_rows']}), fixed seed per row, 95% intervals by bootstrap over rows (gains paired by row).")
    return "\n".join(lines)


def scorer_table(results: dict) -> str:
    """Per task and round, the served score against the references on the version's held-out answers."""
    lines = ["The served (reference-free) score against the references, on each version's held-out answers (target: "
             "rank correlation at least 0.7 on each structured task):", "",
             "| task | round | version | rank correlation [95%] | answers tied at one served score | over every sample of the groups [95%] (samples) "
             "| within a group, mean [95%] (groups ranked) | served score mean | reference-scored mean |",
             "|---|---:|---|---|---:|---|---|---:|---:|"]

    def shown(value: float | None, ci95: list | None) -> str:
        return "-" if value is None else f"{value:.3f}" + (
            " (no interval: undefined in too many resamples)" if ci95 is None else f" [{ci95[0]:.3f}, {ci95[1]:.3f}]")

    for t, entry in results["tasks"].items():
        for r in entry["rounds"]:
            check = r.get("scorer")
            if not check:
                continue
            groups = check.get("over_samples")
            over = "-" if not groups else f"{shown(groups['rank_correlation'], groups['ci95'])} ({groups['samples']})"
            within = (groups or {}).get("within_group")
            inside = "-" if not within else f"{shown(within['mean'], within['ci95'])} ({within['groups']})"
            lines.append(f"| {t} | {r['round']} | {r['version']} | {shown(check['rank_correlation'], check['ci95'])} | {check['tied']} of {check['n']} "
                         f"| {over} | {inside} "
                         f"| {check['served_mean']:.3f} | {r['mean']:.3f} |")
    return "\n".join(lines)


def as_served_table(results: dict) -> str:
    """What a user gets after each round: the active version as the gateway serves it, with the
    team's examples in its prompts or alone where its gate chose so (marked "alone"), against the
    model before any round. The main table measures the versions alone."""
    rounds = len(results["rounds"])
    lines = ["| task, as served (with the team's examples, or alone) | " + " | ".join(f"round {r}" for r in range(1, rounds + 1))
             + " | gain over round 0 after the last round [95%] |", "|---|" + "---:|" * rounds + "---:|"]
    for t, entry in results["tasks"].items():
        served = [r["as_served"] for r in entry["rounds"] if "as_served" in r]
        if not served:
            continue
        gain = served[-1]["gain"]
        lines.append(f"| {t} | " + " | ".join(f"{s['mean']:.3f}" + ("" if s.get("examples", True) else " alone") for s in served)
                     + f" | {gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] |")
    return "\n".join(lines)


def labels_per_point(labels: int, gain: float) -> float:
    """The labels each +0.01 of held-out reward cost (a positive `gain`)."""
    return labels / (gain * 100)


def labels_per_gain(results: dict) -> dict[str, str]:
    """Per task, the labels the team gave (corrections and ratings, every round) and how many of
    them each +0.01 of served reward on the held-out rows cost: what `--label-choice` compares."""
    out = {}
    for task, entry in results["tasks"].items():
        given = sum(r["tasks"][task]["traffic"]["corrected"] + r["tasks"][task]["traffic"]["rated"] for r in results["rounds"]
                    if task in r["tasks"])
        gain = entry.get("gain", {}).get("mean")
        if not given or gain is None:
            continue
        cost = f"{labels_per_point(given, gain):.1f} labels per +0.01" if gain > 0 else "no gain"
        out[task] = f"{given} labels chosen by {results['settings'].get('label_choice', 'random')}, gain {gain:+.3f}: {cost}"
    return out


TARGETS = {"gain": 0.10, "sql_execution_match": 0.15, "loop_share": 0.5, "round_seconds": 300.0,
           "traffic_gain": 0.05, "traffic_tasks": 2, "pleasing_gap": 0.05, "rank_correlation": 0.7}
STRUCTURED = ("extraction", "sql", "push")


def targets(results: dict) -> list[dict]:
    """Issue 24's learning targets, each as measured in this run: met or missed, with the figure."""
    out = []
    for t, entry in results["tasks"].items():
        gain = entry["gain"]
        if t in STRUCTURED:
            out.append({"target": f"{t}: served reward +{TARGETS['gain']:.2f} after the rounds, interval above 0",
                        "measured": f"{gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}]",
                        "met": gain["mean"] >= TARGETS["gain"] and gain["ci95"][0] > 0})
            served = entry["rounds"][-1].get("as_served")
            if served:
                g = served["gain"]
                out.append({"target": f"{t}: as served +{TARGETS['gain']:.2f} after the rounds, interval above 0",
                            "measured": f"{g['mean']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]",
                            "met": g["mean"] >= TARGETS["gain"] and g["ci95"][0] > 0})
        oracle = entry.get("oracle")
        if oracle and oracle["gain"]["mean"] > 0:
            out.append({"target": f"{t}: the loop reaches {TARGETS['loop_share']} of the oracle's gain",
                        "measured": f"{oracle['loop_share']} ({gain['mean']:+.3f} of {oracle['gain']['mean']:+.3f})",
                        "met": (oracle["loop_share"] or 0) >= TARGETS["loop_share"]})
        for measurement in entry["rounds"]:
            against = measurement.get("against_previous")
            if against:
                out.append({"target": f"{t}: {measurement['version']} no worse than {against['previous']} (round {measurement['round']})",
                            "measured": f"{against['mean']:+.3f} [{against['ci95'][0]:+.3f}, {against['ci95'][1]:+.3f}]",
                            "met": against["ci95"][1] >= 0})
    for t in (t for t in results["tasks"] if TRAITS[t].runs_sql):
        rounds = results["tasks"][t]["rounds"]
        rise = rounds[-1]["components"].get("execution_match", 0.0) - rounds[0]["components"].get("execution_match", 0.0)
        out.append({"target": f"{t}: execution match on held-out rows +{TARGETS['sql_execution_match']:.2f}",
                    "measured": f"{rise:+.3f}", "met": rise >= TARGETS["sql_execution_match"]})
    for entry in results["rounds"]:
        out.append({"target": f"round {entry['round']} under {TARGETS['round_seconds']:.0f} s", "measured": f"{entry['seconds']} s",
                    "met": entry["seconds"] < TARGETS["round_seconds"]})
    return out + traffic_targets(results)


def traffic_targets(results: dict) -> list[dict]:
    """Issue 64's targets of learning from traffic alone (a run with no corrections and no ratings):
    +0.05 on at least two structured tasks with the interval above 0, no task lower, the
    reference-free gain at most 0.05 above the reference-scored one (the policy did not learn to
    please the scorer), and the served score's rank correlation with the references at least 0.7
    on every structured task's measured versions."""
    s = results.get("settings") or {}
    if s.get("correction_rate", 1) or s.get("rating_rate", 1):
        return []
    out, gaining = [], []
    for t, entry in results["tasks"].items():
        gain, rounds = entry["gain"], entry["rounds"]
        if t in STRUCTURED and gain["mean"] >= TARGETS["traffic_gain"] and gain["ci95"][0] > 0:
            gaining.append(t)
        out.append({"target": f"{t}: not lower after the rounds from traffic alone", "met": gain["ci95"][1] >= 0,
                    "measured": f"{gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}]"})
        first, last = rounds[0].get("scorer"), rounds[-1].get("scorer")
        if first and last:
            free_gain = last["served_mean"] - first["served_mean"]
            own = (f"; the part only a reference scores ({', '.join(last['reference_only'])}) "
                   f"{last['reference_only_mean'] - first['reference_only_mean']:+.3f}"
                   if "reference_only_mean" in first and "reference_only_mean" in last else "")
            out.append({"target": f"{t}: reference-free gain at most {TARGETS['pleasing_gap']:.2f} above the reference-scored gain",
                        "measured": f"{free_gain:+.3f} against {gain['mean']:+.3f}{own}",
                        "met": free_gain - gain["mean"] <= TARGETS["pleasing_gap"]})
        rhos = [r["scorer"]["rank_correlation"] for r in rounds if r.get("scorer")]
        if t in STRUCTURED and rhos:
            out.append({"target": f"{t}: the served score's rank correlation with the references at least {TARGETS['rank_correlation']}",
                        "measured": ", ".join("-" if rho is None else f"{rho:.2f}" for rho in rhos),
                        "met": all(rho is not None and rho >= TARGETS["rank_correlation"] for rho in rhos)})
    out.append({"target": f"from traffic alone: +{TARGETS['traffic_gain']:.2f} with the interval above 0 on at least "
                          f"{TARGETS['traffic_tasks']} structured tasks", "measured": ", ".join(gaining) or "none",
                "met": len(gaining) >= TARGETS["traffic_tasks"]})
    return out


def targets_table(results: dict) -> str:
    lines = ["| target | measured | |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {'met' if t['met'] else 'missed'} |" for t in targets(results)]
    return "\n".join(lines)


def components_table(results: dict) -> str:
    """Per task, each component's mean on the held-out rows before any round, after the last, and for the oracle."""
    lines = ["| task | component | before | after the last round | oracle |", "|---|---|---:|---:|---:|"]
    for t, entry in results["tasks"].items():
        before, after = entry["rounds"][0].get("components", {}), entry["rounds"][-1].get("components", {})
        oracle = (entry.get("oracle") or {}).get("components", {})
        for name in sorted(set(before) | set(after)):
            cells = [f"{c[name]:.3f}" if name in c else "-" for c in (before, after, oracle)]
            lines.append(f"| {t} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def label_curve_table(results: dict) -> str:
    """Per task, SFT from the base model on the first K requests' references: reward and gain on the held-out rows."""
    lines = ["| task | references | served reward [95%] | gain [95%] | components |", "|---|---:|---|---|---|"]
    for t, entry in results["tasks"].items():
        for point in entry.get("label_curve", []):
            gain = point["gain"]
            parts = ", ".join(f"{name} {value:.2f}" for name, value in sorted(point.get("components", {}).items()))
            lines.append(f"| {t} | {point['labels']} | {point['mean']:.3f} [{point['ci95'][0]:.3f}, {point['ci95'][1]:.3f}] | "
                         f"{gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] | {parts} |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for t, entry in results["tasks"].items():
        xs = [r["round"] for r in entry["rounds"]]
        means = [r["mean"] for r in entry["rounds"]]
        errors = [[m - r["ci95"][0] for m, r in zip(means, entry["rounds"])], [r["ci95"][1] - m for m, r in zip(means, entry["rounds"])]]
        line = axis.errorbar(xs, means, yerr=errors, marker="o", capsize=3, label=t)
        if entry.get("oracle"):
            axis.axhline(entry["oracle"]["mean"], linestyle="--", color=line[0].get_color(), alpha=0.6)
    axis.set_xlabel("round")
    axis.set_ylabel("served reward on held-out rows")
    axis.set_title("tucano bench learn (dashed: oracle)")
    axis.set_xticks(range(len(results["rounds"]) + 1))
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
