"""Hot-swap against real vLLM and Valkey: promote and roll back under continuous load with zero
failed requests and every record naming the version that served it; promotions that must be
refused (unreadable files, another base model, an engine that cannot load) flip nothing."""
from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time

import httpx
import pytest

from common.records import AdapterMeta, Route
from common.store import content_sha256
from deploy.hotswap import AdapterLoadError, PromotionRefused
from tests.integration.conftest import RunningServer, fleet, make_state
from tests.integration.test_serving import INPUTS, make_lora


def register(store, built, tmp_path, task="extraction", seed=0) -> AdapterMeta:
    version = store.next_adapter_version(task)
    path = make_lora(built.base_model_path, tmp_path / version, seed=seed)
    meta = AdapterMeta(version=version, task=task, path=path, sha256=content_sha256(tmp_path / version))
    store.put_adapter(meta)
    return meta


@pytest.fixture
def swap_gateway(built, redis_url, engines):
    from server.app import create_app

    state = make_state(built.model_copy(update={"redis_url": redis_url}), redis_url, [engines["base"].url], engines["think"].url)
    # a drain longer than any request here, so nothing in flight loses its version
    state.adapter_action = fleet(state.store, built, [engines["base"].url], drain_seconds=8.0,
                                 drain="background").act
    with RunningServer(create_app(state)) as running:
        running.state = state
        yield running
    state.store.change_route("extraction", lambda current: Route())


def test_successive_rollbacks_walk_back_one_promotion_at_a_time(swap_gateway, built, engines, tmp_path):
    """Two promotions, then rollbacks: the first goes to the earlier version, the second to the base
    model (not back to the version just rolled back from), a third is refused."""
    store = swap_gateway.state.store
    hotswap = fleet(store, built, [engines["base"].url], drain_seconds=0.0)
    first, second = register(store, built, tmp_path, seed=21), register(store, built, tmp_path, seed=22)
    for meta in (first, second):
        asyncio.run(hotswap.promote(meta.version))
    assert store.route("extraction").active == second.version
    assert asyncio.run(hotswap.rollback("extraction")).active == first.version
    assert store.adapter(first.version).status == "active" and store.adapter(second.version).status == "rolled_back"
    assert asyncio.run(hotswap.rollback("extraction")).active is None
    with pytest.raises(PromotionRefused, match="no active version"):
        asyncio.run(hotswap.rollback("extraction"))
    assert store.route("extraction").active is None


def test_promote_and_rollback_under_load(swap_gateway, built, tmp_path):
    store, url = swap_gateway.state.store, swap_gateway.url
    meta = register(store, built, tmp_path)
    results: list[tuple[float, int, str | None, str | None]] = []  # (sent at, status, version, record id)
    stop = threading.Event()

    def client():
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                sent = time.monotonic()
                response = http.post(f"{url}/v1/tasks/extraction", json={"input": INPUTS["extraction"], "options": {"max_tokens": 48}})
                body = response.json() if response.status_code == 200 else {}
                results.append((sent, response.status_code, (body.get("route") or {}).get("version"), body.get("id")))

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    promote = httpx.post(f"{url}/v1/adapters/extraction/promote", params={"version": meta.version}, timeout=120)
    flipped_at = time.monotonic()
    time.sleep(4)
    rollback = httpx.post(f"{url}/v1/adapters/extraction/rollback", timeout=120)
    rolled_at = time.monotonic()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join()
    assert promote.status_code == 200 and promote.json()["active"] == meta.version, promote.text
    assert rollback.status_code == 200 and rollback.json()["active"] is None, rollback.text
    assert results and all(status == 200 for _, status, _, _ in results), [r for r in results if r[1] != 200][:3]
    versions = {version for _, _, version, _ in results}
    assert versions == {"base", meta.version}
    # a request sent after a flip was seen (one poll period) is served by the new route
    for sent, _, version, record_id in results:
        if flipped_at + 1.0 < sent < rolled_at:
            assert version == meta.version
        if sent > rolled_at + 1.0 or sent < flipped_at - 5.0:
            assert version == "base"
        record = store.get_record(record_id).record
        assert record.version == version  # the record names the version that served it
    assert store.adapter(meta.version).status == "rolled_back"
    print(f"{len(results)} requests, 0 failed; versions served: {sorted(versions)}")


