"""An adapter's life (`common.lifecycle`): the transitions it allows and refuses, that nothing but
it gives a version a status, that every promotion path of the hot-swap (by hand, the canary's,
through the admin API) retires the examples the version absorbed, and that the API answers a
refused transition with a 409. The store here is a dict with the real transition check; the
real Valkey and engines are the integration tier's (`test_promotion.py`, `test_hotswap.py`)."""
from __future__ import annotations

import ast
import asyncio
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from common import lifecycle
from common.lifecycle import Action, AdapterChange, Status, TransitionRefused
from common.records import AdapterMeta, Route, StatusChange
from common.rounds import Retirement
from tests.unit.test_house import PACKAGES, REPO


@pytest.mark.parametrize(("current", "new"), [
    ("candidate", "gated"), ("gated", "shadowed"), ("candidate", "rejected"), ("gated", "rejected"), ("shadowed", "rejected"),
    ("candidate", "canary"), ("gated", "canary"), ("shadowed", "canary"), ("candidate", "active"), ("gated", "active"),
    ("shadowed", "active"), ("canary", "active"), ("canary", "rejected"), ("active", "previous"), ("active", "rolled_back"),
    ("previous", "retired"), ("previous", "active"), ("retired", "previous"), ("retired", "active"), ("rejected", "active"),
    ("rolled_back", "active")])
def test_the_transitions_a_version_may_make(current, new):
    lifecycle.check("sql-v1", current, new)


@pytest.mark.parametrize(("current", "new"), [
    ("active", "canary"), ("retired", "canary"), ("rejected", "canary"), ("active", "active"), ("retired", "rejected"),
    ("canary", "retired"), ("active", "candidate"), ("rejected", "retired"), ("candidate", "shadowed"), ("shadowed", "gated"),
    ("canary", "gated"), ("active", "retired"), ("active", "rejected"), ("previous", "rolled_back"), ("rolled_back", "previous"),
    ("rejected", "gated"), ("canary", "previous")])
def test_a_transition_its_life_does_not_allow_is_refused_naming_both_ends(current, new):
    with pytest.raises(TransitionRefused, match=f"sql-v1 is {current}: it cannot become {new}"):
        lifecycle.check("sql-v1", current, new)


@pytest.mark.parametrize(("current", "new"), [("candidate", "trained"), ("promoted", "active")])
def test_an_unknown_status_is_refused_naming_it(current, new):
    with pytest.raises(TransitionRefused, match="unknown status"):
        lifecycle.check("sql-v1", current, new)


def test_each_transition_function_gives_its_one_status():
    """The typed functions walk a version through its whole life, and each writes the status it names."""
    store = MemoryStore(AdapterMeta(version="sql-v1", task="sql", path="/nowhere"))
    walk = [(lifecycle.pass_gate, "gated"), (lifecycle.pass_shadow, "shadowed"), (lifecycle.start_canary, "canary"),
            (lifecycle.activate, "active"), (lifecycle.supersede, "previous"), (lifecycle.retire, "retired"),
            (lifecycle.supersede, "previous"), (lifecycle.activate, "active"), (lifecycle.roll_back, "rolled_back"),
            (lifecycle.activate, "active")]
    for step, status in walk:
        assert step(store, "sql-v1", f"to {status}").status == status
    assert [change.status for change in store.adapter("sql-v1").history] == [status for _, status in walk]
    with pytest.raises(TransitionRefused, match="sql-v1 is active: it cannot become gated"):
        lifecycle.pass_gate(store, "sql-v1", "again")
    assert store.adapter("sql-v1").status == "active" and len(store.adapter("sql-v1").history) == len(walk)


def test_every_status_the_records_name_has_its_transitions():
    from typing import get_args

    from common.records import AdapterStatus

    assert set(get_args(AdapterStatus)) == set(lifecycle.TRANSITIONS) == {s.value for s in Status}


