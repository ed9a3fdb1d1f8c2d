"""The Redis store: records, feedback, the adapter registry and the routing table (contract §9).

- Records live in a Stream (`tucano:records`), one entry per answered request, the record as
  JSON in field `record`; `tucano:record:<id>` maps a record id to its entry id. Trainers read
  with the consumer group `trainers` and acknowledge only what a finished round used; trimming
  (`trim_records`) never removes entries newer than the oldest unacknowledged one.
- Feedback is a hash per record (`tucano:feedback:<id>`), merged into the record when read.
- Labels (a request's reference, a correction, a rating) are kept per task in a hash
  (`tucano:labels:<task>`, record id -> `Label`), written with the record or the feedback in the
  same atomic step; rounds read them all, every time, and never remove one.
- Engine failures go to their own stream (`tucano:failures`), so no trainer reads them.
- Routes: one hash `tucano:routes` (task -> JSON {active, previous, and while a canary runs
  canary, canary_share, canary_started, canary_since}) and a counter `tucano:routes:version`
  bumped in the same transaction, which gateways poll.
- Adapters: `tucano:adapter:<version>` JSON metadata, `tucano:adapters:<task>` the set of a
  task's versions, `tucano:adapters:seq:<task>` the counter that names new versions.
- Rounds: `tucano:round:<id>` a round's summary, `tucano:rounds` their ids, newest first, and
  `tucano:rounds:totals` counters over them all (rounds, seconds, decisions per task and outcome,
  the newest round's duration and start), updated in the same transaction.
- Eval rows a team loaded: `tucano:evalset:<task>` (input hash -> row), never trained on.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import redis
import redis.asyncio
from redis.commands.core import AsyncScript

from common import lifecycle
from common.records import (
    POINT_DECODER,
    AdapterMeta,
    Feedback,
    JobProgress,
    Label,
    Record,
    RecordPoint,
    Route,
    StatusChange,
    adapter_version_name,
    decode_adapter,
    decode_label,
    decode_record,
    encode,
    label_of,
)
from common.rounds import RoundSummary, decode_round, encode_round

PROGRESS = "tucano:progress"  # :<job> -> JobProgress
JOBS = ("bootstrap", "round")
PROGRESS_TTL_S = 300  # a job writes at least every stage; one silent this long is shown no more
RECORDS = "tucano:records"
FAILURES = "tucano:failures"
GROUP = "trainers"
ROUTES = "tucano:routes"
ROUTES_VERSION = "tucano:routes:version"
ENGINES = "tucano:engines"
ENGINE_NUMERICS = "tucano:engines:numerics"  # per kind: how the engines compute (cuda, cpu-bf16, cpu-fp32, unknown)
UNKNOWN_NUMERICS = "unknown"  # engines given by URL: the service cannot see how they compute
PRETRAINED = "tucano:engines:pretrained"  # set while the engines serve the demo model's pretrained weights
ROUND_LOCK = "tucano:lock:round"
CANARY_LOCK = "tucano:lock:canary"
ADAPTERS_LOCK = "tucano:lock:adapters"
ROUND_LAST = "tucano:round:last:{task}"  # when a round last trained the task: labels changed after it are news
ROUNDS = "tucano:rounds"
ROUND_TOTALS = "tucano:rounds:totals"  # counters over every saved round, what /metrics exposes
ANSWERS = "tucano:answers:{scope}"  # what an unchanging model (a base model, an immutable version) answered to a request
ANSWERS_TTL_S = 7 * 24 * 3600
# a fixed window per key: the hit count and the seconds the window has left
HIT_RATE = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return {count, redis.call('TTL', KEYS[1])}
"""
# the record, its id index and (when it carries a reference) its label: all or nothing
ADD_RECORD = """
local id = redis.call('XADD', KEYS[1], '*', 'record', ARGV[1])
redis.call('SET', KEYS[2], id)
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[2])
  redis.call('INCR', KEYS[4])
end
return id
"""


class StoreUnavailable(RuntimeError):
    """Redis cannot be reached; callers answer 503."""


class UnknownRecord(KeyError):
    pass


def _record_key(record_id: str) -> str:
    return f"tucano:record:{record_id}"


def _feedback_key(record_id: str) -> str:
    return f"tucano:feedback:{record_id}"


def _labels_key(task: str) -> str:
    return f"tucano:labels:{task}"


