"""Hot-swap: loading adapter versions into every base engine under their own immutable names,
verifying each engine answers with them, flipping a task's route, and unloading after a drain.

Names are never reused and never loaded in place (`load_inplace` has open vLLM bugs: stale
prefix cache, re-reads from disk). If any engine fails to load, the ones that did are unloaded
and nothing flips. Requests already running finish on the version they started with: the old
version is unloaded only after `drain_seconds`. Rollback flips back, re-loading if needed.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import httpx

from common.records import AdapterMeta
from common.store import Store, content_sha256


class AdapterLoadError(ConnectionError):
    """An engine refused or could not serve a version; nothing flipped. (A ConnectionError, so the
    gateway answers 503 without importing deploy/.)"""


class PromotionRefused(ValueError):
    """The version cannot be promoted (files unreadable, another base model, nothing to roll back to)."""


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


async def load_everywhere(urls: list[str], version: str, path: str) -> None:
    loaded: list[str] = []
    async with httpx.AsyncClient() as client:
        try:
            for url in urls:
                response = await _post(client, url, "/v1/load_lora_adapter", {"lora_name": version, "lora_path": path})
                if response.status_code != 200 and "already" not in response.text:
                    raise AdapterLoadError(f"{url} refused {version}: HTTP {response.status_code} {response.text[:300]}")
                loaded.append(url)
                check = await _post(client, url, "/v1/completions", {"model": version, "prompt": "ok", "max_tokens": 1})
                if check.status_code != 200:
                    raise AdapterLoadError(f"{url} loaded {version} but does not answer with it: {check.text[:300]}")
        except (httpx.HTTPError, AdapterLoadError) as error:
            for url in loaded:
                with contextlib.suppress(httpx.HTTPError):
                    await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
            raise AdapterLoadError(str(error)) from None


async def unload_everywhere(urls: list[str], version: str) -> None:
    async with httpx.AsyncClient() as client:
        for url in urls:
            try:
                await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
            except httpx.HTTPError:
                pass  # an engine that is down has nothing loaded


async def _drain_then_unload(urls: list[str], version: str, drain_seconds: float) -> None:
    await asyncio.sleep(drain_seconds)
    await unload_everywhere(urls, version)


class HotSwap:
    """Promote and roll back versions across every base engine of the fleet.

    `wait_for_drain=False` (the gateway) unloads the old version in the background after the
    drain; `True` (the CLI, the trainer) waits for it before returning."""

    def __init__(self, store: Store, base_model: str, urls: list[str] | None, drain_seconds: float,
                 wait_for_drain: bool = True):
        self.store, self.base_model, self.fixed_urls = store, base_model, urls
        self.drain_seconds, self.wait_for_drain = drain_seconds, wait_for_drain
        self._background: set[asyncio.Task] = set()

    def urls(self) -> list[str]:
        return list(self.fixed_urls) if self.fixed_urls else self.store.engine_urls("base")

    async def load(self, version: str, path: str) -> None:
        """Load a version into every engine under its own name (no route points at it yet)."""
        await load_everywhere(self.urls(), version, path)

    async def unload(self, version: str) -> None:
        await unload_everywhere(self.urls(), version)

    async def _retire(self, version: str | None, keep: str | None) -> None:
        if version is None or version == keep:
            return
        if self.wait_for_drain:
            await _drain_then_unload(self.urls(), version, self.drain_seconds)
        else:
            job = asyncio.get_running_loop().create_task(_drain_then_unload(self.urls(), version, self.drain_seconds))
            self._background.add(job)
            job.add_done_callback(self._background.discard)

    async def promote(self, version: str) -> dict:
        meta = self.store.adapter(version)
        if meta is None:
            raise LookupError(f"unknown adapter version {version!r}")
        check_adapter_files(meta, self.base_model)
        task = meta.task
        if self.store.routes()[1].get(task, {}).get("active") == version:
            raise PromotionRefused(f"{version} is already the active version of {task}")
        await load_everywhere(self.urls(), version, meta.path)
        route = self.store.set_active(task, version)
        self.store.update_adapter(version, status="active", reason="promoted")
        if route.get("previous"):
            self.store.update_adapter(route["previous"], status="retired", reason=f"{version} was promoted")
        await self._retire(route.get("previous"), keep=version)
        return {"task": task, "active": version, "previous": route.get("previous")}

    async def rollback(self, task: str) -> dict:
        _, routes = self.store.routes()
        route = routes.get(task) or {}
        current, previous = route.get("active"), route.get("previous")
        if current is None:
            raise PromotionRefused(f"{task} has no active version to roll back from")
        if previous is not None:
            meta = self.store.adapter(previous)
            if meta is None:
                raise PromotionRefused(f"the previous version {previous} of {task} is not registered")
            check_adapter_files(meta, self.base_model)
            await load_everywhere(self.urls(), previous, meta.path)
        flipped = self.store.set_active(task, previous)
        self.store.update_adapter(current, status="retired", reason="rolled back")
        if previous is not None:
            self.store.update_adapter(previous, status="active", reason=f"{current} was rolled back")
        await self._retire(current, keep=previous)
        return {"task": task, "active": flipped.get("active"), "previous": flipped.get("previous")}

    async def act(self, action: str, target: str) -> dict:
        """The gateway's admin path: `promote <version>` or `rollback <task>`."""
        return await (self.promote(target) if action == "promote" else self.rollback(target))
