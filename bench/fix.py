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
- **examples in training**, side by side, before the round: two candidates trained as the round
  would (its data, plan and start), from the same corrections, one on prompts that show each input
  its most similar examples as serving does (`train_with_examples`, the default) and one on bare
  prompts; each measured on the held-out rows alone and as served (with the examples), and the
  difference as served paired by row.
- **latency with examples**: after the corrections, each held-out input is sent one at a time to
  the gateway (which shows the examples) and to a second gateway on the same engines and store
  with retrieval off, in blocks the two take in turn (who goes first swapped every block): the
  p95 latency of each, their ratio with a 95% interval over resampled block pairs, and the mean
  prompt tokens. The target: a ratio of at most `LATENCY_TARGET`.
"""
from __future__ import annotations

import asyncio
import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import msgspec

from bench.learn import bench_env, interval, measured, paired_gain, post_as_a_client, served_scores, set_aside, start_gateway, start_stack
from common.datasets import load_split
from common.settings import Settings
from common.stats import block_interval, percentile
from common.store import Store
from deploy.hotswap import HotSwap
from rewards import Score
from router.engine_client import ChatTemplate
from tasks import TASK_ENGINE, model_path_of, score, training_settings, typed_input
from trainer import data as round_data
from trainer import gate

STATES = ("before", "at once", "after the round", "both")
LATENCY_TARGET = 1.5  # p95 with examples over p95 without
LATENCY_BLOCK = 5  # requests per block


async def latency_blocks(urls: dict[str, str], task: str, rows: list[dict], block: int = LATENCY_BLOCK) -> dict[str, list[list[dict]]]:
    """Per side (`with`, `without` examples), per block, each request's seconds and prompt tokens;
    one request at a time, so each is its own prompt's latency, not a queue's."""
    blocks: dict[str, list[list[dict]]] = {"with": [], "without": []}
    unavailable: list[str] = []
    async with httpx.AsyncClient(timeout=600) as client:
        for number, first in enumerate(range(0, len(rows), block)):
            for side in ("with", "without") if number % 2 == 0 else ("without", "with"):
                timed = []
                for row in rows[first:first + block]:
                    started = time.perf_counter()
                    answer = await post_as_a_client(client, f"{urls[side]}/v1/tasks/{task}", {"input": row["input"]}, unavailable)
                    timed.append({"seconds": time.perf_counter() - started, "prompt_tokens": answer["usage"]["prompt_tokens"],
                                  "examples": len(answer.get("examples") or [])})
                blocks[side].append(timed)
    return blocks


def latency(blocks: dict[str, list[list[dict]]]) -> dict:
    """p95 per side, the ratio with its block-bootstrap interval, and the verdict on the target."""
    def p95(side_blocks) -> float:
        return percentile([r["seconds"] for b in side_blocks for r in b], 0.95)

    pairs = list(zip(blocks["with"], blocks["without"]))
    ratio = p95(blocks["with"]) / p95(blocks["without"])
    low, high = block_interval(pairs, lambda chosen: p95([w for w, _ in chosen]) / p95([o for _, o in chosen]))
    verdict = "met" if high <= LATENCY_TARGET else "missed" if low > LATENCY_TARGET else "undecided"
    sides = {side: {"p95_s": round(p95(side_blocks), 3), "requests": sum(map(len, side_blocks)),
                    "prompt_tokens_mean": round(sum(r["prompt_tokens"] for b in side_blocks for r in b) / sum(map(len, side_blocks)), 1),
                    "examples_mean": round(sum(r["examples"] for b in side_blocks for r in b) / sum(map(len, side_blocks)), 2)}
             for side, side_blocks in blocks.items()}
    return {**sides, "p95_ratio": round(ratio, 3), "p95_ratio_ci95": [round(low, 3), round(high, 3)], "target": LATENCY_TARGET,
            "verdict": verdict}


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
        context = settings.reward_context(typed_input(task, row["input"]))
        if score(task, again["raw"], row["reference"], context).total > score(task, answer["raw"], row["reference"], context).total:
            seconds.append(again["at"] - at)
    better = len(seconds)
    return {"corrections": len(rows), "answered_from_correction": sum(bool(a.get("answered_from")) for a in repeats),
            "repeats_better": better, "seconds_to_better": interval(seconds) if seconds else None,
            "served_reward_before_correction": round(sum(score(task, a["raw"], r["reference"], settings.reward_context(typed_input(task, r["input"]))).total
                                                         for a, r in zip(answers, rows)) / len(rows), 4),
            "retried": len(unavailable)}


def examples_in_training(settings: Settings, store: Store, fleet: HotSwap, task: str, held_out: list[dict], before: list[Score],
                         say=print) -> dict:
    """Two candidates from the task's labels, as the round trains them (its data, plan and start),
    one on prompts that show the examples serving shows and one on bare prompts; each measured
    alone and as served. Neither is promoted: the route is left as it was."""
    from trainer import methods  # the trainers are imported where a bench trains: torch and TRL take seconds
    from trainer.candidate import train_candidate

    settings = training_settings(settings, task)
    labels = store.labels(task)
    render = ChatTemplate.load(model_path_of(settings, task)).render
    active = store.route(task).active
    active_meta = store.adapter(active) if active else None
    start_from = methods.start(settings, active_meta, model_path_of(settings, task))
    out: dict = {"start": start_from.weights}
    as_served: dict[str, list[Score]] = {}
    for arm, shown in (("with examples", round_data.served_demonstrations(settings.model_copy(update={"train_with_examples": True}),
                                                                          task, labels)),
                       ("bare prompts", round_data.no_demonstrations)):
        data = round_data.build(task, labels, [], render, settings.reward_context, gate.held_out_inputs(settings, store, task),
                                settings.seed, settings.unlabelled_prompts_per_round, settings.sft_from_liked, shown)
        steps = methods.plan(settings.train_method, data, settings)
        started = time.perf_counter()
        meta = train_candidate(settings, store, data, steps, "bench-fix", start_from.parent)
        seconds = round(time.perf_counter() - started, 1)
        asyncio.run(fleet.load(meta.version, meta.path, TASK_ENGINE[task]))
        alone = asyncio.run(served_scores(settings, fleet, task, meta.version, held_out))
        as_served[arm] = asyncio.run(served_scores(settings, fleet, task, meta.version, held_out, store))
        out[arm] = {"version": meta.version, "methods": [m for m, _ in steps], "seconds": seconds,
                    "steps": {run.method: run.steps for run in meta.training.methods},
                    "prompt_chars": round(sum(len(e.prompt) for e in data.sft) / max(1, len(data.sft))),
                    "alone": {**measured(alone), "gain": paired_gain(alone, before)},
                    "as served": {**measured(as_served[arm]), "gain": paired_gain(as_served[arm], before)}}
        set_aside(store, fleet, meta.version, task, "bench fix: one arm of a side-by-side comparison, never gated")
        say(f"{task}: trained on {arm}: alone {out[arm]['alone']['mean']}, as served {out[arm]['as served']['mean']}")
    out["as served, with minus bare"] = paired_gain(as_served["with examples"], as_served["bare prompts"])
    return out


def run(settings: Settings, tasks: tuple[str, ...], corrections: int, measure_rows: int, say=print) -> dict:
    from trainer.round import run_round

    results: dict = {"settings": {"corrections": corrections, "measure_rows": measure_rows, "examples_k": settings.examples_k},
                     "tasks": {}}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-fix-")))
        bench, store, fleet, url = start_stack(settings, scratch, stack, say, update={"examples_tasks": list(tasks)},
                                               gateway_env={"TUCANO_EXAMPLES_TASKS": json.dumps(list(tasks))})
        # the same stack with retrieval off: the latency baseline
        plain_url = start_gateway(bench, stack, "gateway-plain", {**bench_env(bench), "TUCANO_EXAMPLES_TASKS": "[]"})
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
            entry["latency"] = latency(asyncio.run(latency_blocks({"with": url, "without": plain_url}, task, held_out)))
            say(f"{task}: p95 latency with examples {entry['latency']['with']['p95_s']} s, without {entry['latency']['without']['p95_s']} s, "
                f"ratio {entry['latency']['p95_ratio']} {entry['latency']['p95_ratio_ci95']}: {entry['latency']['verdict']}")
            entry["examples in training"] = examples_in_training(bench, store, fleet, task, held_out, before, say)
            round_started = time.perf_counter()
            summary = run_round(bench, store, fleet, (task,), say=say)
            asyncio.run(fleet.unload_drained())
            time.sleep(1.0)
            version = store.route(task).active
            done = summary.tasks[task]
            entry["round"] = {"seconds": round(time.perf_counter() - round_started, 1), "outcome": str(done.outcome),
                              "version": version or "base", "retired": msgspec.to_builtins(done.retired)}
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
                     + f" | {rnd['outcome']} in {rnd['seconds']} s |")
    compared = {task: entry["examples in training"] for task, entry in results["tasks"].items() if entry.get("examples in training")}
    if compared:
        lines += ["", "Examples in training: two candidates from the same corrections and start, on prompts with the examples "
                  "serving shows and on bare prompts, measured on the held-out rows:", "",
                  "| task | trained on | steps | mean prompt chars | alone [95%] | as served [95%] |", "|---|---|---|---:|---|---|"]
    for task, arms in compared.items():
        for arm in ("with examples", "bare prompts"):
            a = arms[arm]
            lines.append(f"| {task} | {arm} ({a['version']}) | {', '.join(f'{m} {n}' for m, n in a['steps'].items())} | {a['prompt_chars']} | "
                         + " | ".join(f"{a[k]['mean']:.3f} [{a[k]['ci95'][0]:.3f}, {a[k]['ci95'][1]:.3f}]" for k in ("alone", "as served")) + " |")
        d = arms["as served, with minus bare"]
        lines.append(f"| {task} | as served, with minus bare | | | | {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] |")
    timed = {task: entry["latency"] for task, entry in results["tasks"].items() if entry.get("latency")}
    if timed:
        lines += ["", f"| task | p95 with examples (s) | p95 without (s) | ratio [95%] | target <= {LATENCY_TARGET} | prompt tokens with / without |",
                  "|---|---:|---:|---|---|---|"]
    for task, lat in timed.items():
        lines.append(f"| {task} | {lat['with']['p95_s']:.3f} | {lat['without']['p95_s']:.3f} | {lat['p95_ratio']:.2f} "
                     f"[{lat['p95_ratio_ci95'][0]:.2f}, {lat['p95_ratio_ci95'][1]:.2f}] | {lat['verdict']} | "
                     f"{lat['with']['prompt_tokens_mean']:.0f} / {lat['without']['prompt_tokens_mean']:.0f} |")
    return "\n".join(lines)
