"""`tucano bench trivial`: what the rewards pay for, side by side in one run. On each task's
holdout rows (general rows like those the demo model was fine-tuned on, which it never saw) and
its test rows (the demo store's own, whose catalogue, categories, questions and campaigns it has
never seen: the loop's headroom), it scores the references, the demo model's own answers (served by vLLM exactly as live traffic is: the route's prompt,
sampling, JSON schema and a fixed seed per row) and every answer that does no work
(`rewards.trivial`: constants, empty answers, echoes, templates), each with the row's reference
and without it (insights has none), with 95% intervals. A reward that pays a trivial answer near
a real one measures form, not work.

`--save-answers FILE` writes the model's answers to the holdout rows with the rows (the unit tier's
`tests/unit/data/demo_model_answers.jsonl`, which holds every trivial answer below them).
"""
from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from pathlib import Path

from common.datasets import load_split
from common.settings import Settings
from common.stats import mean_interval
from router.engine_client import EnginePool
from router.prompts import build_messages
from tasks import TASK_ENGINE, TASKS, TRAITS, definition, score, typed_input
from trainer.gate import CONCURRENCY, row_seed

MODEL = "the demo model (served)"
REFERENCE = "the reference answer"


async def served_answers(settings: Settings, urls: dict[str, list[str]], task: str, rows: list[dict]) -> list[str]:
    """The base model's answer to each row, as the gateway would get it (no adapter)."""
    kind = TASK_ENGINE[task]
    pool = EnginePool.for_task(settings, task, urls[kind])
    spec, gate = definition(task), asyncio.Semaphore(CONCURRENCY)

    async def one(row: dict) -> str:
        async with gate:
            completion = await pool.complete(pool.template.render(build_messages(task, typed_input(task, row["input"]))), None,
                                             spec.sampling.override(seed=row_seed(settings.seed, row["id"])), spec.json_schema)
        return completion.text

    try:
        await pool.check()
        return await asyncio.gather(*(one(row) for row in rows))
    finally:
        await pool.close()


def _summary(values: list[float]) -> dict:
    mean, low, high = mean_interval(values)
    return {"mean": round(mean, 4), "ci95": [round(low, 4), round(high, 4)], "n": len(values)}


def compare(settings: Settings, task: str, rows: list[dict], answers: list[str] | None) -> dict:
    """Every candidate answer of every row scored with and without the reference."""
    candidates = {REFERENCE: [r["target"] for r in rows]}
    if answers is not None:
        candidates[MODEL] = answers
    inputs = [typed_input(task, r["input"]) for r in rows]
    for name, make in definition(task).makers([r.get("reference") for r in rows]).items():
        candidates[name] = [make(task_input) for task_input in inputs]
    modes = ("with_reference", "without_reference") if TRAITS[task].scored_with_reference else ("without_reference",)
    out = {}
    for mode in modes:
        out[mode] = {name: _summary([score(task, c, r.get("reference") if mode == "with_reference" else None,
                                           settings.reward_context(task_input)).total for c, r, task_input in zip(texts, rows, inputs)])
                     for name, texts in candidates.items()}
    return out


SPLITS = ("holdout", "test")


def run(settings: Settings, rows_per_task: int, served: bool, save_answers: Path | None, say=print) -> dict:
    rows = {(split, t): load_split(settings.datasets_dir, t, split)[:rows_per_task] for split in SPLITS for t in TASKS}
    answers: dict[tuple[str, str], list[str]] = {}
    if served:
        from deploy.vllm_server import VllmServer, run_engines

        with ExitStack() as stack:
            servers = [VllmServer(kind, path, lora=False, device="cpu", log_dir=settings.root / "logs",
                                  cpu_precision=settings.engine_cpu_precision)
                       for kind, path in (("base", settings.base_model_path), ("think", settings.think_model_path))]
            run_engines(stack, servers, say)
            urls = {server.name: [server.url] for server in servers}
            for key, key_rows in rows.items():
                answers[key] = asyncio.run(served_answers(settings, urls, key[1], key_rows))
                say(f"{key[1]} ({key[0]}): {len(answers[key])} answers from the demo model")
    if save_answers is not None:
        save_answers.parent.mkdir(parents=True, exist_ok=True)
        with save_answers.open("w") as f:
            for task in TASKS:
                for row, text in zip(rows["holdout", task], answers.get(("holdout", task), [])):
                    f.write(json.dumps({"task": task, "id": row["id"], "input": row["input"], "reference": row.get("reference"),
                                        "completion": text}, ensure_ascii=False) + "\n")
    return {"model": settings.base_model_path,
            "splits": {split: {t: compare(settings, t, rows[split, t], answers.get((split, t))) for t in TASKS} for split in SPLITS}}


def table(results: dict) -> str:
    splits = list(results["splits"])
    lines = ["| task | answer | " + " | ".join(f"{split}: with the reference [95%] | {split}: without [95%]" for split in splits) + " |",
             "|---|---|" + "---|---|" * len(splits)]
    cell = lambda entry: f"{entry['mean']:.3f} [{entry['ci95'][0]:.3f}, {entry['ci95'][1]:.3f}]" if entry else "-"
    for task in results["splits"][splits[0]]:
        names = list(next(iter(results["splits"][splits[0]][task].values())))
        for name in names:
            cells = [cell(results["splits"][split][task].get(mode, {}).get(name)) for split in splits
                     for mode in ("with_reference", "without_reference")]
            lines.append(f"| {task} | {name} | " + " | ".join(cells) + " |")
    n = {split: {task: next(iter(next(iter(modes.values())).values()))["n"] for task, modes in tasks.items()}
         for split, tasks in results["splits"].items()}
    lines.append("\nMean reward per answer; rows per task: " + "; ".join(f"{split} " + ", ".join(f"{t} {k}" for t, k in c.items())
                                                                      for split, c in n.items())
                 + f". The demo model: {results['model']}, its answers served by vLLM with each task's sampling and a fixed seed per row.")
    return "\n".join(lines)
