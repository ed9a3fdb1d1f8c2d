"""Retiring the examples a promoted adapter has absorbed, so that prompts stay short as the
adapters learn (router/examples.py). An example is absorbed when the version that now serves
its task trained on it and, asked its input without any demonstration, answers it right: scored
against the label's answer at least `ABSORBED`. The label stays a label (rounds still train and
gate on it); retrieval no longer shows it.
"""
from __future__ import annotations

import asyncio

from common.records import Label
from common.settings import Settings
from rewards import score
from router.engine_client import EnginePool
from router.prompts import build_messages
from router.registry import REGISTRY
from trainer.gate import CONCURRENCY, row_seed

ABSORBED = 0.9
MOST = 64  # labels checked after one promotion, the newest first: a bounded cost per round


def candidates(labels: list[Label], trained: set[str]) -> list[Label]:
    """The labels the version trained on that retrieval may still show: with an answer, not yet retired."""
    chosen = [label for label in labels if label.id in trained and label.answer is not None and label.retired_by is None]
    return sorted(chosen, key=lambda label: label.updated or label.time, reverse=True)[:MOST]


async def absorbed(pool: EnginePool, settings: Settings, task: str, version: str, labels: list[Label], seed: int) -> list[str]:
    """The ids of the labels that `version` answers right on its own."""
    spec, gate = REGISTRY[task], asyncio.Semaphore(CONCURRENCY)

    async def right(label: Label) -> bool:
        prompt = pool.template.render(build_messages(task, label.input))
        async with gate:
            completion = await pool.complete(prompt, version, spec.sampling.override(seed=row_seed(seed, label.id)), spec.json_schema)
        return score(task, completion.text, label.answer, settings.reward_context(label.input)).total >= ABSORBED

    verdicts = await asyncio.gather(*(right(label) for label in labels))
    return [label.id for label, ok in zip(labels, verdicts) if ok]


async def retire_absorbed(pool: EnginePool, settings: Settings, store, task: str, version: str, trained: set[str], seed: int) -> dict:
    checked = candidates(store.labels(task), trained)
    ids = await absorbed(pool, settings, task, version, checked, seed) if checked else []
    retired = store.retire_labels(task, ids, version) if ids else 0
    return {"checked": len(checked), "retired": retired,
            "reason": f"{retired} of the {len(checked)} examples it trained on are answered right (>= {ABSORBED}) without them"}
