"""Promotion that cannot be fooled, against the real engines and Valkey: the incumbent's own
weights under a new name are never promoted (20 seeds), and its answers are read back from
Valkey rather than asked again; a canary under load is rolled back when
worse and promoted when better, with no failed request and every record naming its arm; two
gateway processes see a flip within a second; bad eval files, canary shares, canaries without a
candidate and promotions during a canary are refused with nothing changed."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest

from common.datasets import load_split
from common.processes import free_port
from common.records import AdapterMeta, Route
from common.rounds import CanaryRecord, DataSources, TrainingData
from common.settings import load_settings
from common.store import content_sha256
from router.engine_client import ChatTemplate, EnginePool, EngineUnavailable
from tests.conftest import REPO
from tests.integration.conftest import RunningServer, fleet, make_state
from tests.integration.test_serving import make_lora
from trainer.data import SftExample
from trainer.gate import answer, demonstrations, eval_rows, run_gate, sample_rows


def register(store, path: str, task: str) -> AdapterMeta:
    meta = AdapterMeta(version=store.next_adapter_version(task), task=task, path=path, sha256=content_sha256(path))
    store.put_adapter(meta)
    return meta


@pytest.fixture
def admin_gateway(built, redis_url, engines):
    from pydantic import SecretStr

    from server.app import create_app

    settings = built.model_copy(update={"redis_url": redis_url, "admin_api_key": SecretStr("admin-key"),
                                        "canary_min_requests": 16, "canary_max_minutes": 10.0})
    state = make_state(settings, redis_url, [engines["base"].url], engines["think"].url)
    state.adapter_action = fleet(state.store, settings, [engines["base"].url], engines["think"].url, drain_seconds=2.0,
                                 drain="background").act
    with RunningServer(create_app(state)) as running:
        running.state, running.admin = state, {"Authorization": "Bearer admin-key"}
        yield running
    for task in ("extraction", "push"):
        state.store.change_route(task, lambda current: Route())


def test_the_incumbents_own_weights_under_a_new_name_are_never_promoted(built, redis_url, engines, tmp_path):
    from common.store import Store

    store = Store(redis_url)
    store.register_engines("base", [engines["base"].url], engines["base"].numerics)
    original = register(store, make_lora(built.base_model_path, tmp_path / "original", seed=11), "push")
    shutil.copytree(original.path, tmp_path / "copy")
    copy = register(store, str(tmp_path / "copy"), "push")
    hotswap = fleet(store, built, [engines["base"].url])
    for meta in (original, copy):
        asyncio.run(hotswap.load(meta.version, meta.path, "base"))
    settings = load_settings(data_dir=built.data_dir, gate_max_rows=12, gate_min_rows=8)
    decisions = []

    async def twenty() -> None:
        pool = EnginePool("base", [engines["base"].url], ChatTemplate.load(built.base_model_path))
        try:
            for seed in range(20):
                decisions.append(await run_gate(pool, settings, store, "push", copy.version, original.version, round_seed=seed))
        finally:
            await pool.close()
    asyncio.run(twenty())
    assert not any(d.promote for d in decisions), [d.reason for d in decisions if d.promote]
    assert all(d.interval[0] <= 0 <= d.interval[1] and d.n == 12 for d in decisions)

    # the incumbent's answers are kept in Valkey: with no engine at all, the last gate's rows are
    # answered by the original version exactly as that gate scored them; a version never asked is
    # not, and neither is the original once the engines compute in another precision
    async def without_an_engine():
        dead = EnginePool("base", [f"http://127.0.0.1:{free_port()}"], ChatTemplate.load(built.base_model_path))
        rows = sample_rows(eval_rows(settings, store, "push"), settings.gate_max_rows, 19)
        shown = demonstrations(settings, store, "push", {row.id: row.input for row in rows})  # the prompts the gate sent: with the team's examples
        try:
            kept = await answer(dead, settings, "push", original.version, rows, settings.seed, store, shown=shown)
            with pytest.raises(EngineUnavailable):
                await answer(dead, settings, "push", "push-v999999", rows, settings.seed, store, shown=shown)
            store.register_engines("base", [engines["base"].url], "cuda" if engines["base"].numerics != "cuda" else "cpu-fp32")
            with pytest.raises(EngineUnavailable):
                await answer(dead, settings, "push", original.version, rows, settings.seed, store, shown=shown)
        finally:
            store.register_engines("base", [engines["base"].url], engines["base"].numerics)
            await dead.close()
        return kept
    kept = asyncio.run(without_an_engine())
    assert sum(s.total for s in kept) / len(kept) == pytest.approx(decisions[-1].incumbent_mean, abs=1e-4)
    for meta in (original, copy):
        asyncio.run(hotswap.unload(meta.version, "base"))


def _load(url: str, admin: dict, stop: threading.Event, results: list, rows: list[dict], options: dict) -> None:
    """Extraction requests over varied reviews, whole answers: what live traffic looks like."""
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            row = rows[len(results) % len(rows)]
            response = http.post(f"{url}/v1/tasks/extraction", json={"input": row["input"], "options": options}, headers=admin)
            body = response.json() if response.status_code == 200 else {}
            results.append((response.status_code, body.get("id")))


def _canary_until_verdict(gateway, settings, version: str, share: float = 0.5, options: dict | None = None,
                          min_requests: int | None = None) -> tuple[CanaryRecord, list]:
    from deploy.serve import watch_canaries

    store = gateway.state.store
    if min_requests is not None:
        settings = settings.model_copy(update={"canary_min_requests": min_requests})
    started = httpx.post(f"{gateway.url}/v1/adapters/extraction/canary", headers=gateway.admin,
                         json={"version": version, "share": share}, timeout=120)
    assert started.status_code == 200, started.text
    results, stop = [], threading.Event()
    rows = load_split(settings.datasets_dir, "extraction", "train")[200:320]
    threads = [threading.Thread(target=_load, args=(gateway.url, gateway.admin, stop, results, rows, options or {})) for _ in range(3)]
    for thread in threads:
        thread.start()
    hotswap = fleet(store, settings, [e.url for e in gateway.state.pools["base"].engines], drain_seconds=2.0)
    deadline = time.monotonic() + 600
    try:
        while store.route("extraction").canary == version:
            assert time.monotonic() < deadline
            time.sleep(1.0)
            watch_canaries(settings, store, hotswap, print)
        time.sleep(2.0)  # requests in flight at the flip finish on the version they started with
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return store.adapter(version).canary, results


def test_a_worse_canary_is_rolled_back_and_a_better_one_promoted_under_load(admin_gateway, built, tmp_path):
    store, settings = admin_gateway.state.store, admin_gateway.state.settings
    worse = register(store, make_lora(built.base_model_path, tmp_path / "worse", seed=3, scale=2.0), "extraction")
    # the traffic asks for one sample: extraction is served as the best of 4, and the served score's pick of 4 hid most of
    # this random LoRA's harm on the tiny model (-0.049 [-0.127, +0.027] over 16 requests, not worse beyond doubt: promoted).
    # Judged after 64 requests an arm, not 16: how far the random LoRA falls below the base depends on the tiny model each
    # machine builds (-0.166 [-0.257, -0.076] over 16 here, -0.042 [-0.088, +0.005] on CI's build: promoted)
    outcome, results = _canary_until_verdict(admin_gateway, settings, worse.version, options={"samples": 1}, min_requests=64)
    print(f"the random LoRA as a canary: {outcome.reason}")
    assert outcome.outcome == "rolled back" and outcome.reward_difference < 0, outcome
    assert results and all(status == 200 for status, _ in results)  # no request failed, through start and rollback
    arms = {store.get_record(rid).record.arm for _, rid in results}
    assert arms == {"base", "canary"}
    assert store.adapter(worse.version).status == "rejected" and store.route("extraction").active is None

    # the team labelled 16 of the rows the better version trains on: a canary's promotion checks whether it absorbed them
    rows = load_split(built.datasets_dir, "extraction", "train")[:16]
    labelled = [httpx.post(f"{admin_gateway.url}/v1/tasks/extraction", headers=admin_gateway.admin, timeout=120,
                           json={"input": row["input"], "reference": row["reference"]}).json()["id"] for row in rows]
    better = _train_better(built, store, tmp_path, sources=dict(zip((row["id"] for row in rows), labelled)))
    outcome, results = _canary_until_verdict(admin_gateway, settings, better.version)
    assert outcome.outcome == "promoted", outcome
    assert outcome.retired.checked == 16 and 0 <= outcome.retired.retired <= 16, outcome.retired
    retired = {label.id for label in store.labels("extraction") if label.retired_by == better.version}
    assert len(retired) == outcome.retired.retired and retired <= set(labelled)
    assert all(status == 200 for status, _ in results)
    assert store.route("extraction").active == better.version and store.adapter(better.version).status == "active"


def _train_better(built, store, tmp_path, sources: dict[str, str]) -> AdapterMeta:
    """An SFT LoRA on extraction references: clearly better than the base model there. `sources`:
    the record ids of the rows the team labelled, which its metadata says it trained on."""
    from router.prompts import answer_text
    from trainer import sft
    from trainer.data import TaskData, split_validation
    from trainer.policy import load_policy

    settings = load_settings(data_dir=built.data_dir, sft_max_epochs=4)
    template = ChatTemplate.load(built.base_model_path)
    from router.prompts import build_messages
    from tasks import typed_input

    data = TaskData("extraction", sft=[SftExample(template.render(build_messages("extraction", typed_input("extraction", row["input"]))),
                                                  answer_text("extraction", row["reference"]), row["id"])
                                       for row in load_split(built.datasets_dir, "extraction", "train")[:96]])
    split_validation(data, 1)
    model, tokenizer = load_policy(built.base_model_path, None, 16, 32)
    sft.train(settings, model, tokenizer, data.sft, data.validation, 60, "test")
    model.save_pretrained(tmp_path / "better")
    meta = register(store, str(tmp_path / "better"), "extraction")
    store.update_adapter(meta.version, data=TrainingData(sources=DataSources(sft=sorted(sources.values()))))
    return store.adapter(meta.version)


def test_two_gateway_processes_see_a_flip_within_a_second(built, redis_url, engines, tmp_path):
    from contextlib import ExitStack

    from bench.stack import start, wait_ready
    from common.store import Store

    store = Store(redis_url)
    with ExitStack() as stack:
        urls = []
        for n in range(2):
            port = free_port()
            log = tmp_path / f"gateway-{n}.log"
            process = start(stack, "bench.stack:serve_gateway", log, str(built.data_dir), redis_url, engines["base"].url,
                            engines["think"].url, str(port), "1", str(tmp_path / f"metrics-{n}"), "off")
            urls.append(f"http://127.0.0.1:{port}")
            wait_ready(process, f"gateway {n}", f"{urls[-1]}/healthz", log)
        seen = []
        for _ in range(3):
            store.change_route("sql", lambda current: current)  # the same route written again: the version counter moves
            target, started = store.routes_version(), time.monotonic()
            while not all(httpx.get(f"{u}/readyz", timeout=5).json()["routes_version"] >= target for u in urls):
                time.sleep(0.02)
            seen.append(time.monotonic() - started)
    print(f"both gateways saw each flip after {[round(s, 3) for s in seen]} s")
    assert max(seen) < 1.0


def test_bad_promotion_inputs_are_refused_and_change_nothing(admin_gateway, built, tmp_path):
    store, url, admin = admin_gateway.state.store, admin_gateway.url, admin_gateway.admin
    candidate = register(store, make_lora(built.base_model_path, tmp_path / "c", seed=5), "extraction")
    routes_before = store.routes()[1]
    for share in (0, 1, 1.5, -0.2):
        response = httpx.post(f"{url}/v1/adapters/extraction/canary", headers=admin, json={"version": candidate.version, "share": share})
        assert response.status_code == 422 and "share" in response.json()["error"]["message"]
    unknown = httpx.post(f"{url}/v1/adapters/extraction/canary", headers=admin, json={"version": "extraction-v999", "share": 0.2})
    assert unknown.status_code == 404
    assert httpx.post(f"{url}/v1/adapters/extraction/canary/promote", headers=admin).status_code == 409  # no canary running
    assert httpx.post(f"{url}/v1/adapters/extraction/canary/abort", headers=admin).status_code == 409
    assert store.routes()[1] == routes_before
    started = httpx.post(f"{url}/v1/adapters/extraction/canary", headers=admin, json={"version": candidate.version, "share": 0.2}, timeout=120)
    assert started.status_code == 200
    other = register(store, make_lora(built.base_model_path, tmp_path / "o", seed=6), "extraction")
    during = httpx.post(f"{url}/v1/adapters/extraction/promote", params={"version": other.version}, headers=admin, timeout=120)
    assert during.status_code == 409 and "canary" in during.json()["error"]["message"]
    second = httpx.post(f"{url}/v1/adapters/extraction/canary", headers=admin, json={"version": other.version, "share": 0.2}, timeout=120)
    assert second.status_code == 409
    not_candidate = httpx.post(f"{url}/v1/adapters/extraction/canary", headers=admin, json={"version": candidate.version, "share": 0.2})
    assert not_candidate.status_code == 409  # it is the canary now, no longer a candidate
    route = store.route("extraction")
    assert route.canary == candidate.version and route.active is None and store.adapter(other.version).status == "candidate"
    aborted = httpx.post(f"{url}/v1/adapters/extraction/canary/abort", headers=admin, timeout=120)
    assert aborted.status_code == 200 and store.route("extraction").canary is None


def test_eval_files_are_checked_row_by_row_and_eval_reports_row_sources(built, redis_url, engines, tmp_path):
    from common.store import Store

    store = Store(redis_url)
    env = {"TUCANO_DATA_DIR": str(built.data_dir), "TUCANO_REDIS_URL": redis_url, "PATH": "/usr/bin:/bin",
           "TUCANO_BASE_ENGINE_URLS": json.dumps([engines["base"].url]), "TUCANO_THINK_ENGINE_URL": engines["think"].url}
    rows = load_split(built.datasets_dir, "push", "train")[-3:]
    good = [{"task": "push", "input": r["input"], "reference": r["reference"]} for r in rows]
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text("\n".join([json.dumps(good[0]), json.dumps(good[1]), '{"task": "push", "input": {"discount_pct": 900},'
                                   ' "reference": {"title": "a", "body": "b"}}']) + "\n")
    before = store.eval_set("push")
    refused = subprocess.run([sys.executable, "-m", "cli", "eval-set", "add", str(bad_file)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "line 3" in refused.stderr and "discount_pct" in refused.stderr
    assert store.eval_set("push") == before  # one bad row: nothing added
    for content, needle in [("not json\n", "line 1: not JSON"), ('{"task": "poetry", "input": {}}\n', "task must be one of"),
                            (json.dumps({"task": "push", "input": rows[0]["input"]}) + "\n", "needs a reference"),
                            (json.dumps({**good[0], "reference": {"title": "x" * 50, "body": "b"}}) + "\n", "title")]:
        bad_file.write_text(content)
        result = subprocess.run([sys.executable, "-m", "cli", "eval-set", "add", str(bad_file)], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    good_file = tmp_path / "good.jsonl"
    good_file.write_text("".join(json.dumps(row) + "\n" for row in good))
    added = subprocess.run([sys.executable, "-m", "cli", "eval-set", "add", str(good_file)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert added.returncode == 0 and "push: 3 new eval rows" in added.stderr, added.stderr
    report = subprocess.run([sys.executable, "-m", "cli", "eval", "--task", "push", "--json"], cwd=REPO,
                            env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    result = json.loads(report.stdout)["push"]
    assert result["rows"]["file"] == 3 and result["rows"]["bootstrap"] > 0
    assert result["versions"]["base"]["low"] <= result["versions"]["base"]["mean"] <= result["versions"]["base"]["high"]


def test_a_promotion_by_hand_retires_what_the_version_absorbed_through_the_api_and_the_cli(admin_gateway, built, engines, tmp_path):
    """Every promotion path retires the examples the promoted version trained on and answers right
    on its own (a round's and the canary's are tested above): here the admin API's and
    `tucano adapters promote`'s, each checking the labels the version trained on that retrieval
    still shows."""
    store, url, admin = admin_gateway.state.store, admin_gateway.url, admin_gateway.admin
    rows = load_split(built.datasets_dir, "extraction", "train")[300:308]
    labelled = [httpx.post(f"{url}/v1/tasks/extraction", headers=admin, timeout=120,
                           json={"input": row["input"], "reference": row["reference"]}).json()["id"] for row in rows]
    trained_on = TrainingData(sources=DataSources(sft=sorted(labelled)))
    by_api = register(store, make_lora(built.base_model_path, tmp_path / "api", seed=7), "extraction")
    store.update_adapter(by_api.version, data=trained_on)
    promoted = httpx.post(f"{url}/v1/adapters/extraction/promote", params={"version": by_api.version}, headers=admin, timeout=300)
    assert promoted.status_code == 200, promoted.text
    retired_by_api = promoted.json()["examples_retired"]
    assert retired_by_api["checked"] == len(labelled), retired_by_api
    assert {label.id for label in store.labels("extraction") if label.retired_by == by_api.version} <= set(labelled)
    assert sum(1 for label in store.labels("extraction") if label.retired_by == by_api.version) == retired_by_api["retired"]

    by_cli = register(store, make_lora(built.base_model_path, tmp_path / "cli", seed=8), "extraction")
    store.update_adapter(by_cli.version, data=trained_on)
    env = {"TUCANO_DATA_DIR": str(built.data_dir), "TUCANO_REDIS_URL": store.url, "PATH": "/usr/bin:/bin",
           "TUCANO_BASE_ENGINE_URLS": json.dumps([engines["base"].url]), "TUCANO_THINK_ENGINE_URL": engines["think"].url,
           "TUCANO_DRAIN_SECONDS": "0"}
    done = subprocess.run([sys.executable, "-m", "cli", "adapters", "promote", by_cli.version], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    retired_by_cli = json.loads(done.stdout.strip().splitlines()[-1])["examples_retired"]
    # the labels the first version retired are no longer shown, so no longer checked
    assert retired_by_cli["checked"] == len(labelled) - retired_by_api["retired"], retired_by_cli
    assert sum(1 for label in store.labels("extraction") if label.retired_by == by_cli.version) == retired_by_cli["retired"]
    assert store.adapter(by_cli.version).status == "active" and store.adapter(by_api.version).status == "previous"
    assert store.route("extraction").active == by_cli.version
