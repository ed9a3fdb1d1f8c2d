"""Shadow replay: before a candidate that passed the gate is promoted, it answers recent real
inputs of its task (the newest distinct ones, unlabelled), and its reference-free reward is
compared, input by input, with that of what the incumbent actually served for them (re-scored
by the current rewards). A candidate worse on live inputs is rejected even if it won on the eval
set: the eval set may not look like this team's traffic.

Where the team has labelled enough of those inputs in its eval share (`MIN_LABELLED` recent inputs
whose label holds a reference or correction, never trained on), the replay is of those, and both
answers are scored against the label: the served score is trusted only where nothing better is.

The candidate answers as the input was served: with the record's sampling, and where the record
was a group (best of n), with a group of as many samples, of which the served score picks the
answer (`gate.served_answer`), as the incumbent's was picked. Where the task's prompts show the team's examples,
each prompt shows the examples serving would show it now (`demonstrations`), as the gate's
do, unless its gate chose to serve it alone (the round then passes no store). Asked without
them, a candidate served with them was compared with answers that had them.
"""
from __future__ import annotations

import asyncio
import time

from common.datasets import input_hash, input_key
from common.records import Record
from common.rounds import ShadowReplay
from common.settings import Settings
from common.stats import mean_interval
from router.engine_client import EnginePool
from router.prompts import build_messages
from tasks import definition, score, typed_input
from trainer.gate import CONCURRENCY, demonstrations, served_answer

MIN_LABELLED = 10


def eval_labels(store, task: str) -> dict[str, object]:
    """input hash -> the answer of each of the team's eval-split labels that has one."""
    return {label.input_hash: label.answer for label in store.labels(task) if label.split == "eval" and label.answer is not None}


def choose(task: str, records: list[Record], excluded: frozenset[str], count: int, labels: dict[str, object]
           ) -> tuple[list[Record], dict[str, object]]:
    """The recent inputs to replay and the labels to score them by: the labelled ones where there
    are at least `MIN_LABELLED`, else the newest distinct ones (no labels)."""
    recent = distinct_recent(records, excluded, len(records))
    labelled = [r for r in recent if input_hash(task, r.input) in labels][:count]
    if len(labelled) >= MIN_LABELLED:
        return labelled, labels
    return recent[:count], {}


def distinct_recent(records: list[Record], excluded: frozenset[str], count: int) -> list[Record]:
    out, seen = [], set()
    for record in records:
        key = input_key(record.input)
        if key in seen or key in excluded or record.answered_from:  # a correction answered it: no model's answer to compare
            continue
        seen.add(key)
        out.append(record)
        if len(out) == count:
            break
    return out


async def replay(pool: EnginePool, settings: Settings, task: str, candidate: str, records: list[Record], seed: int,
                 labels: dict[str, object] | None = None, store=None) -> ShadowReplay:
    """The candidate against what was served, input by input; scored against `labels` (input hash ->
    answer) where given, else reference-free. With `store`, each prompt shows the examples serving
    would show it (`demonstrations`)."""
    labels = labels or {}
    started = time.perf_counter()
    spec = definition(task)
    gate = asyncio.Semaphore(CONCURRENCY)
    inputs = {record.id: typed_input(task, record.input) for record in records}
    shown = demonstrations(settings, store, task, inputs)

    async def one(record: Record) -> float:
        task_input = inputs[record.id]
        prompt = pool.template.render(build_messages(task, task_input, shown.get(record.id, ())))
        served = record.sampling
        sampling = spec.sampling.override(temperature=served.temperature, top_p=served.top_p,
                                          seed=served.seed if served.seed is not None else seed,
                                          frequency_penalty=served.frequency_penalty, n=served.n, first_finished=served.first_finished)
        context, reference = settings.reward_context(task_input), labels.get(input_hash(task, record.input))
        async with gate:
            text = await served_answer(pool, task, candidate, prompt, sampling, context)
        return score(task, text, reference, context).total - score(task, record.raw, reference, context).total

    diffs = await asyncio.gather(*(one(r) for r in records))
    mean, low, high = mean_interval(list(diffs), seed=seed)
    worse = bool(diffs) and high < -settings.shadow_margin
    basis = "reward by the team's labels" if labels else "reference-free reward"
    return ShadowReplay(n=len(diffs), difference=round(mean, 4), interval=(round(low, 4), round(high, 4)), worse=worse,
                        basis=basis, served_versions=sorted({r.version for r in records}), seconds=round(time.perf_counter() - started, 2),
                        reason=(f"on {len(diffs)} recent inputs the candidate's {basis} differs by {mean:+.4f}, "
                                f"95% interval [{low:+.4f}, {high:+.4f}]" + (f": worse beyond {settings.shadow_margin}" if worse else "")))
