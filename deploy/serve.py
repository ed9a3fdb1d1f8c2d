"""`tucano serve`: the whole stack in one process tree, with embedded defaults.

Redis: the configured URL, else an embedded Valkey in the data dir. Models: the configured
ones, else the bootstrap's (built first when missing). Engines: the configured URLs, else a
base and a think vLLM server started here and restarted if they die. Then the gateway
(uvicorn) until SIGTERM/SIGINT, when everything stops cleanly in reverse order.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import ExitStack

import uvicorn

from deploy import adapters as adapter_ops
from deploy.engines import Supervisor, VllmServer, has_gpu
from foundation.config import Settings
from foundation.embedded_redis import EmbeddedRedis
from foundation.store import Store
from router.engines import ChatTemplate, EnginePool
from router.routing import RouteTable
from server.app import create_app
from server.state import GatewayState

log = logging.getLogger("tucano.serve")


def engine_device(settings: Settings) -> str:
    if settings.engine_device != "auto":
        return settings.engine_device
    return "cuda" if has_gpu() else "cpu"


def reload_active_adapters(store: Store, urls: list[str]) -> None:
    """An engine that (re)starts has no adapters: load every active and canary version into it."""
    _, routes = store.routes()
    for task, route in routes.items():
        for version in {route.get("active"), route.get("canary")} - {None}:
            meta = store.adapter(version)
            if meta:
                asyncio.run(adapter_ops.load_everywhere(urls, version, meta["path"]))


def build_state(settings: Settings, redis_url: str, base_urls: list[str], think_url: str) -> GatewayState:
    store = Store(redis_url, maxlen=settings.records_stream_maxlen)
    store.ensure_group()
    pools = {
        "base": EnginePool("base", base_urls, ChatTemplate.load(settings.base_model_path)),
        "think": EnginePool("think", [think_url], ChatTemplate.load(settings.think_model_path)),
    }
    return GatewayState(settings, store, RouteTable(store), pools)


def serve(settings: Settings, say=print) -> None:
    with ExitStack() as stack:
        redis_url = settings.redis_url or stack.enter_context(EmbeddedRedis(settings.redis_dir))
        say(f"redis: {redis_url if settings.redis_url else 'embedded Valkey in ' + str(settings.redis_dir)}")
        servers: list[VllmServer] = []
        device = engine_device(settings)
        if not settings.base_engine_urls:
            servers.append(VllmServer("base", settings.base_model_path, lora=True, device=device, log_dir=settings.root / "logs"))
        if not settings.think_engine_url:
            servers.append(VllmServer("think", settings.think_model_path, lora=False, device=device, log_dir=settings.root / "logs"))
        for server in servers:
            server.start()
            stack.callback(server.stop)
        for server in servers:
            say(f"starting vLLM {server.name} ({device}) on {server.url}; log {server.log_path}")
            server.wait_ready()
        base_urls = settings.base_engine_urls or [s.url for s in servers if s.name == "base"]
        think_url = settings.think_engine_url or next(s.url for s in servers if s.name == "think")
        state = build_state(settings, redis_url, base_urls, think_url)
        reload_active_adapters(state.store, base_urls)
        supervisor = Supervisor(servers, on_restart=lambda s: reload_active_adapters(state.store, [s.url]) if s.lora else None)
        stack.callback(supervisor.stop)
        supervisor.start()
        if settings.train_enabled:
            say("periodic training rounds arrive with issue #5; serving without them")
        say(f"gateway on http://{settings.host}:{settings.port} (OpenAI base URL http://{settings.host}:{settings.port}/v1)")
        server = uvicorn.Server(uvicorn.Config(create_app(state), host=settings.host, port=settings.port, log_level="info"))
        server.run()  # returns on SIGINT/SIGTERM (uvicorn's handlers), then the stack unwinds
