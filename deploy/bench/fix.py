"""`tucano bench fix`: how soon a team's corrections change what it is served.

Per task, against the real stack (vLLM engines, the gateway, an embedded Valkey, all throwaway,
as `bench learn` builds them): the team sends `corrections` requests from the train split through
the gateway and corrects every answer with the row's reference. Then:

- **repeats**: each corrected input is sent again; the seconds from its correction to the first
  answer that scores better against the reference (an exact repeat is answered with its correction).
- **served reward on held-out rows** (the test split: never sent, never corrected), scored with
  their references, each row answered through the engines with the task's sampling and a fixed seed:
  `before` (no examples), `at once` (the prompts show the retrieved corrections, as the gateway
  would), `after the round` (the round's version, no examples) and `both` (the round's version with
  the examples left after its retirement). Gains are paired by row, with 95% intervals.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from common.datasets import load_split
from common.processes import free_port
from common.settings import Settings
from common.store import Store
from deploy.bench.learn import _engines, _env, _scratch, interval, measured, paired_gain, post_as_a_client, served_scores
from deploy.bench.stack import start, wait_ready
from deploy.embedded_redis import EmbeddedRedis
from deploy.hotswap import HotSwap
from rewards import score
from trainer.round import run_round

STATES = ("before", "at once", "after the round", "both")


async def correct_and_repeat(settings: Settings, url: str, task: str, rows: list[dict]) -> dict:
    """Send, correct each answer with its reference, then send each input again; per row, seconds
    from the correction to the repeat's answer, and whether the repeat scores better."""
    unavailable: list[str] = []
    async with httpx.AsyncClient(timeout=600) as client:
        answers = await asyncio.gather(*(post_as_a_client(client, f"{url}/v1/tasks/{task}", {"input": r["input"]}, unavailable)
                                         for r in rows))
        corrected_at = []
        for row, answer in zip(rows, answers):
            await post_as_a_client(client, f"{url}/v1/feedback", {"id": answer["id"], "rating": -1, "correction": row["reference"]},
                                   unavailable)
            corrected_at.append(time.perf_counter())
        await asyncio.sleep(settings.examples_poll_s)  # the longest a gateway takes to see a changed label
        repeats = []
        for row in rows:
            repeats.append(await post_as_a_client(client, f"{url}/v1/tasks/{task}", {"input": row["input"]}, unavailable))
            repeats[-1]["at"] = time.perf_counter()
    seconds = []  # for each repeat that scores better than the first answer did
    for row, answer, again, at in zip(rows, answers, repeats, corrected_at):
        context = settings.reward_context(row["input"])
        if score(task, again["raw"], row["reference"], context).total > score(task, answer["raw"], row["reference"], context).total:
            seconds.append(again["at"] - at)
    better = len(seconds)
    return {"corrections": len(rows), "answered_from_correction": sum(bool(a.get("answered_from")) for a in repeats),
            "repeats_better": better, "seconds_to_better": interval(seconds) if seconds else None,
            "served_reward_before_correction": round(sum(score(task, a["raw"], r["reference"], settings.reward_context(r["input"])).total
                                                         for a, r in zip(answers, rows)) / len(rows), 4),
            "retried": len(unavailable)}


def run(settings: Settings, tasks: tuple[str, ...], corrections: int, measure_rows: int, say=print) -> dict:
    results: dict = {"settings": {"corrections": corrections, "measure_rows": measure_rows, "examples_k": settings.examples_k},
                     "tasks": {}}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-fix-")))
        _scratch(settings, scratch)
        redis_url = stack.enter_context(EmbeddedRedis(scratch / "redis"))
        engines = _engines(settings, scratch, stack, say)
        urls = {kind: kind_urls for kind, (kind_urls, _) in engines.items()}
        bench = settings.model_copy(update={"data_dir": scratch, "redis_url": redis_url, "base_engine_urls": urls["base"],
                                            "think_engine_url": urls["think"][0], "train_enabled": False, "canary_share": 0.0,
                                            "examples_tasks": list(tasks)})
        store = Store(redis_url)
        store.ensure_group()
        for kind, (kind_urls, numerics) in engines.items():
            store.register_engines(kind, kind_urls, numerics)
        port = free_port()
        env = {**os.environ, **_env(bench), "TUCANO_EXAMPLES_TASKS": "[" + ", ".join(f'"{t}"' for t in tasks) + "]"}
        gateway = start(stack, "deploy.bench.stack:serve_gateway", scratch / "gateway.log", str(scratch), redis_url, urls["base"][0],
                        urls["think"][0], str(port), "1", str(scratch / "metrics"), "off", env=env)
        url = f"http://127.0.0.1:{port}"
        wait_ready(gateway, "gateway", f"{url}/readyz", scratch / "gateway.log", timeout_s=300)
        fleet = HotSwap.for_settings(store, bench, drain="later")
        for task in tasks:
            held_out = load_split(settings.datasets_dir, task, "test")[:measure_rows]
            train = load_split(settings.datasets_dir, task, "train")[:corrections]
            entry: dict = {}
            before = asyncio.run(served_scores(bench, fleet, task, None, held_out))
            entry["before"] = measured(before)
            started = time.perf_counter()
            entry["repeats"] = asyncio.run(correct_and_repeat(bench, url, task, train))
            at_once = asyncio.run(served_scores(bench, fleet, task, None, held_out, store))
            entry["at once"] = {**measured(at_once), "gain": paired_gain(at_once, before),
                                "seconds_after_first_correction": round(time.perf_counter() - started, 1)}
            say(f"{task}: before {entry['before']['mean']}, at once {entry['at once']['mean']} ({entry['at once']['gain']['mean']:+.3f})")
            round_started = time.perf_counter()
            summary = run_round(bench, store, fleet, (task,), say=say)
            asyncio.run(fleet.unload_drained())
            time.sleep(1.0)
            version = store.routes()[1].get(task, {}).get("active")
            entry["round"] = {"seconds": round(time.perf_counter() - round_started, 1), "status": summary["tasks"][task].get("status"),
                              "version": version or "base", "retired": summary["tasks"][task].get("retired")}
            after = asyncio.run(served_scores(bench, fleet, task, version, held_out))
            both = asyncio.run(served_scores(bench, fleet, task, version, held_out, store))
            entry["after the round"] = {**measured(after), "gain": paired_gain(after, before)}
            entry["both"] = {**measured(both), "gain": paired_gain(both, before)}
            say(f"{task}: after the round {entry['after the round']['mean']}, both {entry['both']['mean']}")
            results["tasks"][task] = entry
    return results


def table(results: dict) -> str:
    lines = ["| task | state | served reward [95%] | gain over before [95%] |", "|---|---|---|---|"]
    for task, entry in results["tasks"].items():
        for state in STATES:
            m = entry[state]
            gain = m.get("gain")
            lines.append(f"| {task} | {state} | {m['mean']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}] | "
                         + (f"{gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}]" if gain else "-") + " |")
    lines += ["", "| task | corrections | repeats answered from the correction | repeats better | seconds from correction to a better answer | round |",
              "|---|---:|---:|---:|---|---|"]
    for task, entry in results["tasks"].items():
        r, rnd = entry["repeats"], entry["round"]
        s = r["seconds_to_better"]
        lines.append(f"| {task} | {r['corrections']} | {r['answered_from_correction']} | {r['repeats_better']} | "
                     + (f"{s['mean']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" if s else "-")
                     + f" | {rnd['status']} in {rnd['seconds']} s |")
    return "\n".join(lines)
