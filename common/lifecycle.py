"""An adapter version's life: its nine statuses, the only transitions between them, and one typed
function per transition. Every status a version is given is given here; `Store.update_adapter`
refuses any other change (`TransitionRefused`), atomically with the write, so a round, the canary
watcher, the admin API and the CLI cannot disagree on what may follow what.

    candidate --its gate passes---------------------------------------------------> gated
    gated --shadow replay finds it no worse---------------------------------------> shadowed
    candidate, gated, shadowed --the gate or shadow replay fails, trained is not
        served, or its round died-------------------------------------------------> rejected
    candidate, gated, shadowed --a canary is configured or asked for by hand------> canary
    candidate, gated, shadowed, canary --promoted (a round, the canary's verdict,
        or by hand)---------------------------------------------------------------> active
    canary --its verdict or a person aborts it------------------------------------> rejected
    active --another version is promoted: a rollback would return to it-----------> previous
    active --rolled back----------------------------------------------------------> rolled_back
    previous --a later promotion pushes it further back---------------------------> retired
    retired --a rollback makes it the version the next rollback returns to--------> previous
    previous, retired, rejected, rolled_back --promoted by hand, or a rollback
        returns to it-------------------------------------------------------------> active

A version promoted by hand skips the statuses a round gives (a person's decision is the gate).
What the gate and shadow replay found is kept on the version too (`AdapterMeta.gate`). Stores
written before `gated`, `shadowed`, `previous` and `rolled_back` existed hold only the other five:
there a superseded or rolled-back version reads `retired`, which may still become active or
previous, so their rollbacks work as they did. A promotion retires the examples the version
absorbed (`trainer/retire.py`; none where its gate judged it both ways and chose the examples)
whichever path it came by: `deploy.hotswap.HotSwap.promote` runs it
after every flip, and each path promotes through it.
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
    GATED = "gated"
    SHADOWED = "shadowed"
    CANARY = "canary"
    ACTIVE = "active"
    PREVIOUS = "previous"
    REJECTED = "rejected"
    RETIRED = "retired"
    ROLLED_BACK = "rolled_back"


JUDGED = frozenset({Status.CANDIDATE, Status.GATED, Status.SHADOWED})
"""A version between its training and its verdict: nothing serves it yet."""
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.CANDIDATE: frozenset({Status.GATED, Status.REJECTED, Status.CANARY, Status.ACTIVE}),
    Status.GATED: frozenset({Status.SHADOWED, Status.REJECTED, Status.CANARY, Status.ACTIVE}),
    Status.SHADOWED: frozenset({Status.REJECTED, Status.CANARY, Status.ACTIVE}),
    Status.CANARY: frozenset({Status.ACTIVE, Status.REJECTED}),
    Status.ACTIVE: frozenset({Status.PREVIOUS, Status.ROLLED_BACK}),
    Status.PREVIOUS: frozenset({Status.ACTIVE, Status.RETIRED}),
    Status.RETIRED: frozenset({Status.ACTIVE, Status.PREVIOUS}),
    Status.REJECTED: frozenset({Status.ACTIVE}),
    Status.ROLLED_BACK: frozenset({Status.ACTIVE}),
}
STATUSES = tuple(status.value for status in Status)
OFF_ROUTE = frozenset({Status.PREVIOUS, Status.RETIRED, Status.REJECTED, Status.ROLLED_BACK})
"""Statuses of a version no route serves: engines unload it once its drain is over (a rollback to
a previous version loads it again)."""


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


def pass_gate(store: Store, version: str, reason: str) -> AdapterMeta:
    """A candidate its gate found better than the version it would replace."""
    return store.update_adapter(version, status=Status.GATED, reason=reason)


def pass_shadow(store: Store, version: str, reason: str) -> AdapterMeta:
    """A gated version that shadow replay of recent traffic found no worse."""
    return store.update_adapter(version, status=Status.SHADOWED, reason=reason)


def reject(store: Store, version: str, reason: str) -> AdapterMeta:
    """A version being judged that failed its gate, shadow replay or load check, or whose round
    died; or a canary rolled back."""
    return store.update_adapter(version, status=Status.REJECTED, reason=reason)


def start_canary(store: Store, version: str, reason: str) -> AdapterMeta:
    """A version not yet served, serving a share of its task's traffic beside the active version."""
    return store.update_adapter(version, status=Status.CANARY, reason=reason)


def activate(store: Store, version: str, reason: str) -> AdapterMeta:
    """The version its task's route now serves (promoted, or returned to by a rollback)."""
    return store.update_adapter(version, status=Status.ACTIVE, reason=reason)


def supersede(store: Store, version: str, reason: str) -> AdapterMeta:
    """The version a rollback of its task would return to: the active one another replaced, or a
    retired one a rollback brought back to that place."""
    return store.update_adapter(version, status=Status.PREVIOUS, reason=reason)


def retire(store: Store, version: str, reason: str) -> AdapterMeta:
    """A previous version pushed further back by a later promotion (its route keeps it for a
    second rollback)."""
    return store.update_adapter(version, status=Status.RETIRED, reason=reason)


def roll_back(store: Store, version: str, reason: str) -> AdapterMeta:
    """An active version a rollback took off its route."""
    return store.update_adapter(version, status=Status.ROLLED_BACK, reason=reason)
