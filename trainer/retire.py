"""Retiring the examples a promoted adapter has absorbed, so that prompts stay short as the
adapters learn (router/examples.py). An example is absorbed when the version that now serves
its task trained on it and, asked its input without any demonstration, answers it right: scored
against the label's answer at least `ABSORBED`. The label stays a label (rounds still train and
gate on it); retrieval no longer shows it.

A version its gate judged with and without the examples and chose to serve with them
(`AdapterMeta.shows_examples`) retires none: it was judged with the examples retrieval showed
then, and retiring some would serve it prompts it was never judged on (run 30: extraction's
versions, promoted with the examples and then shown fewer, fell below the base model as
served). A version served alone, one judged only one way (`TUCANO_SERVE_ALONE` off, or a task
whose prompts show no examples), or one promoted by hand without a gate, retires what it
absorbed; the next gate judges with what remains.
"""
from __future__ import annotations

import asyncio

from common.records import AdapterMeta, Label
from common.rounds import Retirement
from common.settings import Settings
from router.engine_client import EnginePool, EngineUnavailable
from router.prompts import build_messages
from tasks import definition, score, typed_input
from trainer.gate import CONCURRENCY, row_seed

ABSORBED = 0.9
MOST = 64  # labels checked after one promotion, the newest first: a bounded cost per round


def candidates(labels: list[Label], trained: set[str]) -> list[Label]:
    """The labels the version trained on that retrieval may still show: with an answer, not yet retired."""
    chosen = [label for label in labels if label.id in trained and label.answer is not None and label.retired_by is None]
    return sorted(chosen, key=lambda label: label.updated or label.time, reverse=True)[:MOST]


async def absorbed(pool: EnginePool, settings: Settings, task: str, version: str, labels: list[Label], seed: int) -> list[str]:
    """The ids of the labels that `version` answers right on its own."""
    spec, gate = definition(task), asyncio.Semaphore(CONCURRENCY)

    async def right(label: Label) -> bool:
        task_input = typed_input(task, label.input)
        prompt = pool.template.render(build_messages(task, task_input))
        async with gate:
            completion = await pool.complete(prompt, version, spec.sampling.override(seed=row_seed(seed, label.id)), spec.json_schema)
        return score(task, completion.text, label.answer, settings.reward_context(task_input)).total >= ABSORBED

    verdicts = await asyncio.gather(*(right(label) for label in labels))
    return [label.id for label, ok in zip(labels, verdicts) if ok]


async def retire_absorbed(pool: EnginePool, settings: Settings, store, task: str, version: str, trained: set[str], seed: int) -> Retirement:
    checked = candidates(store.labels(task), trained)
    ids = await absorbed(pool, settings, task, version, checked, seed) if checked else []
    retired = store.retire_labels(task, ids, version) if ids else 0
    return Retirement(checked=len(checked), retired=retired,
                      reason=f"{retired} of the {len(checked)} examples it trained on are answered right (>= {ABSORBED}) without them")


def trained_labels(meta: AdapterMeta) -> set[str]:
    """The label and record ids a version's supervised, preference and KTO examples came from."""
    if meta.data is None:
        return set()
    sources = meta.data.sources
    return set(sources.sft) | set(sources.pairs) | set(sources.kto)


def chose_examples(meta: AdapterMeta) -> bool:
    """Whether its gate judged it with and without the examples and chose to serve it with them."""
    decision = meta.gate.decision if meta.gate is not None else None
    return decision is not None and decision.alone is not None and not decision.served_alone


async def retire_after_promotion(settings: Settings, store, urls: list[str], meta: AdapterMeta, seed: int) -> Retirement:
    """What a promotion retires, by whichever path it came (the round's own, or a canary's
    verdict, or by hand): the examples `meta` trained on and answers right on its own, unless its
    gate judged it with the examples it is served with (module docstring). After the flip: an
    engine that fails here retires nothing, and the promotion stands."""
    if chose_examples(meta):
        return Retirement(checked=0, retired=0, reason="its gate judged it with the examples it is served with: none is retired")
    trained = trained_labels(meta)
    if not trained:
        return Retirement(checked=0, retired=0, reason="it trained on no labelled example")
    pool = EnginePool.for_task(settings, meta.task, urls)
    try:
        await pool.check()  # a new pool knows no engine's health yet: without a probe every engine counts as down
        return await retire_absorbed(pool, settings, store, meta.task, meta.version, trained, seed)
    except EngineUnavailable as error:
        return Retirement(checked=0, retired=0, reason=f"not checked: {error}")
    finally:
        await pool.close()
