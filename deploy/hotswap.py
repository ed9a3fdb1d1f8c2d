"""Hot-swap: loading adapter versions into every engine of their model under their own immutable
names, verifying each engine answers with them, flipping a task's route (or giving a canary its
share of it), and unloading after a drain.

Trained is served: a version that carries a probe (`common.records.LogprobProbe`, computed by the
trainer when it saved the version) is checked on each engine as it is loaded: the engine's prompt
logprobs of the probe's tokens under the version must be within `served_logprob_tolerance` of the
trainer's, or the version is unloaded everywhere and nothing flips (`TrainedNotServed`, with the
gap in its message; a round rejects the candidate with it).

Names are never reused and never loaded in place (`load_inplace` has open vLLM bugs: stale
prefix cache, re-reads from disk). If any engine fails to load, the ones that did are unloaded
and nothing flips. Requests already running finish on the version they started with: the old
version is unloaded only after `drain_seconds`. Rollback flips back one promotion, re-loading
the version if needed; the route keeps the versions active before (`earlier`, up to
ROLLBACK_DEPTH), so a second rollback goes further back instead of undoing the first.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import httpx

from common import lifecycle
from common.lifecycle import Action, AdapterChange, TransitionRefused
from common.records import AdapterMeta, LogprobProbe, Route, TrainedNotServed
from common.rounds import CanaryRecord, Retirement
from common.settings import SERVED_LOGPROB_TOLERANCE, Settings
from common.store import Store, content_sha256
from common.tasks import EngineKind
from tasks import TASK_ENGINE
from trainer import retire


class AdapterLoadError(ConnectionError):
    """An engine refused or could not serve a version; nothing flipped. (A ConnectionError, so the
    gateway answers 503 without importing deploy/.)"""


class PromotionRefused(TransitionRefused):
    """The version cannot be promoted (files unreadable, another base model, nothing to roll back to)."""


RetireExamples = Callable[[AdapterMeta], Awaitable[Retirement]]
"""What a promotion runs after its flip: retire the examples the version absorbed (`trainer.retire`)."""


def check_adapter_files(meta: AdapterMeta, base_model: str) -> None:
    """Refuse, with a message a person can act on, a version whose files engines could not load
    or that was trained on another base model."""
    version, directory = meta.version, Path(meta.path or "")
    if not directory.is_dir() or not os.access(directory, os.R_OK | os.X_OK):
        raise PromotionRefused(f"{version}: adapter dir {directory} is missing or unreadable")
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
        weights_readable = os.access(directory / "adapter_model.safetensors", os.R_OK)
    except (OSError, ValueError) as error:
        raise PromotionRefused(f"{version}: adapter_config.json in {directory} is unreadable ({error})") from None
    if not weights_readable:
        raise PromotionRefused(f"{version}: {directory / 'adapter_model.safetensors'} is missing or unreadable")
    trained_on = str(config.get("base_model_name_or_path") or "")
    if _model_id(trained_on) != _model_id(base_model):
        raise PromotionRefused(f"{version} was trained on base model {trained_on!r}, but the engines serve {base_model!r}")
    if meta.sha256 and content_sha256(directory) != meta.sha256:
        raise PromotionRefused(f"{version}: the files in {directory} changed since the version was registered")


def _model_id(name: str) -> str:
    path = Path(name)
    return str(path.resolve()) if path.exists() else name


async def _post(client: httpx.AsyncClient, url: str, path: str, body: dict) -> httpx.Response:
    return await client.post(f"{url}{path}", json=body, timeout=120)


async def load_everywhere(urls: list[str], version: str, path: str, probe: LogprobProbe | None = None,
                         tolerance: float = SERVED_LOGPROB_TOLERANCE) -> None:
    loaded: list[str] = []
    async with httpx.AsyncClient() as client:
        try:
            for url in urls:
                response = await _post(client, url, "/v1/load_lora_adapter", {"lora_name": version, "lora_path": path})
                if response.status_code != 200 and "already" not in response.text:
                    raise AdapterLoadError(f"{url} refused {version}: HTTP {response.status_code} {response.text[:300]}")
                if response.status_code != 200:
                    await _same_adapter_loaded(client, url, version, path)
                loaded.append(url)
                check = await _post(client, url, "/v1/completions", {"model": version, "prompt": "ok", "max_tokens": 1})
                if check.status_code != 200:
                    raise AdapterLoadError(f"{url} loaded {version} but does not answer with it: {check.text[:300]}")
                if probe is not None:
                    gap = probe.served_gap(await served_logprobs(client, url, version, probe))
                    if gap > tolerance:
                        raise TrainedNotServed(f"{url} serves {version} {gap:.3f} nats (mean per token) from the trainer's logprobs "
                                               f"of its probe, more than the tolerance of {tolerance:g} (TUCANO_SERVED_LOGPROB_TOLERANCE)")
        except (httpx.HTTPError, AdapterLoadError, TrainedNotServed) as error:
            for url in loaded:
                with contextlib.suppress(httpx.HTTPError):
                    await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
            if isinstance(error, TrainedNotServed):
                raise
            raise AdapterLoadError(str(error)) from None


async def served_logprobs(client: httpx.AsyncClient, url: str, version: str, probe: LogprobProbe) -> list[float]:
    """The engine's logprob of each of the probe's scored tokens under `version` (vLLM's prompt
    logprobs of the probe's token ids: the same whatever the sampling, as no sampling touches them)."""
    response = await _post(client, url, "/v1/completions", {"model": version, "prompt": probe.token_ids, "max_tokens": 1,
                                                            "temperature": 0.0, "prompt_logprobs": 0})
    if response.status_code != 200:
        raise AdapterLoadError(f"{url} gave no prompt logprobs for {version}: HTTP {response.status_code} {response.text[:300]}")
    positions = response.json()["choices"][0].get("prompt_logprobs") or []
    try:
        return [float(positions[i][str(probe.token_ids[i])]["logprob"]) for i in range(probe.scored_from, len(probe.token_ids))]
    except (IndexError, KeyError, TypeError) as error:
        raise AdapterLoadError(f"{url}'s prompt logprobs for {version} do not cover the probe's tokens ({error!r})") from None


async def _same_adapter_loaded(client: httpx.AsyncClient, url: str, version: str, path: str) -> None:
    """An engine that already holds `version` holds it from `path`: loading a version twice is a
    no-op, but an engine shared with another registry (a benchmark's scratch one, say, whose
    numbering also starts at v1) can hold another adapter under the same name, and would serve it."""
    response = await client.get(f"{url}/v1/models", timeout=30)
    if response.status_code != 200:
        raise AdapterLoadError(f"{url} already holds {version}, and its /v1/models (HTTP {response.status_code}) does not say from where")
    roots = {card["id"]: card.get("root") for card in response.json()["data"]}
    if roots.get(version) != path:
        raise AdapterLoadError(f"{url} already holds an adapter named {version}, from {roots.get(version)!r}, not {path!r}")


async def unload_everywhere(urls: list[str], version: str) -> None:
    async with httpx.AsyncClient() as client:
        for url in urls:
            try:
                await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
            except httpx.HTTPError:
                pass  # an engine that is down has nothing loaded


ROLLBACK_DEPTH = 16  # how many promotions back successive rollbacks can go
ADAPTERS_LOCK_S = 300.0
"""How long a load for a route change may hold the fleet's adapters lock (`Store.adapters_lock`), and how
long another waits for it: loading checks every engine's logprobs, seconds per engine even on CPUs."""


def _earlier_actives(route: Route) -> list[str]:
    """The versions active before the route's `previous`, newest first: a second rollback goes to
    the version before that, not back to the one just rolled back from. Below the base model
    (no active version) there is nothing to go back to."""
    if not route.active or not route.previous:
        return []
    return [route.previous, *route.earlier][:ROLLBACK_DEPTH]


def _change(task: str, route: Route, **decided) -> AdapterChange:
    """What an adapter action did, in the one shape the API and the CLI answer."""
    return AdapterChange(task, route.active, route.previous, route.canary, route.canary_share, **decided)


DRAINS = ("wait", "background", "later")
TASK_ENGINE_KINDS = tuple(dict.fromkeys(TASK_ENGINE.values()))


class HotSwap:
    """Promote, roll back and canary versions across every engine of a task's model (the base
    servers for extraction, sql and push; the think servers for insights).

    `urls`: fixed engine URLs per kind (from settings), else the engines `serve` registered in
    Redis. An old version is unloaded after the drain: `drain="wait"` (the CLI) waits for it
    before returning, `"background"` (the gateway) leaves it to a task of its event loop, and
    `"later"` (a training round, which must not sit through a drain per task) leaves it to
    `unload_drained`, which `serve` runs every few seconds."""

    def __init__(self, store: Store, models: dict[str, str], urls: dict[str, list[str]] | None, drain_seconds: float,
                 retire_examples: RetireExamples, drain: str = "wait", served_tolerance: float = SERVED_LOGPROB_TOLERANCE):
        if drain not in DRAINS:
            raise ValueError(f"drain must be one of {DRAINS}")
        self.store, self.models, self.fixed_urls = store, models, {k: v for k, v in (urls or {}).items() if v}
        self.retire_examples = retire_examples
        self.drain_seconds, self.drain, self.served_tolerance = drain_seconds, drain, served_tolerance
        self._background: set[asyncio.Task] = set()

    @classmethod
    def for_settings(cls, store: Store, settings: Settings, base_urls: list[str] | None = None, think_url: str | None = None,
                     drain: str = "wait") -> HotSwap:
        """The fleet as settings describe it: configured engine URLs, else those `serve` registered."""
        base_urls = base_urls or settings.base_engine_urls
        think_url = think_url or settings.think_engine_url
        swap = cls(store, {EngineKind.BASE: settings.base_model_path, EngineKind.THINK: settings.think_model_path},
                   {EngineKind.BASE: base_urls, EngineKind.THINK: [think_url] if think_url else []}, settings.drain_seconds,
                   lambda meta: retire.retire_after_promotion(settings, store, swap.urls(TASK_ENGINE[meta.task]), meta, settings.seed),
                   drain, settings.served_logprob_tolerance)
        return swap

    def urls(self, kind: str) -> list[str]:
        return list(self.fixed_urls.get(kind) or self.store.engine_urls(kind))

    async def load(self, version: str, path: str, kind: str) -> None:
        """Load a version into every engine of its kind under its own name (no route points at it
        yet), checking that each serves what was trained."""
        meta = self.store.adapter(version)
        await self._load_checked(self.urls(kind), version, path, meta)

    async def _load_checked(self, urls: list[str], version: str, path: str, meta: AdapterMeta | None) -> None:
        try:
            await load_everywhere(urls, version, path, meta.probe if meta else None, self.served_tolerance)
        except TrainedNotServed as error:
            self.store.update_adapter(version, reason=f"trained is not served: {error}")
            raise

    async def unload(self, version: str, kind: str) -> None:
        await unload_everywhere(self.urls(kind), version)

    def _meta(self, version: str) -> AdapterMeta:
        meta = self.store.adapter(version)
        if meta is None:
            raise LookupError(f"unknown adapter version {version!r}")
        check_adapter_files(meta, self.models[TASK_ENGINE[meta.task]])
        return meta

    @contextlib.asynccontextmanager
    async def _adapters_held(self):
        """Hold the fleet's adapters lock: a version loaded to be routed is not unloaded by an unload that
        decided before the route pointed at it (another gateway's `unload_drained`, a drain ending)."""
        lock = self.store.adapters_lock(ADAPTERS_LOCK_S)
        if not await asyncio.to_thread(lock.acquire, blocking=True, blocking_timeout=ADAPTERS_LOCK_S):
            raise PromotionRefused(f"another process held the fleet's adapters lock for {ADAPTERS_LOCK_S:.0f} s: nothing changed")
        try:
            yield
        finally:
            if lock.owned():
                lock.release()

    async def _drain_then_unload(self, version: str, kind: str) -> None:
        """After the drain, unload `version` unless a route points at it again (promoted meanwhile)."""
        await asyncio.sleep(self.drain_seconds)
        async with self._adapters_held():
            if version not in self._routed():
                await unload_everywhere(self.urls(kind), version)

    def _routed(self) -> set[str]:
        return {version for route in self.store.routes()[1].values() for version in route.served()}

    async def _unload_after_drain(self, version: str | None, keep: set, kind: str) -> None:
        if version is None or version in keep or self.drain == "later":
            return
        if self.drain == "wait":
            await self._drain_then_unload(version, kind)
        else:
            job = asyncio.get_running_loop().create_task(self._drain_then_unload(version, kind))
            self._background.add(job)
            job.add_done_callback(self._background.discard)

    async def promote(self, version: str, reason: str = "promoted") -> AdapterChange:
        """Make a version active, then retire the examples it absorbed (every path that promotes
        comes here: a round, the canary's verdict, the admin API, the CLI). While a canary runs,
        only the canary itself can be promoted."""
        meta = self._meta(version)
        task, kind = meta.task, TASK_ENGINE[meta.task]
        route = self.store.route(task)
        if route.active == version:
            raise PromotionRefused(f"{version} is already the active version of {task}")
        if route.canary and route.canary != version:
            raise PromotionRefused(f"a canary of {task} ({route.canary}) is running: promote or abort it first")

        def flip(current: Route) -> Route:
            if current.canary and current.canary != version:
                raise PromotionRefused(f"a canary of {task} ({current.canary}) started meanwhile")
            return Route(active=version, previous=current.active, earlier=_earlier_actives(current))
        async with self._adapters_held():
            await self._load_checked(self.urls(kind), version, meta.path, meta)
            flipped = self.store.change_route(task, flip)
        lifecycle.activate(self.store, version, reason)
        if flipped.previous:
            lifecycle.supersede(self.store, flipped.previous, f"{version} was promoted")
        pushed_back = self.store.adapter(flipped.earlier[0]) if flipped.earlier else None
        if pushed_back and pushed_back.status == lifecycle.Status.PREVIOUS:
            lifecycle.retire(self.store, pushed_back.version, f"{version} was promoted after {flipped.previous}")
        await self._unload_after_drain(flipped.previous, {version}, kind)
        retired = await self.retire_examples(self.store.adapter(version))
        return _change(task, flipped, examples_retired=retired)

    async def rollback(self, task: str) -> AdapterChange:
        route = self.store.route(task)
        current, previous, kind = route.active, route.previous, TASK_ENGINE[task]
        if route.canary:
            raise PromotionRefused(f"a canary of {task} ({route.canary}) is running: abort it first")
        if current is None:
            raise PromotionRefused(f"{task} has no active version to roll back from")
        meta = self._meta(previous) if previous is not None else None

        def back(route_now: Route) -> Route:
            if route_now.active != current or route_now.previous != previous or route_now.canary:
                raise PromotionRefused(f"the route of {task} changed during the rollback: nothing was flipped")
            earlier = route_now.earlier
            return Route(active=previous, previous=earlier[0] if earlier else None, earlier=earlier[1:])
        async with self._adapters_held():
            if meta is not None:
                await self._load_checked(self.urls(kind), previous, meta.path, meta)
            flipped = self.store.change_route(task, back)
        lifecycle.roll_back(self.store, current, "rolled back")
        if previous is not None:
            lifecycle.activate(self.store, previous, f"{current} was rolled back")
        next_back = self.store.adapter(flipped.previous) if flipped.previous else None
        if next_back and next_back.status == lifecycle.Status.RETIRED:
            lifecycle.supersede(self.store, next_back.version, f"a rollback of {task} would return to it after {previous}")
        await self._unload_after_drain(current, {previous}, kind)
        return _change(task, flipped)

    async def start_canary(self, version: str, share: float) -> AdapterChange:
        """Serve a candidate to `share` of its task's traffic beside the active version."""
        if not 0 < share < 1:
            raise ValueError(f"a canary's share is between 0 and 1 (exclusive), not {share}")
        meta = self._meta(version)
        task, kind = meta.task, TASK_ENGINE[meta.task]
        if meta.status not in lifecycle.JUDGED:
            raise PromotionRefused(f"{version} is {meta.status}: only a version not yet served (candidate, gated or shadowed) "
                                   "can be a canary")

        def start(current: Route) -> Route:
            if current.canary:
                raise PromotionRefused(f"a canary of {task} ({current.canary}) is already running")
            return replace(current, canary=version, canary_share=share, canary_started=time.time(), canary_since=since)
        async with self._adapters_held():
            await self._load_checked(self.urls(kind), version, meta.path, meta)
            since = self.store.last_record_id()
            try:
                route = self.store.change_route(task, start)
            except PromotionRefused:
                await unload_everywhere(self.urls(kind), version)
                raise
        lifecycle.start_canary(self.store, version, f"canary at {share:.0%} of {task} traffic")
        return _change(task, route)

    def _canary(self, task: str) -> str:
        canary = self.store.route(task).canary
        if not canary:
            raise PromotionRefused(f"{task} has no canary running")
        return canary

    async def promote_canary(self, task: str, reason: str = "promoted by hand") -> AdapterChange:
        version = self._canary(task)
        result = await self.promote(version, f"canary promoted: {reason}")
        canary = replace(self.store.adapter(version).canary or CanaryRecord(), outcome="promoted", reason=reason,
                         retired=result.examples_retired)
        self.store.update_adapter(version, canary=canary)
        return result

    async def abort_canary(self, task: str, reason: str = "aborted by hand") -> AdapterChange:
        """End the canary: all traffic back to the active version; the canary version is rejected."""
        version = self._canary(task)

        route = self.store.change_route(task, Route.without_canary)
        meta = lifecycle.reject(self.store, version, f"canary rolled back: {reason}")
        self.store.update_adapter(version, canary=replace(meta.canary or CanaryRecord(), outcome="rolled back", reason=reason))
        await self._unload_after_drain(version, {route.active}, TASK_ENGINE[task])
        return _change(task, route, rolled_back=version)

    async def unload_drained(self) -> list[str]:
        """Unload from every engine the versions off their route (`lifecycle.OFF_ROUTE`) whose drain is over (what a
        round left loaded: it does not wait for drains). A version a route points at stays. While another process
        loads a version to route it (it holds the adapters lock), this pass does nothing: the next one will."""
        lock = self.store.adapters_lock(ADAPTERS_LOCK_S)
        if not lock.acquire(blocking=False):
            return []
        try:
            return await self._unload_off_route()
        finally:
            if lock.owned():
                lock.release()

    async def _unload_off_route(self) -> list[str]:
        routed = self._routed()
        now, unloaded = time.time(), []
        async with httpx.AsyncClient(timeout=30) as client:
            for kind in TASK_ENGINE_KINDS:
                for url in self.urls(kind):
                    try:
                        listed = (await client.get(f"{url}/v1/models")).json()["data"]
                    except (httpx.HTTPError, ValueError, KeyError):
                        continue  # an engine that is down has nothing loaded
                    for version in (m["id"] for m in listed if m.get("parent")):
                        meta = self.store.adapter(version)
                        changed = meta.history[-1].at if meta and meta.history else 0.0
                        if meta and version not in routed and meta.status in lifecycle.OFF_ROUTE \
                                and now - changed >= self.drain_seconds:
                            with contextlib.suppress(httpx.HTTPError):
                                await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
                                unloaded.append(f"{version}@{url}")
        return unloaded

    async def act(self, action: Action, target: str, share: float | None = None) -> AdapterChange:
        """A person's action (the admin API and the CLI): promote VERSION, rollback TASK, canary
        VERSION at `share`, and canary-promote or canary-abort TASK."""
        match Action(action):
            case Action.PROMOTE:
                return await self.promote(target)
            case Action.ROLLBACK:
                return await self.rollback(target)
            case Action.CANARY:
                if share is None:
                    raise ValueError("a canary needs its share of the traffic")
                return await self.start_canary(target, share)
            case Action.CANARY_PROMOTE:
                return await self.promote_canary(target)
            case Action.CANARY_ABORT:
                return await self.abort_canary(target)
