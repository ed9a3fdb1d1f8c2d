"""A learning round, end to end (contract §8):

1. take the round lock (one round at a time across the fleet; renewed while the round runs,
   expiring when its trainer dies); a second trainer waits for it (`round_lock_wait_s`), then
   runs its own round on what is new by then;
2. read the records new since the last round, and every task's labelled set;
3. per task with something new to learn from: build its data, choose its methods, train a
   candidate (`candidate`), load it into every engine of its model under its own name;
4. the gate (`gate`): candidate and incumbent on the same eval rows with the same seeds, a
   paired 95% interval; then shadow replay on recent real inputs (`shadow`);
5. a candidate that passes goes to canary (a share of live traffic) when one is configured, else
   it is promoted through the fleet's hot-swap; one that fails is rejected and unloaded;
6. acknowledge the records read (labels are never consumed), and keep the round's summary (what
   each task trained on, per-step metrics, stop conditions, the decision with its interval, the
   seconds of each phase) in `<data dir>/rounds/` and in Redis.

Anything that stops a round before its end leaves the routes as they were and acknowledges
nothing, so the next round reads the same records again; labels are never at risk.

The fleet (engines to load versions into, the hot-swap that flips a route, the canary) is what
the caller hands in as a `Fleet`: deploy/ hands its `HotSwap`, so this package never imports deploy.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

import msgspec
from redis.exceptions import LockError

from common import lifecycle
from common.lifecycle import AdapterChange
from common.processes import peak_rss_gb
from common.records import BASE_VERSION, AdapterMeta, Record, TrainedNotServed
from common.rounds import GateRecord, Outcome, PlanStep, RoundSummary, TaskOutcome, TrainingStart, encode_round
from common.settings import Settings
from common.store import Store
from router.engine_client import ChatTemplate, EnginePool
from tasks import TASK_ENGINE, TASKS, model_path_of, training_settings
from trainer import data as round_data
from trainer import gate, methods, shadow
from trainer.candidate import AdapterWriteError, clean_orphans, train_candidate
from trainer.policy import QuantizationUnavailable
from trainer.rollouts import RolloutFailed

CONSUMER = "trainer"
HISTORY_ROUNDS = 50  # the latest rounds `auto` reads for methods that kept making far worse candidates (`methods.far_worse`)


class Fleet(Protocol):
    """What a round needs of the serving fleet (deploy.hotswap.HotSwap is one)."""

    def urls(self, kind: str) -> list[str]: ...

    async def load(self, version: str, path: str, kind: str) -> None: ...

    async def unload(self, version: str, kind: str) -> None: ...

    async def promote(self, version: str, reason: str = "promoted") -> AdapterChange:
        """Flip the route, mark the statuses (`common.lifecycle`), and retire the examples the
        version absorbed (`examples_retired`)."""

    async def start_canary(self, version: str, share: float) -> AdapterChange: ...


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
    """Versions a killed round was still judging (`lifecycle.JUDGED`) are never promoted: mark them
    rejected so the registry says so.
    One that a route already points at (the round died between the flip and the status update)
    gets the status of its route instead."""
    routed = {version: arm for route in store.routes()[1].values() for arm, version in (("active", route.active), ("canary", route.canary))
              if version}
    stale = []
    for meta in store.adapters(*TASKS):
        if meta.status not in lifecycle.JUDGED:
            continue
        if meta.version in routed:
            flip_of = lifecycle.activate if routed[meta.version] == "active" else lifecycle.start_canary
            flip_of(store, meta.version, "its round died after the flip")
        else:
            lifecycle.reject(store, meta.version, "its round was interrupted before its verdict")
            stale.append(meta.version)
    return stale


def _round_seed(round_id: str) -> int:
    return zlib.crc32(round_id.encode())


async def _judge(settings: Settings, store: Store, fleet: Fleet, candidate: AdapterMeta, seed: int, say,
                 entry: TaskOutcome, progress: Callable[[str, int, int], None]) -> None:
    """Gate, shadow replay, then canary, promotion or rejection (a promotion retires the examples
    the new version absorbed of those it trained on); what it decided and found goes in `entry`."""
    task, version, kind = candidate.task, candidate.version, TASK_ENGINE[candidate.task]
    progress(f"{task} gate", 0, 1)
    started = time.perf_counter()
    try:
        await fleet.load(version, candidate.path, kind)  # under its own name; no route points at it yet
    except TrainedNotServed as error:  # unloaded everywhere already; the version says why
        entry.seconds["load"] = round(time.perf_counter() - started, 2)
        lifecycle.reject(store, version, f"trained is not served: {error}")
        entry.outcome, entry.reason = Outcome.REJECTED, f"trained is not served: {error}"
        say(f"{task}: rejected {version} ({entry.reason})")
        return
    entry.seconds["load"] = round(time.perf_counter() - started, 2)
    incumbent = store.route(task).active
    pool = EnginePool.for_task(settings, task, fleet.urls(kind))
    say(f"{task}: gate: {version} against {incumbent or 'base'}")
    try:
        decision = await gate.run_gate(pool, settings, store, task, version, incumbent, seed)
        entry.seconds["gate"] = decision.seconds
        say(gate.table(task, decision, version, incumbent))
        judged = GateRecord(decision=decision, incumbent=incumbent or BASE_VERSION)
        passed, reason = decision.promote, decision.reason
        if passed:
            lifecycle.pass_gate(store, version, decision.reason)
        if passed and settings.shadow_records:
            progress(f"{task} shadow", 0, 1)
            held = gate.held_out_inputs(settings, store, task)
            recent, labels = shadow.choose(task, store.recent_records(task, 20 * settings.shadow_records), held,
                                           settings.shadow_records, shadow.eval_labels(store, task))
            shows = None if decision.served_alone else store  # as it will be served: its examples, or none
            judged.shadow = await shadow.replay(pool, settings, task, version, recent, seed, labels, shows)
            entry.seconds["shadow"] = judged.shadow.seconds
            say(f"{task}: shadow replay {judged.shadow.reason}")
            if judged.shadow.worse:
                passed, reason = False, f"gate passed ({decision.reason}) but shadow replay: {judged.shadow.reason}"
            else:
                lifecycle.pass_shadow(store, version, judged.shadow.reason)
    finally:
        await pool.close()
    store.update_adapter(version, gate=judged)
    entry.gate, entry.reason = judged, reason
    started = time.perf_counter()
    if passed and settings.canary_share > 0:
        await fleet.start_canary(version, settings.canary_share)
        entry.outcome = Outcome.CANARY
        say(f"{task}: {version} serves {settings.canary_share:.0%} of traffic as a canary ({reason})")
    elif passed:
        promoted = await fleet.promote(version, f"promoted by round: {reason}")
        entry.outcome = Outcome.PROMOTED
        say(f"{task}: promoted {version} ({reason})")
        entry.retired = promoted.examples_retired
        say(f"{task}: examples retired: {entry.retired.reason}")
    else:
        lifecycle.reject(store, version, reason)
        await fleet.unload(version, kind)
        entry.outcome = Outcome.REJECTED
        say(f"{task}: rejected {version} ({reason})")
    entry.seconds["flip"] = round(time.perf_counter() - started, 2)


def _has_news(store: Store, task: str, labels, new_records: int, settings: Settings) -> tuple[bool, str]:
    last = store.last_trained(task)
    changed = sum(1 for label in labels if label.updated > last)
    if changed:
        return True, f"{changed} labels new or changed since the last round"
    if new_records >= settings.min_records_per_task:
        return True, f"{new_records} new records >= {settings.min_records_per_task}"
    return False, f"nothing new: no label changed, {new_records} new records < {settings.min_records_per_task}"


def kept_groups(store: Store, settings: Settings, task: str, policy: str, records) -> list[Record]:
    """The records of earlier rounds whose groups `policy` (the version the round trains from)
    served, newest first, at most `grpo_max_groups`: no round has made a version from them, since
    the policy still serves, so they are as on-policy as this round's own groups. A round whose
    candidate is rejected thus loses none of its groups, and the next trains on them with its own
    (contract §8). Without them each push candidate trained on one round's ~60 groups. With them,
    run 40's round 2 trained on 120 and gained +0.172 on held-out rows, while run 42's candidates
    on 120 and 180 were rejected (docs/results.md): more groups are no promise of a gain. Looks
    back at most `grpo_kept_scan` records of the stream; 0 turns it off."""
    if settings.grpo_kept_scan <= 0 or settings.grpo_max_groups <= 0:
        return []
    new = {record.id for _, record in records if record is not None}
    return store.recent_records(task, settings.grpo_max_groups, settings.grpo_kept_scan,
                                keep=lambda record: record.group is not None and record.version == policy and record.id not in new)


def _train_task(settings: Settings, store: Store, fleet: Fleet, task: str, records, round_id: str, say,
                progress: Callable[[str, int, int], None]) -> TaskOutcome:
    settings = training_settings(settings, task)  # the task's own training settings (`task_training`) from its data on
    labels = store.labels(task)
    news, why = _has_news(store, task, labels, len(records), settings)
    template = ChatTemplate.load(model_path_of(settings, task))
    active = store.route(task).active
    active_meta = store.adapter(active) if active else None
    start, start_why, parent = methods.start(settings, active_meta, model_path_of(settings, task))
    # the served groups a round may train on: those of the policy it starts from and its parents
    lineage = round_data.lineage(parent, {m.version: m for m in store.adapters(task)})
    data = round_data.build(task, labels, records, template.render, settings.reward_context,
                            gate.held_out_inputs(settings, store, task), settings.seed, settings.unlabelled_prompts_per_round,
                            settings.sft_from_liked, round_data.served_demonstrations(settings, task, labels), lineage,
                            settings.grpo_max_groups, kept_groups(store, settings, task, lineage[0], records) if news else [])
    left_out = methods.left_out(store.rounds(HISTORY_ROUNDS), task, settings) if settings.train_method == "auto" else {}
    steps = methods.plan(settings.train_method, data, settings, left_out) if news else []
    entry = TaskOutcome(outcome=Outcome.NOT_TRAINED, why=why, labels=len(labels), data=data.summary(),
                        plan=[PlanStep(method=m, why=w) for m, w in steps])
    if not steps:
        left = "; ".join(f"{m} left out: {w}" for m, w in left_out.items())
        entry.reason = why if not news else f"no method `auto` may choose has data ({left})" if left else "no method has enough data"
        say(f"{task}: not trained: {entry.reason}")
        return entry
    plan = [m for m, _ in steps]
    if plan == ["grpo"]:  # only GRPO continues a rejected candidate (`methods.continued`)
        rejected, rejected_why = methods.continued(settings, parent, model_path_of(settings, task), store.adapters(task), plan)
        parent, start, start_why = (rejected, rejected.version, rejected_why) if rejected else (parent, start, f"{start_why}; {rejected_why}")
    entry.start = TrainingStart(weights=start, why=start_why)
    say(f"{task}: {why}; training " + ", then ".join(f"{m} ({w})" for m, w in steps) + f"; the LoRA starts from {start}: {start_why}")
    started = time.perf_counter()

    def trained(_method: str, done: int, total: int) -> None:  # a time budget ends most training before its last step
        share = max(done / total if total else 0.0, (time.perf_counter() - started) / settings.train_time_budget_s)
        progress(f"{task} training", round(min(share, 1.0) * 1000), 1000)
    progress(f"{task} training", 0, 1)
    try:
        candidate = train_candidate(settings, store, data, steps, round_id, parent, trained, tuple(fleet.urls(TASK_ENGINE[task])))
    except QuantizationUnavailable as error:  # a setting this machine cannot honour: no task can train
        raise RoundError(str(error)) from None
    except RolloutFailed as error:  # an engine failed while GRPO sampled: nothing registered, no partial group trained
        entry.outcome, entry.reason = Outcome.FAILED, f"GRPO stopped: {error}; nothing registered"
        say(f"{task}: failed: {entry.reason}")
        return entry
    except AdapterWriteError as error:  # nothing was registered; the labels are all still there
        entry.outcome, entry.reason = Outcome.FAILED, f"the candidate could not be saved ({error}); nothing registered"
        say(f"{task}: failed: {entry.reason}")
        return entry
    entry.seconds["training"] = round(time.perf_counter() - started, 2)
    entry.peak_rss_gb = peak_rss_gb()
    entry.version, entry.method = candidate.version, candidate.method
    entry.training, entry.stop_conditions = candidate.training.methods, candidate.training.stop_conditions
    asyncio.run(_judge(settings, store, fleet, candidate, _round_seed(round_id), say, entry, progress))
    store.mark_trained(task)
    return entry


def run_round(settings: Settings, store: Store, fleet: Fleet, tasks: tuple[str, ...] | None = None,
              say: Callable[[str], None] = print, progress: Callable[[str, int, int], None] | None = None) -> RoundSummary | None:
    """One round; returns its summary (also written under the data dir's rounds/ and in Redis), or
    None when another round held the lock throughout. `progress(stage, done, total)` hears each
    task's stages (`<task> training`, `<task> gate`, `<task> shadow`; `stage_seconds` says what
    each took the last time)."""
    tasks = tasks or TASKS
    progress = progress or (lambda *_: None)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise RoundError(f"rounds train {', '.join(TASKS)}; not {', '.join(unknown)}")
    lock = store.round_lock(settings.round_lock_seconds)
    if not lock.acquire():
        if settings.round_lock_wait_s <= 0:
            say("another round is running (the round lock is held); nothing to do")
            return None
        say(f"another round is running (the round lock is held); waiting up to {settings.round_lock_wait_s:.0f} s for it to end")
        waited = time.perf_counter()
        if not lock.acquire(blocking=True, blocking_timeout=settings.round_lock_wait_s):
            say(f"the other round still runs after {settings.round_lock_wait_s:.0f} s; nothing done")
            return None
        say(f"the round lock is free after {time.perf_counter() - waited:.1f} s")
    with _LockKeeper(lock, settings.round_lock_seconds):
        missing = sorted({TASK_ENGINE[t] for t in tasks if not fleet.urls(TASK_ENGINE[t])})
        if missing:
            raise RoundError(f"no {' or '.join(missing)} engine is registered: start `tucano serve` (or set its URLs)")
        round_id = time.strftime("r%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
        started, started_at = time.perf_counter(), time.time()  # one instant: started + seconds is when the round ended
        orphans, stale = clean_orphans(settings), _abandon_stale_candidates(store)
        stored = store.read_new_records(CONSUMER, count=1_000_000)
        by_task: dict[str, list] = defaultdict(list)
        for entry in stored:
            by_task[entry.record.task if entry.record else ""].append((entry.entry_id, entry.record))
        summary = RoundSummary(round=round_id, started=started_at, records=len(stored), orphans_removed=orphans,
                               stale_candidates=stale, settings=_recipe(settings))
        say(f"round {round_id}: {len(stored)} new records")
        for task in tasks:
            summary.tasks[task] = _train_task(settings, store, fleet, task, by_task.get(task, []), round_id, say, progress)
        summary.acknowledged = store.ack([entry.entry_id for entry in stored])
        summary.seconds = round(time.perf_counter() - started, 2)
        store.save_round(summary)
        settings.rounds_dir.mkdir(parents=True, exist_ok=True)
        (settings.rounds_dir / f"{round_id}.json").write_bytes(msgspec.json.format(encode_round(summary), indent=2))
        outcomes = {task: str(outcome) for task, outcome in summary.outcomes().items()}
        say(f"round {round_id} done in {summary.seconds} s: {outcomes}")
        return summary


def stage_seconds(last: RoundSummary | None, tasks: tuple[str, ...]) -> dict[str, float]:
    """What each stage of a round over `tasks` took the last time, in order: the expected seconds
    its progress account scales (a task the last round did not train has none)."""
    expected: dict[str, float] = {}
    for task in tasks:
        seconds = last.tasks[task].seconds if last and task in last.tasks else {}
        if not seconds.get("training"):
            continue
        expected[f"{task} training"] = seconds["training"]
        expected[f"{task} gate"] = seconds.get("load", 0.0) + seconds.get("gate", 0.0) + (0.0 if seconds.get("shadow") else seconds.get("flip", 0.0))
        if seconds.get("shadow"):
            expected[f"{task} shadow"] = seconds["shadow"] + seconds.get("flip", 0.0)
    return expected


def _recipe(settings: Settings) -> dict:
    """The settings a round's outcome depends on, kept with it."""
    keys = ("train_method", "train_from", "train_time_budget_s", "train_learning_rate", "task_training", "sft_max_epochs", "min_sft_examples",
            "min_dpo_pairs", "min_kto_examples", "grpo_advantage", "grpo_std_floor", "grpo_iterations", "grpo_num_generations",
            "grpo_entropy_coef", "grpo_beta", "grpo_learning_rate", "grpo_importance_cap", "grpo_min_groups", "grpo_max_groups",
            "grpo_reload_every", "grpo_kept_scan", "grpo_prompts_per_step", "grpo_max_batches", "serve_samples",
            "train_idle_budget_factor", "auto_grpo", "train_with_examples", "examples_tasks", "examples_k",
            "team_eval_share", "promote_margin", "component_tolerance", "gate_max_rows", "gate_look_rows", "shadow_records",
            "canary_share")
    return settings.model_dump(mode="json", include=set(keys), exclude_none=False)
