"""The promotion gate's measurement: versions of a task's adapter (and the base model) scored on
the same held-out eval rows, through the same vLLM engines, prompts, sampling settings and
per-row seeds as live traffic, by the same `rewards/`. Only evaluation reads the eval split.

Policy: a candidate is promoted when its total beats the incumbent's (the active version, else
the base model) by `promote_margin` and no component drops by more than `promote_tolerance`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from common.datasets import load_split
from rewards import score
from router.engine_client import EnginePool, EngineUnavailable
from router.prompts import build_messages
from router.registry import REGISTRY

CONCURRENCY = 8


@dataclass
class EvalScores:
    version: str  # "base" for the base model
    rows: int
    total: float
    components: dict[str, float]
    completion_tokens: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


async def score_version(pool: EnginePool, settings, task: str, version: str | None) -> EvalScores:
    rows = load_split(settings.datasets_dir, task, "eval")[: settings.eval_rows_per_task]
    spec = REGISTRY[task]
    gate = asyncio.Semaphore(CONCURRENCY)
    started = time.perf_counter()

    async def one(index: int, row: dict):
        prompt = pool.template.render(build_messages(task, row["input"]))
        async with gate:
            completion = await pool.complete(prompt, version, spec.sampling.override(seed=settings.seed + index), spec.json_schema)
        scored = score(task, completion.text, row["reference"], settings.reward_context(row["input"]))
        return scored, completion.completion_tokens

    results = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
    names = sorted({name for scored, _ in results for name in scored.components})
    components = {name: round(sum(s.components.get(name, 0.0) for s, _ in results) / len(results), 4) for name in names}
    return EvalScores(version or "base", len(results), round(sum(s.total for s, _ in results) / len(results), 4), components,
                      sum(tokens for _, tokens in results), round(time.perf_counter() - started, 2))


async def evaluate(pool: EnginePool, settings, task: str, versions: list[str | None]) -> list[EvalScores]:
    if not await pool.check():
        raise EngineUnavailable(f"no healthy {pool.kind} engine to evaluate on")
    return [await score_version(pool, settings, task, version) for version in versions]


def decide(candidate: EvalScores, incumbent: EvalScores, margin: float, tolerance: float) -> tuple[bool, str]:
    gain = round(candidate.total - incumbent.total, 4)
    if gain < margin:
        return False, f"total {candidate.total} vs {incumbent.version} {incumbent.total}: gain {gain} is below the margin {margin}"
    drops = {name: round(incumbent.components[name] - value, 4) for name, value in candidate.components.items()
             if name in incumbent.components and incumbent.components[name] - value > tolerance}
    if drops:
        return False, f"components dropped beyond the tolerance {tolerance}: {drops}"
    return True, f"total {candidate.total} vs {incumbent.version} {incumbent.total} (+{gain}); no component down more than {tolerance}"


def table(task: str, scores: list[EvalScores]) -> str:
    names = sorted({n for s in scores for n in s.components})
    lines = [f"| {task} | total | " + " | ".join(names) + " | rows |", "|---|---:|" + "---:|" * len(names) + "---:|"]
    for s in scores:
        lines.append(f"| {s.version} | {s.total:.4f} | " + " | ".join(f"{s.components.get(n, 0):.4f}" for n in names) + f" | {s.rows} |")
    return "\n".join(lines)
