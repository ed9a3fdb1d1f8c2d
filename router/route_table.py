"""The routing table as a gateway sees it: task -> the adapter version its `active` alias (or a
canary share) points at, kept in memory and refreshed by a background poll of one Redis
counter, so a flip is seen within `poll_s` without a Redis round trip on every request. With
the routes it keeps where each routed version's files are (`served`): the engine pools load a
routed version into any engine that lacks it before it takes traffic, and which routed versions
are served without the team's examples (`AdapterMeta.shows_examples`)."""
from __future__ import annotations

import logging
import random
import threading

import redis

from common.records import Route
from common.store import Store
from tasks import TASK_ENGINE

log = logging.getLogger(__name__)


class RouteTable:
    def __init__(self, store: Store, poll_s: float = 0.25):
        self.store = store
        self.poll_s = poll_s
        self.version = -1
        self.routes: dict[str, Route] = {}
        self.adapter_paths: dict[str, dict[str, str]] = {}  # engine kind -> routed version -> its files
        self.alone: frozenset[str] = frozenset()  # routed versions served without the team's examples
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        version = self.store.routes_version()
        if version != self.version:
            version, routes = self.store.routes()
            self.adapter_paths = self.store.routed_adapters(routes, TASK_ENGINE)
            self.alone = frozenset(v for route in routes.values() for v in route.served() if not self.store.shows_examples(v))
            self.version, self.routes = version, routes

    def served(self, kind: str) -> dict[str, str]:
        """The versions routes point at that engines of `kind` must serve, with their files."""
        return self.adapter_paths.get(kind, {})

    def start(self) -> RouteTable:
        try:
            self.refresh()
        except redis.RedisError as error:
            log.warning("routing table not loaded yet: %s", error)
        self._thread = threading.Thread(target=self._run, name="route-poll", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.refresh()
            except redis.RedisError as error:  # keep serving the last known routes
                log.warning("route poll failed: %s", error)

    def shows_examples(self, version: str | None) -> bool:
        """Whether a request this version serves shows the team's examples (the base model's do)."""
        return version not in self.alone

    def stop(self) -> None:
        self._stop.set()

    def adapter_for(self, task: str) -> tuple[str | None, str]:
        """The version that serves this request and its arm: the canary for its share of traffic,
        else the active version (None and "base" while the task has none)."""
        route = self.routes.get(task) or Route()
        if route.canary and route.canary_share > 0 and random.random() < route.canary_share:
            return route.canary, "canary"
        return route.active, "active" if route.active else "base"