def test_no_module_but_the_lifecycle_gives_a_version_a_status():
    """`update_adapter(..., status=...)` is called from `common/lifecycle.py` only."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = str(path.relative_to(REPO))
            if name == "common/lifecycle.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update_adapter" \
                        and any(k.arg == "status" for k in node.keywords):
                    found.setdefault(name, []).append(node.lineno)
    assert found == {}, f"give statuses through common.lifecycle: {found}"


class MemoryStore:
    """The adapter and route half of `common.store.Store` on dicts, with its transition check."""

    def __init__(self, *metas: AdapterMeta):
        self.metas = {m.version: m for m in metas}
        self.route_of: dict[str, Route] = {}

    def adapter(self, version):
        return self.metas.get(version)

    def update_adapter(self, version, status=None, reason=None, **changes):
        meta = replace(self.metas[version], **changes)
        if status is not None:
            lifecycle.check(version, meta.status, status)
            meta.status = Status(status).value
            meta.history = [*meta.history, StatusChange(status=meta.status, at=0.0, reason=reason)]
        if reason is not None:
            meta.reason = reason
        self.metas[version] = meta
        return meta

    def route(self, task):
        return self.route_of.get(task, Route())

    def change_route(self, task, change):
        self.route_of[task] = change(self.route(task))
        return self.route_of[task]

    def routes(self):
        return 0, dict(self.route_of)

    def last_record_id(self):
        return "0-0"

    def adapters_lock(self, seconds):
        return MemoryLock(self)


class MemoryLock:
    """`redis.lock.Lock`'s acquire, owned and release, over one flag of its MemoryStore."""

    def __init__(self, store: MemoryStore):
        self.store, self.mine = store, False

    def acquire(self, blocking=True, blocking_timeout=None):
        if getattr(self.store, "locked", False):
            return False  # nothing else runs in a test to release it: waiting would only wait
        self.store.locked = self.mine = True
        return True

    def owned(self):
        return self.mine

    def release(self):
        self.store.locked = self.mine = False


@pytest.fixture
def swap(monkeypatch):
    """A hot-swap whose engines load anything, over a MemoryStore, counting each retirement of examples."""
    from deploy import hotswap

    async def loaded(*args, **kwargs):
        return None
    monkeypatch.setattr(hotswap, "load_everywhere", loaded)
    monkeypatch.setattr(hotswap, "check_adapter_files", lambda meta, base_model: None)
    store = MemoryStore(*(AdapterMeta(version=f"sql-v{n}", task="sql", path="/nowhere") for n in (1, 2, 3)))
    retired: list[str] = []

    async def retire_examples(meta):
        retired.append(meta.version)
        return Retirement(checked=4, retired=1, reason=f"1 of 4 for {meta.version}")
    fleet = hotswap.HotSwap(store, {"base": "m", "think": "t"}, {"base": ["http://engine"]}, 0.0, retire_examples, drain="later")
    fleet.retired = retired
    return fleet


def test_each_promotion_path_retires_the_examples_of_the_version_it_promotes(swap):
    promoted = asyncio.run(swap.act(Action.PROMOTE, "sql-v1"))  # by hand: the admin API and the CLI call act
    assert promoted.examples_retired == Retirement(checked=4, retired=1, reason="1 of 4 for sql-v1")
    assert TypeAdapter(AdapterChange).dump_python(promoted)["active"] == "sql-v1"  # the shape the API answers
    asyncio.run(swap.act(Action.CANARY, "sql-v2", share=0.2))
    asyncio.run(swap.promote_canary("sql", reason="better on live traffic"))  # the canary watcher's path
    assert swap.retired == ["sql-v1", "sql-v2"]
    canary = swap.store.adapter("sql-v2").canary
    assert (canary.outcome, canary.retired) == ("promoted", Retirement(checked=4, retired=1, reason="1 of 4 for sql-v2"))
    assert [swap.store.adapter(v).status for v in ("sql-v1", "sql-v2")] == ["previous", "active"]
    rolled = asyncio.run(swap.act(Action.ROLLBACK, "sql"))  # a rollback promotes nothing new: it retires no example
    assert rolled.examples_retired is None
    assert swap.retired == ["sql-v1", "sql-v2"]
    assert [swap.store.adapter(v).status for v in ("sql-v1", "sql-v2")] == ["active", "rolled_back"]


def test_promotions_and_rollbacks_keep_one_previous_version(swap):
    """The version a rollback returns to is `previous`; one pushed further back is `retired`, and a
    rollback that makes it the next one to return to makes it `previous` again."""
    def statuses():
        return [swap.store.adapter(f"sql-v{n}").status for n in (1, 2, 3)]
    for version in ("sql-v1", "sql-v2", "sql-v3"):
        asyncio.run(swap.act(Action.PROMOTE, version))
    assert statuses() == ["retired", "previous", "active"] and swap.store.route("sql").previous == "sql-v2"
    asyncio.run(swap.act(Action.ROLLBACK, "sql"))
    assert statuses() == ["previous", "active", "rolled_back"] and swap.store.route("sql").previous == "sql-v1"
    asyncio.run(swap.act(Action.PROMOTE, "sql-v3"))  # by hand, from rolled back
    assert statuses() == ["retired", "previous", "active"]
    asyncio.run(swap.act(Action.PROMOTE, "sql-v2"))  # the previous version, by hand
    assert statuses() == ["retired", "active", "previous"] and swap.store.route("sql").previous == "sql-v3"


