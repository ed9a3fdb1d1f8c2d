"""Loading adapter versions into every base engine under their own immutable names, verifying
each engine answers with them, and flipping a task's route; unloading after a drain.

Names are never reused and never loaded in place (`load_inplace` has open vLLM bugs: stale
prefix cache, re-reads from disk). If any engine fails to load, the ones that did are unloaded
and nothing flips.
"""
from __future__ import annotations

import httpx

from foundation.store import Store


class AdapterLoadError(RuntimeError):
    pass


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
                await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
            raise AdapterLoadError(str(error)) from None


async def unload_everywhere(urls: list[str], version: str) -> None:
    async with httpx.AsyncClient() as client:
        for url in urls:
            try:
                await _post(client, url, "/v1/unload_lora_adapter", {"lora_name": version})
            except httpx.HTTPError:
                pass  # an engine that is down has nothing loaded


async def activate(store: Store, urls: list[str], task: str, version: str, path: str) -> dict:
    """Load a version into every base engine, then point the task's active alias at it."""
    await load_everywhere(urls, version, path)
    return store.set_active(task, version)
