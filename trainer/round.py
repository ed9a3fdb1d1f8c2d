"""A learning round, end to end: lock, read the unacknowledged records, train a candidate per
task, load it into every base engine under its own name, score candidate, active and base on
the held-out eval split, promote through the fleet only if the gate says so, and acknowledge
the records last.

The fleet (engines to load versions into, the hot-swap that flips a route) is whatever the
caller hands in as a `Fleet`: deploy/ hands its `HotSwap`, so this package never imports deploy.

One round at a time across every trainer (a Redis lock, renewed while the round runs, expiring
when its trainer dies). Anything that stops a round before its end leaves the routes as they
were and acknowledges nothing, so the next round reads the same records again.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import LockError

from common.datasets import input_key, load_split
from common.records import AdapterMeta
from common.settings import Settings
from common.store import Store
from common.tasks import TASK_ENGINE, TASKS
from router.engine_client import ChatTemplate, EnginePool
from trainer.candidate import clean_orphans, train_candidate
from trainer.data import collect
from trainer.gate import decide, evaluate, table

TRAINED_TASKS = tuple(task for task in TASKS if TASK_ENGINE[task] == "base")  # the Think model has no adapters
CONSUMER = "trainer"


class Fleet(Protocol):
    """What a round needs of the serving fleet (deploy.hotswap.HotSwap is one)."""

    def urls(self) -> list[str]: ...

    async def load(self, version: str, path: str) -> None: ...

    async def unload(self, version: str) -> None: ...

    async def promote(self, version: str) -> dict: ...


class RoundError(RuntimeError):
    """A round cannot run (no engines to evaluate on, bad adapter files...); nothing flipped or was acknowledged."""


class _LockKeeper:
    """Renews the round lock while the round runs."""

    def __init__(self, lock, seconds: float):
        self.lock, self.seconds = lock, seconds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.wait(self.seconds / 3):
            try:
                self.lock.reacquire()
            except LockError:
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)
        try:
            self.lock.release()
        except LockError:
            pass  # expired: another trainer may hold it now


def _abandon_stale_candidates(store: Store) -> list[str]:
    """Candidates of a killed round are never promoted: mark them rejected so the registry says so."""
    stale = [m.version for m in store.adapters() if m.status == "candidate"]
    for version in stale:
        store.update_adapter(version, status="rejected", reason="its round was interrupted before the gate")
    return stale


async def _gate(settings: Settings, store: Store, fleet: Fleet, candidate: AdapterMeta, say) -> dict:
    task, version = candidate.task, candidate.version
    urls = fleet.urls()
    started = time.perf_counter()
    await fleet.load(version, candidate.path)  # under its own name; no route points at it yet
    load_seconds = time.perf_counter() - started
    active = store.routes()[1].get(task, {}).get("active")
    versions = [version, active, None] if active else [version, None]
    pool = EnginePool("base", urls, ChatTemplate.load(settings.base_model_path))
    try:
        scores = await evaluate(pool, settings, task, versions)
    finally:
        await pool.close()
    by_version = {s.version: s for s in scores}
    incumbent = by_version[active or "base"]
    promote, reason = decide(by_version[version], incumbent, settings.promote_margin, settings.promote_tolerance)
    say(table(task, scores))
    evaluation = {"scores": [s.as_dict() for s in scores], "incumbent": incumbent.version, "decision": reason,
                  "seconds": round(sum(s.seconds for s in scores), 2)}
    store.update_adapter(version, gate=evaluation)
    started = time.perf_counter()
    if promote:
        await fleet.promote(version)
        say(f"{task}: promoted {version} ({reason})")
    else:
        store.update_adapter(version, status="rejected", reason=reason)
        await fleet.unload(version)
        say(f"{task}: rejected {version} ({reason})")
    return {"version": version, "promoted": promote, "reason": reason, "evaluation": evaluation,
            "seconds": {"load": round(load_seconds, 2), "evaluation": evaluation["seconds"],
                        "promotion": round(time.perf_counter() - started, 2)}}


def run_round(settings: Settings, store: Store, fleet: Fleet, tasks: tuple[str, ...] | None = None,
              say: Callable[[str], None] = print, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """One round; returns its summary (also written under the data dir's rounds/ and in Redis)."""
    tasks = tasks or TRAINED_TASKS
    unknown = [t for t in tasks if t not in TRAINED_TASKS]
    if unknown:
        raise RoundError(f"rounds train {', '.join(TRAINED_TASKS)}; not {', '.join(unknown)}")
    lock = store.round_lock(settings.round_lock_seconds)
    if not lock.acquire():
        say("another round is running (the round lock is held); nothing to do")
        return {"status": "locked"}
    with _LockKeeper(lock, settings.round_lock_seconds):
        if not fleet.urls():
            raise RoundError("no base engine is registered: start `tucano serve` (or set TUCANO_BASE_ENGINE_URLS)")
        round_id = time.strftime("r%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
        started = time.perf_counter()
        orphans, stale = clean_orphans(settings), _abandon_stale_candidates(store)
        template = ChatTemplate.load(settings.base_model_path)
        stored = store.read_new_records(CONSUMER, count=1_000_000)
        held_out = frozenset(input_key(row["input"]) for t in TRAINED_TASKS for row in load_split(settings.datasets_dir, t, "eval"))
        data, unusable, unusable_ids = collect(stored, template.render, settings.reward_context, TRAINED_TASKS, held_out)
        summary = {"round": round_id, "records": len(stored), "unusable": dict(unusable), "orphans_removed": orphans,
                   "stale_candidates": stale, "tasks": {}}
        say(f"round {round_id}: {len(stored)} unacknowledged records")
        acknowledged: list[str] = list(unusable_ids)
        for task in tasks:
            task_data = data[task]
            entry = summary["tasks"][task] = {"records": task_data.records, "prompts": len(task_data.prompts),
                                              "pairs": len(task_data.pairs), "skipped": dict(task_data.skipped)}
            usable = task_data.records - sum(task_data.skipped.values())
            if usable < settings.min_records_per_task or not task_data.prompts:
                entry["status"] = f"too few usable records ({usable} < {settings.min_records_per_task}); not trained"
                say(f"{task}: {entry['status']}")
                continue
            say(f"{task}: training on {task_data.records} records ({len(task_data.prompts)} prompts, {len(task_data.pairs)} pairs)")
            candidate = train_candidate(settings, store, task_data, round_id, progress)
            entry.update(version=candidate.version, method=candidate.method, training=candidate.training)
            entry.update(asyncio.run(_gate(settings, store, fleet, candidate, say)))
            entry["status"] = "promoted" if entry["promoted"] else "rejected"
            acknowledged += task_data.entry_ids
        summary["acknowledged"] = store.ack(acknowledged)
        summary["seconds"] = round(time.perf_counter() - started, 2)
        settings.rounds_dir.mkdir(parents=True, exist_ok=True)
        (settings.rounds_dir / f"{round_id}.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        store.redis.set(f"tucano:round:{round_id}", json.dumps(summary, ensure_ascii=False))
        trained = Counter(e.get("status", "?").split(" ")[0] for e in summary["tasks"].values())
        say(f"round {round_id} done in {summary['seconds']} s: {dict(trained)}")
        return summary