def test_a_store_written_before_previous_existed_still_rolls_back(swap):
    """Older stores hold a superseded version as `retired`: a rollback returns to it as before."""
    swap.store.metas["sql-v1"] = replace(swap.store.metas["sql-v1"], status="retired")
    swap.store.metas["sql-v2"] = replace(swap.store.metas["sql-v2"], status="active")
    swap.store.route_of["sql"] = Route(active="sql-v2", previous="sql-v1")
    asyncio.run(swap.act(Action.ROLLBACK, "sql"))
    assert [swap.store.adapter(v).status for v in ("sql-v1", "sql-v2")] == ["active", "rolled_back"]


def test_a_refused_transition_changes_nothing_and_retires_nothing(swap):
    asyncio.run(swap.act(Action.CANARY, "sql-v1", share=0.2))
    aborted = asyncio.run(swap.abort_canary("sql", reason="worse"))
    assert (aborted.rolled_back, aborted.canary, aborted.active) == ("sql-v1", None, None)
    with pytest.raises(TransitionRefused, match="sql-v1 is rejected: only a version not yet served"):
        asyncio.run(swap.act(Action.CANARY, "sql-v1", share=0.2))
    asyncio.run(swap.act(Action.PROMOTE, "sql-v2"))
    with pytest.raises(TransitionRefused, match="already the active version"):
        asyncio.run(swap.act(Action.PROMOTE, "sql-v2"))
    assert swap.retired == ["sql-v2"] and swap.store.route("sql").active == "sql-v2"
    assert [swap.store.adapter(v).status for v in ("sql-v1", "sql-v2", "sql-v3")] == ["rejected", "active", "candidate"]


def test_the_api_answers_a_refused_transition_with_409_and_an_unknown_version_with_404():
    from common.settings import load_settings
    from common.store import Store
    from router.engine_client import EnginePool
    from router.route_table import RouteTable
    from server.app import create_app
    from server.state import GatewayState
    from tests.unit.test_access import UNREACHABLE

    async def action(name, target, **options):
        if target == "sql-v9":
            raise LookupError(f"unknown adapter version {target!r}")
        raise TransitionRefused(f"{target} is retired: it cannot become canary")
    store = Store("redis://127.0.0.1:9/0")
    pools = {kind: EnginePool(kind, [UNREACHABLE], template=None, probe_timeout_s=0.2) for kind in ("base", "think")}
    client = TestClient(create_app(GatewayState(load_settings(rate_limit_per_minute=0), store, RouteTable(store, poll_s=30), pools,
                                                adapter_action=action)))
    refused = client.post("/v1/adapters/sql/canary", json={"version": "sql-v2", "share": 0.2})
    assert refused.status_code == 409 and refused.json()["error"] == {"type": "conflict", "message": "sql-v2 is retired: it cannot become canary"}
    unknown = client.post("/v1/adapters/sql/promote", params={"version": "sql-v9"})
    assert unknown.status_code == 404 and "sql-v9" in unknown.json()["error"]["message"]


def test_no_unload_acts_between_a_promotions_load_and_its_flip(swap, monkeypatch):
    """A promotion holds the fleet's adapters lock from its load to its route flip: the periodic unload of
    versions off their route (another gateway's, say, which read the routes before the flip) does nothing
    meanwhile, and runs again once the route points at the version."""
    from deploy import hotswap
    passes, during = [], []

    async def off_route(self):
        passes.append(dict(self.store.route_of))
        return []
    monkeypatch.setattr(hotswap.HotSwap, "_unload_off_route", off_route)

    async def loading(*args, **kwargs):
        during.append(await swap.unload_drained())
    monkeypatch.setattr(hotswap, "load_everywhere", loading)
    asyncio.run(swap.act(Action.PROMOTE, "sql-v1"))
    assert during == [[]] and passes == []
    asyncio.run(swap.unload_drained())
    assert passes == [{"sql": Route(active="sql-v1")}]


def test_a_drain_ending_after_its_version_was_promoted_again_keeps_it_loaded(swap, monkeypatch):
    """Rolled back, then promoted again before its drain ended: the drain's unload leaves it loaded."""
    from deploy import hotswap
    unloaded = []

    async def unload(urls, version):
        unloaded.append(version)
    monkeypatch.setattr(hotswap, "unload_everywhere", unload)
    for version in ("sql-v1", "sql-v2"):
        asyncio.run(swap.act(Action.PROMOTE, version))
    asyncio.run(swap.act(Action.ROLLBACK, "sql"))
    asyncio.run(swap._drain_then_unload("sql-v2", "base"))  # the rollback's drain ends: sql-v2 is off the route
    asyncio.run(swap.act(Action.PROMOTE, "sql-v2"))
    asyncio.run(swap._drain_then_unload("sql-v2", "base"))  # a drain that began before the promotion ends after it
    assert unloaded == ["sql-v2"] and swap.store.route("sql").active == "sql-v2"
