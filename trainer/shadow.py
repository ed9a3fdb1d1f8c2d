"""Shadow replay: before a candidate that passed the gate is promoted, it answers recent real
inputs of its task (the newest distinct ones, unlabelled), and its reference-free reward is
compared, input by input, with that of what the incumbent actually served for them (re-scored
by the current rewards). A candidate worse on live inputs is rejected even if it won on the eval
set: the eval set may not look like this team's traffic.
"""
from __future__ import annotations

import asyncio
import time

from common.datasets import input_key
from common.records import Record
from common.settings import Settings
from rewards import score
from router.engine_client import EnginePool
from router.prompts import build_messages
from router.registry import REGISTRY
from trainer.gate import CONCURRENCY, mean_interval


def distinct_recent(records: list[Record], excluded: frozenset[str], count: int) -> list[Record]:
    out, seen = [], set()
    for record in records:
        key = input_key(record.input)
        if key in seen or key in excluded:
            continue
        seen.add(key)
        out.append(record)
        if len(out) == count:
            break
    return out


async def replay(pool: EnginePool, settings: Settings, task: str, candidate: str, records: list[Record], seed: int) -> dict:
    started = time.perf_counter()
    spec = REGISTRY[task]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(record: Record) -> float:
        prompt = pool.template.render(build_messages(task, record.input))
        sampling = spec.sampling.override(temperature=record.sampling.temperature, top_p=record.sampling.top_p,
                                          seed=record.sampling.seed if record.sampling.seed is not None else seed,
                                          frequency_penalty=record.sampling.frequency_penalty)
        async with gate:
            completion = await pool.complete(prompt, candidate, sampling, spec.json_schema)
        context = settings.reward_context(record.input)
        return score(task, completion.text, None, context).total - score(task, record.raw, None, context).total

    diffs = await asyncio.gather(*(one(r) for r in records))
    mean, low, high = mean_interval(list(diffs), seed=seed)
    worse = bool(diffs) and high < -settings.shadow_margin
    return {"n": len(diffs), "difference": round(mean, 4), "interval": [round(low, 4), round(high, 4)], "worse": worse,
            "served_versions": sorted({r.version for r in records}), "seconds": round(time.perf_counter() - started, 2),
            "reason": (f"on {len(diffs)} recent inputs the candidate's reference-free reward differs by {mean:+.4f}, "
                       f"95% interval [{low:+.4f}, {high:+.4f}]" + (f": worse beyond {settings.shadow_margin}" if worse else ""))}
