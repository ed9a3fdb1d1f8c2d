"""`tucano bench samples`: what best-of-n buys a user, and what it costs, side by side.

Against the real stack (vLLM engines, the gateway, an embedded Valkey, all throwaway, as `bench
learn` builds them), each held-out test row of a task (never sent as traffic, never in the demo
model's bootstrap) is sent through the gateway once per arm: `options.samples` 1 (the task's
serving sampling: greedy for extraction and SQL) and each larger n asked for (one engine request
with vLLM's `n`, at the task's group temperature unless `--temperature` says otherwise). An arm
`n/K` (`--first-finished K`) answers from the first K of its n samples to finish and cuts the
rest (`options.first_finished`); an arm `n` waits for all n. The gateway answers with its best
sample by the served score: no reference is sent, so the choice is what a user's request gets.
The answer is then scored against the row's reference.

Reported per task and arm: the mean reference-scored reward with its 95% interval, the gain over
`samples` 1 paired by row, how often the samples of a group disagreed (their served scores not
all equal), and the p95 latency, one request at a time in blocks the arms take in turn (who goes
first rotates), with its ratio to `samples` 1 and a 95% interval over resampled blocks. The
target (issue: best of n): the reward higher with the interval above 0, and a p95 ratio of at
most `LATENCY_TARGET`, interval included.
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.learn import interval, post_as_a_client, start_stack
from common.datasets import load_split
from common.settings import Settings
from common.stats import block_interval, percentile
from tasks import definition, score, typed_input

LATENCY_TARGET = 1.5  # p95 at n over p95 at n=1
BLOCK = 5  # requests per block


def arm_name(n: int, first_finished: int) -> str:
    """An arm's key: its samples, and `/K` where it answers from the first K to finish."""
    return f"{n}/{first_finished}" if first_finished else str(n)


def arm_options(arm: str) -> dict:
    n, _, first_finished = arm.partition("/")
    return {"samples": int(n), **({"first_finished": int(first_finished or 0)} if int(n) > 1 else {})}


async def answers(url: str, task: str, rows: list[dict], arms: list[str], temperature: float | None, seed: int) -> dict[str, list[list[dict]]]:
    """Per arm, per block, each row's answer and seconds; one request at a time."""
    blocks: dict[str, list[list[dict]]] = {arm: [] for arm in arms}
    unavailable: list[str] = []
    async with httpx.AsyncClient(timeout=900) as client:
        for number, first in enumerate(range(0, len(rows), BLOCK)):
            order = arms[number % len(arms):] + arms[:number % len(arms)]
            for n in order:
                timed = []
                for i, row in enumerate(rows[first:first + BLOCK]):
                    options = {**arm_options(n), "seed": seed + first + i}
                    if options["samples"] > 1 and temperature is not None:
                        options["temperature"] = temperature
                    started = time.perf_counter()
                    answer = await post_as_a_client(client, f"{url}/v1/tasks/{task}", {"input": row["input"], "options": options},
                                                    unavailable)
                    timed.append({"seconds": time.perf_counter() - started, "raw": answer["raw"], "sample": answer.get("sample"),
                                  "completion_tokens": answer["usage"]["completion_tokens"]})
                blocks[n].append(timed)
    return blocks


def measure(settings: Settings, task: str, rows: list[dict], blocks: dict[str, list[list[dict]]]) -> dict:
    arms = list(blocks)
    rewards = {n: [score(task, a["raw"], row["reference"], settings.reward_context(typed_input(task, row["input"]))).total
                   for a, row in zip([a for b in blocks[n] for a in b], rows)] for n in arms}

    def p95(side_blocks) -> float:
        return percentile([a["seconds"] for b in side_blocks for a in b], 0.95)

    out: dict = {}
    for n in arms:
        flat = [a for b in blocks[n] for a in b]
        entry = {"reward": interval(rewards[n]), "p95_s": round(p95(blocks[n]), 3),
                 "completion_tokens_mean": round(statistics.fmean(a["completion_tokens"] for a in flat), 1)}
        if n != arms[0]:
            entry["gain"] = interval([a - b for a, b in zip(rewards[n], rewards[arms[0]])])
            entry["groups_disagreeing"] = round(sum(1 for a in flat if a["sample"] and len(set(a["sample"]["totals"])) > 1) / len(flat), 3)
            entry["cut_mean"] = round(statistics.fmean((a["sample"] or {}).get("cut", 0) for a in flat), 2)
            pairs = list(zip(blocks[n], blocks[arms[0]]))
            ratio = p95(blocks[n]) / p95(blocks[arms[0]])
            low, high = block_interval(pairs, lambda chosen: p95([a for a, _ in chosen]) / p95([b for _, b in chosen]))
            entry["p95_ratio"] = {"ratio": round(ratio, 3), "ci95": [round(low, 3), round(high, 3)],
                                  "verdict": "met" if high <= LATENCY_TARGET else "missed" if low > LATENCY_TARGET else "undecided"}
            gain = entry["gain"]
            entry["reward_verdict"] = "higher" if gain["ci95"][0] > 0 else "lower" if gain["ci95"][1] < 0 else "undecided"
        out[n] = entry
    return out


