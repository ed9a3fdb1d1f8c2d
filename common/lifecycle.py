"""An adapter version's life: its statuses, the only transitions between them, and one typed
function per transition. Every status a version is given is given here; `Store.update_adapter`
refuses any other change (`TransitionRefused`), atomically with the write, so a round, the canary
watcher, the admin API and the CLI cannot disagree on what may follow what.

    candidate --gate or shadow replay fails, trained is not served, its round died--> rejected
    candidate --passes, a canary is configured or asked for by hand-----------------> canary
    candidate, canary --promoted (by a round, the canary's verdict or by hand)------> active
    canary --its verdict or a person aborts it--------------------------------------> rejected
    active --another version is promoted, or it is rolled back----------------------> retired
    retired, rejected --promoted by hand, or a rollback returns to it---------------> active

What the gate and shadow replay found is kept on the version (`AdapterMeta.gate`), not as a
status of its own: a version between training and its verdict is a candidate, and the records of
earlier releases name only these five. A promotion retires the examples the version absorbed
(`trainer/retire.py`) whichever path it came by: `deploy.hotswap.HotSwap.promote` runs it after
every flip, and each path promotes through it.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from common.records import AdapterMeta
from common.rounds import DOCSTRINGS, Retirement


class Store(Protocol):
    """What a transition writes through: `common.store.Store.update_adapter`, which checks it here."""

    def update_adapter(self, version: str, status: str | None = None, reason: str | None = None, **changes) -> AdapterMeta: ...


class Action(StrEnum):
    """What a person may do to a task's versions (the admin API and `tucano adapters`), each carried
    out by `deploy.hotswap.HotSwap.act`: promote a version, roll a task back, start a canary of a
    version, or promote or abort a task's canary."""
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    CANARY = "canary"
    CANARY_PROMOTE = "canary-promote"
    CANARY_ABORT = "canary-abort"


@dataclass
class AdapterChange:
    """What an adapter action did (promote, rollback, canary start, canary promote or abort): the
    task's route after it, and what the action itself decided."""
    __pydantic_config__ = DOCSTRINGS
    task: str
    active: str | None
    """The version the route serves now; null: the base model."""
    previous: str | None
    """The version a rollback would return to."""
    canary: str | None = None
    """The canary the route also serves, if one runs."""
    canary_share: float | None = None
    """Its share of the task's traffic."""
    rolled_back: str | None = None
    """A canary abort: the version rejected."""
    examples_retired: Retirement | None = None
    """A promotion: the examples the version absorbed, which retrieval no longer shows."""


class Status(StrEnum):
    """A version's status as it is stored (`AdapterMeta.status`)."""
    CANDIDATE = "candidate"
    CANARY = "canary"
    ACTIVE = "active"
    RETIRED = "retired"
    REJECTED = "rejected"


TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.CANDIDATE: frozenset({Status.REJECTED, Status.CANARY, Status.ACTIVE}),
    Status.CANARY: frozenset({Status.ACTIVE, Status.REJECTED}),
    Status.ACTIVE: frozenset({Status.RETIRED}),
    Status.RETIRED: frozenset({Status.ACTIVE}),
    Status.REJECTED: frozenset({Status.ACTIVE}),
}
STATUSES = tuple(status.value for status in Status)
OFF_ROUTE = frozenset({Status.RETIRED, Status.REJECTED})
"""Statuses of a version no route should serve: engines unload it once its drain is over."""


class TransitionRefused(Exception):
    """A change of status (or of a route) that the version's life does not allow from where it is;
    nothing was written. The API answers it with a 409, the CLI with its message."""


def check(version: str, current: str, new: str) -> None:
    """Refuse a change of `version` from status `current` to `new` that `TRANSITIONS` does not allow."""
    for status in (current, new):
        if status not in STATUSES:
            raise TransitionRefused(f"{version}: unknown status {status!r} (statuses: {', '.join(STATUSES)})")
    allowed = TRANSITIONS[Status(current)]
    if Status(new) not in allowed:
        raise TransitionRefused(f"{version} is {current}: it cannot become {new} "
                                f"(from {current}: {', '.join(sorted(allowed)) or 'nothing'})")


def reject(store: Store, version: str, reason: str) -> AdapterMeta:
    """A candidate that failed its gate, shadow replay or load check, or whose round died; or a canary rolled back."""
    return store.update_adapter(version, status=Status.REJECTED, reason=reason)


def start_canary(store: Store, version: str, reason: str) -> AdapterMeta:
    """A candidate serving a share of its task's traffic beside the active version."""
    return store.update_adapter(version, status=Status.CANARY, reason=reason)


def activate(store: Store, version: str, reason: str) -> AdapterMeta:
    """The version its task's route now serves (promoted, or returned to by a rollback)."""
    return store.update_adapter(version, status=Status.ACTIVE, reason=reason)


def retire(store: Store, version: str, reason: str) -> AdapterMeta:
    """A version that served its task and no longer does (another was promoted, or it was rolled back)."""
    return store.update_adapter(version, status=Status.RETIRED, reason=reason)