def test_refused_promotions_flip_nothing(swap_gateway, built, engines, tmp_path):
    store = swap_gateway.state.store
    hotswap = fleet(store, built, [engines["base"].url])
    routes_before = store.routes()[1]

    missing = register(store, built, tmp_path)
    shutil.rmtree(missing.path)
    with pytest.raises(PromotionRefused, match="missing or unreadable"):
        asyncio.run(hotswap.promote(missing.version))

    foreign = register(store, built, tmp_path, seed=1)
    config_path = tmp_path / foreign.version / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen3-0.6B"
    config_path.write_text(json.dumps(config))
    with pytest.raises(PromotionRefused, match=r"trained on base model 'Qwen/Qwen3-0\.6B'"):
        asyncio.run(hotswap.promote(foreign.version))

    tampered = register(store, built, tmp_path, seed=2)
    (tmp_path / tampered.version / "adapter_model.safetensors").write_bytes(b"not weights")
    with pytest.raises(PromotionRefused, match="changed since"):
        asyncio.run(hotswap.promote(tampered.version))

    # an engine that cannot load it (here: one that is not there) -> nothing flips, loaded copies unloaded
    good = register(store, built, tmp_path, seed=3)
    broken_fleet = fleet(store, built, [engines["base"].url, "http://127.0.0.1:9"])
    with pytest.raises(AdapterLoadError):
        asyncio.run(broken_fleet.promote(good.version))
    served = httpx.get(f"{engines['base'].url}/v1/models").json()["data"]
    assert good.version not in {m["id"] for m in served}

    # another adapter under a name an engine already holds (a second registry on shared engines) -> refused, not served
    loaded = register(store, built, tmp_path, seed=4)
    asyncio.run(hotswap.load(loaded.version, loaded.path, "base"))
    asyncio.run(hotswap.load(loaded.version, loaded.path, "base"))  # the same version again: a no-op
    impostor = make_lora(built.base_model_path, tmp_path / "impostor", seed=5)
    with pytest.raises(AdapterLoadError, match=f"already holds an adapter named {loaded.version}"):
        asyncio.run(hotswap.load(loaded.version, impostor, "base"))
    asyncio.run(hotswap.unload(loaded.version, "base"))

    with pytest.raises(LookupError):
        asyncio.run(hotswap.promote("extraction-v999"))
    response = httpx.post(f"{swap_gateway.url}/v1/adapters/extraction/promote", params={"version": "extraction-v999"})
    assert response.status_code == 404
    response = httpx.post(f"{swap_gateway.url}/v1/adapters/extraction/promote", params={"version": foreign.version})
    assert response.status_code == 409 and "trained on base model" in response.json()["error"]["message"]
    assert store.routes()[1] == routes_before


def test_engine_killed_mid_promotion_flips_nothing(swap_gateway, built, engines, tmp_path):
    """A fleet of two real base engines; the second is frozen, then SIGKILLed while its load
    request hangs (the first has already loaded the version): the first unloads it again,
    the route and the version's status are as before, and the gateway keeps serving."""
    import os
    import signal

    from deploy.vllm_server import VllmServer

    second = VllmServer("base-second", built.base_model_path, lora=True, device="cpu", log_dir=tmp_path)
    second.start()
    try:
        second.wait_ready(timeout_s=400)
        store, first_url = swap_gateway.state.store, engines["base"].url
        meta = register(store, built, tmp_path, seed=4)
        routes_before = store.routes()[1]
        both = fleet(store, built, [first_url, second.url])
        os.killpg(second.process.pid, signal.SIGSTOP)
        outcome: dict = {}

        def promote():
            try:
                outcome["result"] = asyncio.run(both.promote(meta.version))
            except Exception as error:
                outcome["error"] = error

        promoting = threading.Thread(target=promote)
        promoting.start()
        deadline = time.monotonic() + 60
        while meta.version not in {m["id"] for m in httpx.get(f"{first_url}/v1/models").json()["data"]}:
            assert time.monotonic() < deadline and promoting.is_alive(), outcome
            time.sleep(0.05)
        os.killpg(second.process.pid, signal.SIGKILL)  # mid-promotion: loaded on one engine, hanging on the other
        promoting.join(timeout=120)
        assert isinstance(outcome.get("error"), AdapterLoadError), outcome
        assert store.routes()[1] == routes_before
        assert store.adapter(meta.version).status == "candidate"
        assert meta.version not in {m["id"] for m in httpx.get(f"{first_url}/v1/models").json()["data"]}
        response = httpx.post(f"{swap_gateway.url}/v1/tasks/extraction", json={"input": INPUTS["extraction"]}, timeout=120)
        assert response.status_code == 200 and response.json()["route"]["version"] == "base"
        # the fleet without the dead engine promotes the same version cleanly
        survivors = fleet(store, built, [first_url])
        assert asyncio.run(survivors.promote(meta.version)).active == meta.version
        asyncio.run(survivors.rollback("extraction"))
    finally:
        second.stop()