def arms_of(sizes: list[int], first_finished: list[int] | None = None) -> list[str]:
    """The arms: one sample, then per group size n each K of `first_finished` (0: wait for all n;
    default [0]); ValueError for a K that is no choice (1) or not fewer than n."""
    bad = sorted({(n, k) for n in sizes for k in first_finished or [0] if k == 1 or (k and k >= n)})
    if bad:
        raise ValueError(f"first finished {', '.join(f'{k} of {n}' for n, k in bad)}: K must be 0 (wait for all) or 2 to "
                         "one fewer than the group's samples")
    return ["1", *(arm_name(n, k) for n in sorted(set(sizes)) for k in sorted(set(first_finished or [0])))]


def run(settings: Settings, tasks: tuple[str, ...], sizes: list[int], measure_rows: int, temperature: float | None, say=print,
        first_finished: list[int] | None = None) -> dict:
    """`sizes`: the group sizes beside one sample; `first_finished`: for each, the arms that answer
    from the first K samples to finish (`arms_of`)."""
    arms = arms_of(sizes, first_finished)
    results: dict = {"settings": {"arms": arms, "measure_rows": measure_rows, "temperature": temperature,
                                  "group_temperatures": {t: definition(t).group_temperature for t in tasks}}, "tasks": {}}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-samples-")))
        bench, _store, _fleet, url = start_stack(settings, scratch, stack, say,
                                                 gateway_env={"TUCANO_SERVE_SAMPLES_CAP": str(max(8, *sizes))})
        for task in tasks:
            rows = load_split(settings.datasets_dir, task, "test")[:measure_rows]
            started = time.perf_counter()
            blocks = asyncio.run(answers(url, task, rows, arms, temperature, settings.seed))
            results["tasks"][task] = {**measure(bench, task, rows, blocks), "seconds": round(time.perf_counter() - started, 1)}
            say(f"{task}: " + "; ".join(f"n={n} {e['reward']['mean']:.3f}" + (f" ({e['gain']['mean']:+.3f} {e['gain']['ci95']}, p95 x"
                                                                               f"{e['p95_ratio']['ratio']})" if "gain" in e else "")
                                        for n, e in results["tasks"][task].items() if n != "seconds"))
    return results


def table(results: dict) -> str:
    lines = [f"| task | samples (/K: the first K finished) | reward with references [95%] | gain over 1 [95%] | groups disagreeing "
             f"| samples cut | p95 (s) | p95 ratio [95%], target <= {LATENCY_TARGET} | completion tokens |",
             "|---|---:|---|---|---:|---:|---:|---|---:|"]
    for task, entry in results["tasks"].items():
        for n, arm in entry.items():
            if n == "seconds":
                continue
            r = arm["reward"]
            gain = arm.get("gain")
            ratio = arm.get("p95_ratio")
            lines.append(f"| {task} | {n} | {r['mean']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | "
                         + (f"{gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] ({arm['reward_verdict']})" if gain else "-")
                         + f" | {arm.get('groups_disagreeing', '-')} | {arm.get('cut_mean', '-')} | {arm['p95_s']:.2f} | "
                         + (f"{ratio['ratio']:.2f} [{ratio['ci95'][0]:.2f}, {ratio['ci95'][1]:.2f}] ({ratio['verdict']})" if ratio else "-")
                         + f" | {arm['completion_tokens_mean']:.0f} |")
    return "\n".join(lines)
