"""`tucano bench rewards`: scores per second per task on one core.

The workload is each task's eval split: the reference answer and three realistic variants
(wrapped in think/fences, truncated, one field wrong), scored with their references, as a
training round scores them. Scoring runs in passes over that workload until the time is up;
the rate is the best pass's (as timeit takes the fastest run: on a shared machine noise only
ever slows a pass down), with the median pass beside it.
"""
from __future__ import annotations

import json
import os
import statistics
import time

from common.datasets import load_split
from common.settings import Settings
from rewards.text import clear_caches
from tasks import OUTPUT_MODELS, TASKS, score, typed_input

TARGETS = {"extraction": 20_000, "push": 20_000, "sql": None, "sql_simple": 1_000, "insights": None}


def is_simple(sql: str) -> bool:
    """One table, no join or subquery: the queries the SQL target is stated for."""
    upper = sql.upper()
    return " JOIN " not in upper and upper.count("SELECT") == 1 and "ORDERS_ENRICHED" not in upper


def _variants(row: dict) -> list[str]:
    target = row["target"]
    variants = [target, f"<think>\nok\n</think>\n```\n{target}\n```", target[: len(target) // 2]]
    if row["task"] in OUTPUT_MODELS:  # a JSON answer: one field made wrong
        value = json.loads(target)
        key = next(iter(value))
        value[key] = "errado"
        variants.append(json.dumps(value, ensure_ascii=False))
    else:
        variants.append(target.replace("2", "3", 1))
    return variants


def run(settings: Settings, seconds_per_task: float = 3.0) -> dict:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    results = {}
    for name in (*TASKS[:2], "sql_simple", *TASKS[2:]):
        task = "sql" if name == "sql_simple" else name
        rows = load_split(settings.datasets_dir, task, "eval")
        if name == "sql_simple":
            rows = [r for r in rows if is_simple(r["reference"]["sql"])]
        work = [(v, r["reference"], settings.reward_context(typed_input(task, r["input"]))) for r in rows for v in _variants(r)]
        for completion, reference, context in work:  # warm-up: imports, reference results, connections
            score(task, completion, reference, context)
        rates, started = [], time.perf_counter()
        while len(rates) < 3 or time.perf_counter() - started < seconds_per_task:
            clear_caches()  # each pass sees its texts for the first time
            pass_started = time.perf_counter()
            for completion, reference, context in work:
                score(task, completion, reference, context)
            rates.append(len(work) / (time.perf_counter() - pass_started))
        best, median = max(rates), statistics.median(rates)
        target = TARGETS[name]
        results[name] = {"scores_per_s": round(best), "median_scores_per_s": round(median), "passes": len(rates),
                         "target_per_s": target, "meets_target": None if target is None else best >= target,
                         "distinct_inputs": len(work)}
    return results


def table(results: dict) -> str:
    lines = ["| task | scores/s (one core, best pass) | median pass | target | met |", "|---|---:|---:|---:|---|"]
    for task, r in results.items():
        met = "n/a" if r["meets_target"] is None else ("yes" if r["meets_target"] else "NO")
        lines.append(f"| {task} | {r['scores_per_s']:,} | {r['median_scores_per_s']:,} | {r['target_per_s'] or '-'} | {met} |")
    return "\n".join(lines)
