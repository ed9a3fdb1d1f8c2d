"""The integration tier's fixtures: the real stack. The bootstrap (DB, datasets, and the tiny
from-scratch models: `TUCANO_BOOTSTRAP_MODEL=tiny`, set here for every process the tests start)
is built once per test session in a temporary data dir (set TUCANO_TEST_DATA_DIR to reuse one
across sessions while developing); an embedded Valkey, the two vLLM engines and a gateway are
started once and shared. `test_pretrained_demo_model.py` builds the pretrained demo model."""
from __future__ import annotations

import asyncio
import os
import time

# Every test process and every `tucano` it starts uses the tiny models: the pretrained demo model
# takes minutes to fine-tune on two cores, and only its own test needs it.
os.environ["TUCANO_BOOTSTRAP_MODEL"] = "tiny"
from pathlib import Path

import pytest

from common.settings import Settings, load_settings


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Settings:
    """Settings of a fully bootstrapped data dir (built by the real `run`)."""
    from demo.bootstrap import run

    data_dir = Path(os.environ.get("TUCANO_TEST_DATA_DIR") or tmp_path_factory.mktemp("tucano-data"))
    settings = load_settings(data_dir=data_dir)
    run(settings)
    return settings


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    from deploy.embedded_redis import EmbeddedRedis

    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="session")
def engines(built, tmp_path_factory):
    """The real vLLM servers (base with runtime LoRA, think), started once per test session."""
    from deploy.vllm_server import VllmServer

    logs = tmp_path_factory.mktemp("engine-logs")
    servers = {
        "base": VllmServer("base", built.base_model_path, lora=True, device="cpu", log_dir=logs),
        "think": VllmServer("think", built.think_model_path, lora=False, device="cpu", log_dir=logs),
    }
    for server in servers.values():
        server.start()
    try:
        for server in servers.values():
            server.wait_ready(timeout_s=400)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def fleet(store, settings, base_urls, think_url=None, drain_seconds: float = 0.0, drain: str = "wait"):
    """The hot-swap over these engines (think_url: the Think model's, for insights adapters), as
    `serve` builds it: a promotion retires the examples the version absorbed."""
    from deploy.hotswap import HotSwap

    return HotSwap.for_settings(store, settings.model_copy(update={"drain_seconds": drain_seconds}), base_urls, think_url, drain)


def make_state(settings, store_url, base_urls, think_url):
    from common.store import Store
    from router.engine_client import ChatTemplate, EnginePool
    from router.route_table import RouteTable
    from server.state import GatewayState

    store = Store(store_url, maxlen=settings.records_stream_maxlen)
    routes = RouteTable(store, poll_s=0.2)
    pools = {
        "base": EnginePool("base", base_urls, ChatTemplate.load(settings.base_model_path), routed_adapters=lambda: routes.served("base")),
        "think": EnginePool("think", [think_url], ChatTemplate.load(settings.think_model_path),
                            routed_adapters=lambda: routes.served("think")),
    }
    hotswap = fleet(store, settings, base_urls, think_url, drain_seconds=1.0, drain="background")
    return GatewayState(settings, store, routes, pools, adapter_action=hotswap.act)


class RunningServer:
    """uvicorn serving an app on a free loopback port, in a thread."""

    def __init__(self, app):
        import threading

        import uvicorn

        from common.processes import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def gateway(built, redis_url, engines):
    from server.app import create_app

    settings = load_settings(data_dir=built.data_dir, redis_url=redis_url)
    state = make_state(settings, redis_url, [engines["base"].url], engines["think"].url)
    with RunningServer(create_app(state)) as running:
        running.state = state
        yield running


def loop_settings(built, redis_url, **overrides):
    # task_training={}: every task trains with the general settings a test sets (the defaults' own are the demo model's)
    # train_idle_budget_factor=1: each test's budget is what it is sized for (the idle engines would stretch it up to 4x;
    # tests/unit/test_idle_budget.py and test_served_groups.py's probe check cover the stretch)
    values = dict(data_dir=built.data_dir, redis_url=redis_url, min_records_per_task=8, train_time_budget_s=25, task_training={},
                  train_idle_budget_factor=1.0,
                  drain_seconds=0.5, canary_share=0.0,
                  gate_max_rows=48, gate_min_rows=16, shadow_records=12, min_sft_examples=8, min_dpo_pairs=8, min_kto_examples=8)
    values.update(overrides)
    return load_settings(**values)


def fleet_for(settings, store, gateway):
    return fleet(store, settings, [e.url for e in gateway.state.pools["base"].engines],
                 gateway.state.pools["think"].engines[0].url, drain_seconds=0.5)


@pytest.fixture(scope="module")
def loop(built, redis_url, gateway, engines):
    store = gateway.state.store
    settings = loop_settings(built, redis_url)
    store.register_engines("base", [e.url for e in gateway.state.pools["base"].engines], engines["base"].numerics)
    store.register_engines("think", [gateway.state.pools["think"].engines[0].url], engines["think"].numerics)
    yield settings, store
    # the session's gateway is shared: what a round here promoted is rolled back, so later modules
    # find every task served by the base model again
    from deploy.hotswap import ROLLBACK_DEPTH

    hotswap = fleet_for(settings, store, gateway)
    for task in list(store.routes()[1]):
        for _ in range(ROLLBACK_DEPTH + 1):  # each rollback goes one promotion back, down to the base model
            if not store.route(task).active:
                break
            asyncio.run(hotswap.rollback(task))
        assert not store.route(task).active, store.route(task)
    time.sleep(0.5)