def _labels_version_key(task: str) -> str:
    """A counter that every change of a task's labels increments: readers rebuild what they derive
    from the labels (the example index) only when it moved."""
    return f"tucano:labels:version:{task}"


class TooManyCorrections(ValueError):
    """A record's correction was changed as often as allowed."""


@dataclass
class StoredRecord:
    entry_id: str
    record: Record | None  # None: the entry does not hold a parseable record


class Store:
    def __init__(self, url: str, maxlen: int = 200_000):
        self.url = url
        self.maxlen = maxlen
        self.redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, decode_responses=True)
        # The gateway writes a record per request from its event loop: an asyncio client there
        # costs less than the thread hop a blocking call needs. Such a client belongs to the loop
        # that made it, so there is one per loop.
        self._loop_scripts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncScript]] = weakref.WeakKeyDictionary()
        self._put_adapter_script = self.redis.register_script(
            "if redis.call('SET', KEYS[1], ARGV[1], 'NX') then redis.call('SADD', KEYS[2], ARGV[2]) return 1 end return 0"
        )

    def ping(self) -> bool:
        try:
            return bool(self.redis.ping())
        except redis.RedisError:
            return False

    # --- records ------------------------------------------------------------------------

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(RECORDS, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    async def add_record(self, record: Record, label: Label | None = None) -> str:
        """Write a record atomically (stream entry, id index and its label if it has one, one Lua
        call): all exist or none. Raise StoreUnavailable when Redis cannot take it."""
        try:
            entry_id = await self._script("record")(keys=[RECORDS, _record_key(record.id), _labels_key(record.task),
                                                          _labels_version_key(record.task)],
                                    args=[encode(record), encode(label) if label else "", record.id])
        except redis.RedisError as error:
            raise StoreUnavailable(str(error)) from None
        return entry_id

    def _script(self, name: str) -> AsyncScript:
        """The event loop's own registration of one of the gateway's Lua scripts."""
        loop = asyncio.get_running_loop()
        scripts = self._loop_scripts.get(loop)
        if scripts is None:
            client = redis.asyncio.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=2, decode_responses=True)
            scripts = self._loop_scripts[loop] = {"record": client.register_script(ADD_RECORD),
                                                  "rate": client.register_script(HIT_RATE)}
        return scripts[name]

    async def hit_rate(self, key: str, limit: int, window_s: int) -> int:
        """Count a hit in `key`'s current window; the seconds until the window ends when it is over
        `limit` (the caller answers 429 with them), else 0."""
        try:
            count, ttl = await self._script("rate")(keys=[f"tucano:rate:{key}"], args=[window_s])
        except redis.RedisError as error:
            raise StoreUnavailable(str(error)) from None
        return max(1, int(ttl)) if int(count) > limit else 0

    def add_failure(self, failure: dict) -> None:
        try:
            self.redis.xadd(FAILURES, {"failure": json.dumps(failure, ensure_ascii=False)}, maxlen=self.maxlen, approximate=True)
        except redis.RedisError:
            pass  # the failure is also counted in metrics; the client already gets a 503

    def get_record(self, record_id: str) -> StoredRecord:
        try:
            entry_id = self.redis.get(_record_key(record_id))
            if entry_id is None:
                raise UnknownRecord(record_id)
            entries = self.redis.xrange(RECORDS, entry_id, entry_id)
            feedback = self.redis.hgetall(_feedback_key(record_id))
        except redis.RedisError as error:
            raise StoreUnavailable(str(error)) from None
        if not entries:
            raise UnknownRecord(record_id)
        return StoredRecord(entry_id, _with_feedback(decode_record(entries[0][1]["record"]), feedback))

    def add_feedback(self, record_id: str, rating: int, correction=None, eval_share: float = 0.2,
                     max_corrections: int = 3) -> Record:
        """Attach a rating (and a checked correction, which becomes the record's reference) and
        update the record's label in the same transaction. A record's correction can be set
        `max_corrections` times at most."""
        try:
            stored = self.get_record(record_id)
            record = stored.record
            if record is None:
                raise UnknownRecord(record_id)

            def attach(pipe: redis.client.Pipeline) -> None:
                corrections = int(pipe.hget(_feedback_key(record_id), "corrections") or 0)
                raw_label = pipe.hget(_labels_key(record.task), record_id)
                label = decode_label(raw_label) if raw_label else label_of(record, eval_share)
                mapping = {"rating": rating, "at": time.time()}
                if correction is not None:
                    if corrections >= max_corrections:
                        raise TooManyCorrections(f"record {record_id} was corrected {corrections} times, the most allowed")
                    mapping.update(correction=json.dumps(correction, ensure_ascii=False), corrections=corrections + 1)
                    label.answer, label.answer_source = correction, "correction"
                label.rating, label.updated = rating, time.time()
                pipe.multi()
                pipe.hset(_feedback_key(record_id), mapping=mapping)
                pipe.hset(_labels_key(record.task), record_id, encode(label))
                pipe.incr(_labels_version_key(record.task))

            self.redis.transaction(attach, _feedback_key(record_id), _labels_key(record.task))
        except redis.RedisError as error:
            raise StoreUnavailable(str(error)) from None
        return self.get_record(record_id).record

    def recent_records(self, task: str, count: int, scan: int = 5000, keep: Callable[[Record], bool] | None = None) -> list[Record]:
        """The newest `count` readable records of a task (those `keep` accepts, where given), newest
        first, looking at most `scan` entries back, in pages of 500."""
        out, end, seen = [], "+", 0
        while len(out) < count and seen < scan:
            entries = self.redis.xrevrange(RECORDS, max=end, count=500)
            if not entries:
                break
            seen += len(entries)
            out += [record for record in _of_task(entries, task) if keep is None or keep(record)]
            end = "(" + entries[-1][0]
        return out[:count]

    def record_points(self, since: float, limit: int) -> tuple[list[RecordPoint], bool]:
        """The newest records since `since` (epoch seconds), at most `limit` of them, oldest first,
        as time-series points; and whether older ones in the window were left out."""
        entries = self.redis.xrevrange(RECORDS, min=str(int(since * 1000)), count=limit + 1)
        points = []
        for _, fields in entries[:limit]:
            try:
                points.append(POINT_DECODER.decode(fields.get("record", "")))
            except msgspec.DecodeError:
                continue
        return points[::-1], len(entries) > limit

    # --- rounds and eval sets --------------------------------------------------------------

    def set_progress(self, progress: JobProgress) -> None:
        """Where a running job stands; it expires unless the job writes again (a dead job stops being shown)."""
        self.redis.set(f"{PROGRESS}:{progress.job}", encode(progress), ex=PROGRESS_TTL_S)

    def end_progress(self, job: str) -> None:
        self.redis.delete(f"{PROGRESS}:{job}")

    def jobs(self) -> list[JobProgress]:
        """The running jobs' progress (those that wrote within `PROGRESS_TTL_S`)."""
        raws = self.redis.mget([f"{PROGRESS}:{job}" for job in JOBS])
        return [msgspec.json.decode(raw, type=JobProgress) for raw in raws if raw]

    def save_round(self, summary: RoundSummary) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(f"tucano:round:{summary.round}", encode_round(summary))
        pipe.lpush(ROUNDS, summary.round)
        pipe.hincrby(ROUND_TOTALS, "rounds", 1)
        pipe.hincrbyfloat(ROUND_TOTALS, "seconds", summary.seconds)
        for task, outcome in summary.outcomes().items():
            pipe.hincrby(ROUND_TOTALS, f"decision:{task}:{outcome}", 1)
        pipe.hset(ROUND_TOTALS, mapping={"last_seconds": summary.seconds, "last_started": summary.started})
        pipe.execute()

    def round_totals(self) -> dict[str, float]:
        """The counters over every saved round (`tucano:rounds:totals`); empty before the first."""
        return {name: float(value) for name, value in self.redis.hgetall(ROUND_TOTALS).items()}

    def rounds(self, count: int = 50) -> list[RoundSummary]:
        """The newest rounds' summaries, newest first."""
        ids = self.redis.lrange(ROUNDS, 0, count - 1)
        raws = self.redis.mget([f"tucano:round:{i}" for i in ids]) if ids else []
        return [decode_round(raw) for raw in raws if raw]

    def round(self, round_id: str) -> RoundSummary | None:
        raw = self.redis.get(f"tucano:round:{round_id}")
        return decode_round(raw) if raw else None

    def add_eval_rows(self, task: str, rows: dict[str, dict]) -> int:
        """Add rows (input hash -> row) to a task's loaded eval set; returns how many were new."""
        if not rows:
            return 0
        pipe = self.redis.pipeline(transaction=True)
        for key, row in rows.items():
            pipe.hsetnx(f"tucano:evalset:{task}", key, json.dumps(row, ensure_ascii=False))
        return sum(pipe.execute())

    def eval_set(self, task: str) -> list[dict]:
        return [json.loads(raw) for raw in self.redis.hvals(f"tucano:evalset:{task}")]

    def labels(self, task: str) -> list[Label]:
        """Every label of a task, oldest first."""
        return sorted((decode_label(raw) for raw in self.redis.hvals(_labels_key(task))), key=lambda label: label.time)

    def retire_labels(self, task: str, record_ids: list[str], version: str) -> int:
        """Mark labels as absorbed by an adapter version (they stay labels; retrieval skips them)."""
        retired = 0

        def mark(pipe: redis.client.Pipeline) -> None:
            nonlocal retired
            raws = pipe.hmget(_labels_key(task), record_ids) if record_ids else []
            labels = [decode_label(raw) for raw in raws if raw]
            pipe.multi()
            for label in labels:
                label.retired_by = version
                pipe.hset(_labels_key(task), label.id, encode(label))
            if labels:
                pipe.incr(_labels_version_key(task))
            retired = len(labels)

        self.redis.transaction(mark, _labels_key(task))
        return retired

    def read_new_records(self, consumer: str, count: int = 1000) -> list[StoredRecord]:
        """Records never delivered to the trainers' group; re-delivers this consumer's pending ones first."""
        self.ensure_group()
        out: list[StoredRecord] = []
        for start in ("0", ">"):
            for _, entries in self.redis.xreadgroup(GROUP, consumer, {RECORDS: start}, count=count) or []:
                for entry_id, fields in entries:
                    if not fields:  # trimmed while pending
                        continue
                    try:
                        record = decode_record(fields.get("record", ""))
                    except msgspec.DecodeError:
                        record = None  # kept as None: the trainer counts and acknowledges it
                    if record is not None:
                        record = _with_feedback(record, self.redis.hgetall(_feedback_key(record.id)))
                    out.append(StoredRecord(entry_id, record))
        return out

    def ack(self, entry_ids: list[str]) -> int:
        return self.redis.xack(RECORDS, GROUP, *entry_ids) if entry_ids else 0

    def recent_failures(self, count: int = 100) -> list[dict]:
        return [json.loads(fields["failure"]) for _, fields in self.redis.xrevrange(FAILURES, count=count)]

    def trim_records(self) -> int:
        """Drop the oldest records beyond `maxlen`, but never one the trainers have not acknowledged."""
        self.ensure_group()
        length = self.redis.xlen(RECORDS)
        excess = length - self.maxlen
        if excess <= 0:
            return 0
        oldest_kept = self.redis.xrange(RECORDS, count=excess + 1)[-1][0]
        group = next(g for g in self.redis.xinfo_groups(RECORDS) if g["name"] == GROUP)
        pending = self.redis.xpending(RECORDS, GROUP)
        limits = [oldest_kept, _next_id(group["last-delivered-id"])]
        if pending["pending"]:
            limits.append(pending["min"])
        return self.redis.xtrim(RECORDS, minid=min(limits, key=_id_key), approximate=False)

    # --- routes -------------------------------------------------------------------------

    def routes(self) -> tuple[int, dict[str, Route]]:
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(ROUTES_VERSION)
        pipe.hgetall(ROUTES)
        version, raw = pipe.execute()
        return int(version or 0), {task: msgspec.json.decode(value, type=Route) for task, value in raw.items()}

    def route(self, task: str) -> Route:
        """A task's route (an empty one, the base model, while it has none)."""
        raw = self.redis.hget(ROUTES, task)
        return msgspec.json.decode(raw, type=Route) if raw else Route()

    def routed_adapters(self, routes: dict[str, Route], engine_of: Mapping[str, str]) -> dict[str, dict[str, str]]:
        """Engine kind -> every version `routes` point at (active and canary) -> its files: what
        every engine of that kind must serve (`engine_of`: each task's engine kind; a route of a
        task it does not name is left out)."""
        paths: dict[str, dict[str, str]] = {}
        for task, route in routes.items():
            for version in route.served():
                meta = self.adapter(version)
                if meta is not None and task in engine_of:
                    paths.setdefault(engine_of[task], {})[version] = meta.path
        return paths

    def routes_version(self) -> int:
        return int(self.redis.get(ROUTES_VERSION) or 0)

    def change_route(self, task: str, change: Callable[[Route], Route]) -> Route:
        """Replace a task's route by `change(current)` in one atomic step that gateways see through
        the version counter; `change` may raise to leave it as it was."""
        def flip(pipe: redis.client.Pipeline) -> Route:
            raw = pipe.hget(ROUTES, task)
            route = change(msgspec.json.decode(raw, type=Route) if raw else Route())
            pipe.multi()
            pipe.hset(ROUTES, task, msgspec.json.encode(route))
            pipe.incr(ROUTES_VERSION)
            return route
        return self.redis.transaction(flip, ROUTES, value_from_callable=True)

    def last_record_id(self) -> str:
        """The records stream's newest entry id ("0-0" when empty): where a canary starts counting."""
        entries = self.redis.xrevrange(RECORDS, count=1)
        return entries[0][0] if entries else "0-0"

    def records_since(self, entry_id: str, task: str, limit: int = 100_000) -> list[Record]:
        """A task's readable records after an entry id, oldest first."""
        out, start = [], "(" + entry_id
        while len(out) < limit:
            entries = self.redis.xrange(RECORDS, min=start, count=1000)
            if not entries:
                break
            out += _of_task(entries, task)
            start = "(" + entries[-1][0]
        return out

    # --- engines and the round lock ------------------------------------------------------

    def register_engines(self, kind: str, urls: list[str], numerics: str) -> None:
        """Where the live engines of a kind are, so trainers and the CLI load adapters into all of
        them, and how they compute (`VllmServer.numerics`; `UNKNOWN_NUMERICS` for engines the service
        did not start), so that a gate never reads back answers one precision gave as another's."""
        with self.redis.pipeline() as pipe:
            pipe.hset(ENGINES, kind, json.dumps(urls))
            pipe.hset(ENGINE_NUMERICS, kind, numerics)
            pipe.execute()

    def set_serving_pretrained(self, pretrained: bool) -> None:
        """Whether the engines serve the demo model's pretrained weights (its fine-tuning still to
        come or failed): then prompts show the bootstrap split's rows (`router.examples`)."""
        if pretrained:
            self.redis.set(PRETRAINED, 1)
        else:
            self.redis.delete(PRETRAINED)

    def examples_state(self, task: str) -> tuple[int, bool]:
        """(the task's labels version, whether the pretrained weights serve) in one round trip: what
        a gateway polls to know whether its examples changed."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(_labels_version_key(task))
        pipe.exists(PRETRAINED)
        version, pretrained = pipe.execute()
        return int(version or 0), bool(pretrained)

    def engine_urls(self, kind: str) -> list[str]:
        return json.loads(self.redis.hget(ENGINES, kind) or "[]")

    def engine_numerics(self, kind: str) -> str:
        return self.redis.hget(ENGINE_NUMERICS, kind) or UNKNOWN_NUMERICS

    def round_lock(self, seconds: float) -> redis.lock.Lock:
        """One training round at a time across every trainer; it expires unless renewed, so a
        crashed trainer never holds it for longer than `seconds`."""
        return self.redis.lock(ROUND_LOCK, timeout=seconds, blocking=False, thread_local=False)

    def canary_lock(self) -> redis.lock.Lock:
        """One canary watcher acts at a time across every `serve` of the fleet; it expires after a minute."""
        return self.redis.lock(CANARY_LOCK, timeout=60, blocking=False)

    def adapters_lock(self, seconds: float) -> redis.lock.Lock:
        """Held by whoever loads a version to route it (until the route points at it) and by whoever unloads
        versions off their route, across every process of the fleet: without it, an unload that read the
        routes before a promotion's flip unloads the version that promotion just loaded. It expires after
        `seconds`, so a crashed holder never blocks the fleet for longer."""
        return self.redis.lock(ADAPTERS_LOCK, timeout=seconds, thread_local=False)

    def last_trained(self, task: str) -> float:
        """When a round last trained `task` (0 when none has)."""
        return float(self.redis.get(ROUND_LAST.format(task=task)) or 0)

    def mark_trained(self, task: str, at: float | None = None) -> None:
        self.redis.set(ROUND_LAST.format(task=task), str(time.time() if at is None else at))

    # --- answers of unchanging models ------------------------------------------------

    def cached_answers(self, scope: str, keys: list[str]) -> list[str | None]:
        """The completions stored under `scope` (one model: the base, or an adapter version) for
        these request keys; None where there is none."""
        return self.redis.hmget(ANSWERS.format(scope=scope), keys) if keys else []

    def cache_answers(self, scope: str, answers: dict[str, str]) -> None:
        if not answers:
            return
        key = ANSWERS.format(scope=scope)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=answers)
            pipe.expire(key, ANSWERS_TTL_S)
            pipe.execute()

    # --- adapters -----------------------------------------------------------------------

    def next_adapter_version(self, task: str) -> str:
        return adapter_version_name(task, self.redis.incr(f"tucano:adapters:seq:{task}"))

    def put_adapter(self, meta: AdapterMeta) -> None:
        """Register a version once, in one atomic step (metadata and task index together); an
        existing version is never overwritten (versions are immutable)."""
        created = self._put_adapter_script(keys=[_adapter_key(meta.version), f"tucano:adapters:{meta.task}"],
                                           args=[encode(meta), meta.version])
        if not created:
            raise ValueError(f"adapter version {meta.version} already exists")

    def update_adapter(self, version: str, status: str | None = None, reason: str | None = None, **changes) -> AdapterMeta:
        """Change a version's status (kept in its history with the time and reason) or what the
        gate and canary found; atomic against another writer of the same version. A status comes
        from `common.lifecycle`'s transitions, and one they do not allow is refused
        (`TransitionRefused`) with nothing written."""
        def change(pipe: redis.client.Pipeline) -> AdapterMeta:
            raw = pipe.get(_adapter_key(version))
            if raw is None:
                raise KeyError(version)
            meta = replace(decode_adapter(raw), **changes)
            if status is not None:
                lifecycle.check(version, meta.status, status)
                meta.status = lifecycle.Status(status).value
                meta.history = [*meta.history, StatusChange(status=meta.status, at=time.time(), reason=reason)]
            if reason is not None:
                meta.reason = reason
            pipe.multi()
            pipe.set(_adapter_key(version), encode(meta))
            return meta
        return self.redis.transaction(change, _adapter_key(version), value_from_callable=True)

    def adapter(self, version: str) -> AdapterMeta | None:
        raw = self.redis.get(_adapter_key(version))
        return decode_adapter(raw) if raw else None

    def shows_examples(self, version: str | None) -> bool:
        """Whether prompts served by `version` show the team's examples (`AdapterMeta.shows_examples`;
        the base model's, None, do)."""
        meta = self.adapter(version) if version else None
        return meta is None or meta.shows_examples()

    def adapters(self, *tasks: str) -> list[AdapterMeta]:
        """The registered versions of `tasks` (each task's set; the caller names the tasks, which
        the store does not know), by task and age."""
        if not tasks:
            raise ValueError("name the tasks whose adapters to list")
        versions = [v for task in tasks for v in self.redis.smembers(f"tucano:adapters:{task}")]
        metas = [self.adapter(v) for v in versions]
        return sorted((m for m in metas if m), key=lambda m: (m.task, m.created))


def _of_task(entries, task: str) -> list[Record]:
    """The readable records of a task among stream entries, in their order."""
    out = []
    for _, fields in entries:
        try:
            record = decode_record(fields.get("record", ""))
        except msgspec.DecodeError:
            continue
        if record.task == task:
            out.append(record)
    return out


def _adapter_key(version: str) -> str:
    return f"tucano:adapter:{version}"


def _with_feedback(record: Record, feedback: dict) -> Record:
    """The record as a reader sees it: the user's feedback attached, a correction as its reference."""
    if feedback:
        correction = json.loads(feedback["correction"]) if "correction" in feedback else None
        record.feedback = Feedback(int(feedback["rating"]), float(feedback["at"]), correction)
        if correction is not None:
            record.reference = correction
    return record


def content_sha256(directory: Path) -> str:
    """Hash of an adapter's files (names and bytes): recorded at registration, checked on promotion."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _next_id(entry_id: str) -> str:
    ms, seq = _id_key(entry_id)
    return f"{ms}-{seq + 1}"
