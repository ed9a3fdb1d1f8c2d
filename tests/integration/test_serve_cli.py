"""`tucano serve` as a user runs it: embedded Redis, two vLLM engines, the gateway; an engine
that dies is restarted while its tasks answer 503; SIGTERM stops everything cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.processes import free_port
from tests.conftest import REPO


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _ready(url: str, probe: str = "/readyz") -> bool:
    try:
        return httpx.get(f"{url}{probe}", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_serve_runs_the_stack_restarts_a_dead_engine_and_stops_cleanly(built, tmp_path):
    port = free_port()
    # two gateway workers: the path a box with cores to spare runs (one worker runs in-process,
    # as the benchmark's and the other tests' gateways do)
    env = dict(os.environ, TUCANO_DATA_DIR=str(built.data_dir), TUCANO_PORT=str(port), TUCANO_TRAIN_ENABLED="false",
               TUCANO_GATEWAY_WORKERS="2")
    env.pop("TUCANO_REDIS_URL", None)
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen([sys.executable, "-m", "cli", "serve"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _ready(url) or serve.poll() is not None, 500, "serve to be ready")
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        answer = httpx.post(f"{url}/v1/tasks/sql", json={"input": {"question": "Quantos pedidos existem?"}}, timeout=120)
        assert answer.status_code == 200
        record_id = answer.json()["id"]

        engines = [p for p in psutil.Process(serve.pid).children(recursive=True) if "--served-model-name" in p.cmdline()]
        base = next(p for p in engines if p.cmdline()[p.cmdline().index("--served-model-name") + 1] == "base")
        base_group = [base, *base.children(recursive=True)]  # the API server and its engine core
        base.kill()
        down = _wait(lambda: httpx.post(f"{url}/v1/tasks/sql", json={"input": {"question": "Quantos pedidos?"}},
                                         timeout=60).status_code == 503, 30, "a 503 while the engine is down")
        assert down
        _wait(lambda: _ready(url), 300, "the engine to be restarted")
        assert not [p for p in base_group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # no orphans left
        # each worker finds the engine back on its own next probe (every 2 s)
        assert _wait(lambda: httpx.post(f"{url}/v1/tasks/sql", json={"input": {"question": "Quantos pedidos existem?"}},
                                        timeout=120).status_code == 200, 30, "an answer once the engine is back")
        workers = [p for p in psutil.Process(serve.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2
        # whichever worker answers the scrape, /metrics counts what every worker answered
        for _ in range(4):
            exposed = httpx.get(f"{url}/metrics", timeout=10).text
            counts = {sample.labels["status"]: sample.value for family in text_string_to_metric_families(exposed)
                      for sample in family.samples if sample.name == "tucano_requests_total" and sample.labels["task"] == "sql"}
            assert counts["200"] == 2 and counts["503"] >= 1
            assert "vllm:" not in exposed  # the restarted engine keeps its metrics out of the workers' files
        children = psutil.Process(serve.pid).children(recursive=True)
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=90)
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert code in (0, 143), output[-3000:]
    assert '"POST /v1/tasks/sql HTTP/1.1"' not in output  # no access log by default (TUCANO_ACCESS_LOG)
    assert "nanobind: leaked" not in output and "leaked semaphore" not in output, output[-3000:]  # a clean exit is quiet
    assert not (built.redis_dir / "server.json").exists()  # the embedded Valkey was stopped
    time.sleep(2)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]  # engines stopped too
    # the record written before the stop is still there after a restart of the embedded Redis
    from common.store import Store
    from deploy.embedded_redis import EmbeddedRedis

    with EmbeddedRedis(built.redis_dir) as redis_url:
        assert Store(redis_url).get_record(record_id).record.task == "sql"


@pytest.mark.parametrize("access_log", [True, False])
def test_the_gateway_writes_an_access_log_only_when_asked(built, redis_url, tmp_path, access_log):
    port = free_port()
    # no engine listens on port 9: the gateway serves its health and errors all the same
    code = (f"from pathlib import Path; from deploy.serve import run_gateway; run_gateway({redis_url!r}, ['http://127.0.0.1:9'], "
            f"'http://127.0.0.1:9', '127.0.0.1', {port}, 1, Path({str(tmp_path / 'metrics')!r}), {access_log})")
    with (tmp_path / "gateway.log").open("wb") as log:
        gateway = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, TUCANO_DATA_DIR=str(built.data_dir)),
                                   stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:  # not /readyz: with no engine the gateway is up but not ready
            _wait(lambda: _ready(url, "/healthz") or gateway.poll() is not None, 120, "the gateway to answer")
            assert gateway.poll() is None, (tmp_path / "gateway.log").read_text()[-3000:]
            assert httpx.get(f"{url}/v1/nothing-here").status_code == 404
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
    output = (tmp_path / "gateway.log").read_text()
    assert "Application startup complete" in output  # the log itself is there either way
    assert ('"GET /v1/nothing-here HTTP/1.1" 404' in output) is access_log


def test_a_cpu_engine_yields_to_the_gateway_in_the_same_session(tmp_path):
    """On CPU the engine runs at COMPUTE_NICE in its own process group (so it is signalled with
    its children) but in the gateway's session: the kernel weighs niceness only within a session."""
    from deploy.vllm_server import COMPUTE_NICE, VllmServer

    server = VllmServer("nice-check", "no-such-model", lora=False, device="cpu", log_dir=tmp_path)
    server.start()
    try:
        process = psutil.Process(server.process.pid)
        assert process.nice() == COMPUTE_NICE
        assert os.getpgid(process.pid) == process.pid != os.getpgid(0)
        assert os.getsid(process.pid) == os.getsid(0)
    finally:
        server.stop()


def test_a_bench_server_that_fails_to_start_says_why(tmp_path):
    from contextlib import ExitStack

    from bench.stack import start, wait_ready

    log = tmp_path / "proxy.log"
    with ExitStack() as stack:
        proxy = start(stack, "bench.gateway:_serve_proxy", log, "http://127.0.0.1:9", "not-a-port")
        with pytest.raises(RuntimeError, match=r"(?s)proxy exited with code 1; log tail:.*ValueError.*not-a-port"):
            wait_ready(proxy, "proxy", "http://127.0.0.1:9", log, timeout_s=60)
