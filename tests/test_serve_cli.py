"""`tucano serve` as a user runs it: embedded Redis, two vLLM engines, the gateway; an engine
that dies is restarted while its tasks answer 503; SIGTERM stops everything cleanly."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    port = _free_port()
    # two gateway workers: the path a box with cores to spare runs (one worker runs in-process,
    # as the benchmark's and the other tests' gateways do)
    env = dict(os.environ, TUCANO_DATA_DIR=str(built.data_dir), TUCANO_PORT=str(port), TUCANO_TRAIN_ENABLED="false",
               TUCANO_GATEWAY_WORKERS="2")
    env.pop("TUCANO_REDIS_URL", None)
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
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
    assert not (built.redis_dir / "server.json").exists()  # the embedded Valkey was stopped
    time.sleep(2)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]  # engines stopped too
    # the record written before the stop is still there after a restart of the embedded Redis
    from foundation.embedded_redis import EmbeddedRedis
    from foundation.store import Store

    with EmbeddedRedis(built.redis_dir) as redis_url:
        assert Store(redis_url).get_record(record_id).record["task"] == "sql"


@pytest.mark.parametrize("access_log", [True, False])
def test_the_gateway_writes_an_access_log_only_when_asked(built, redis_url, tmp_path, access_log):
    port = _free_port()
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


def test_bench_reads_the_gateway_overhead_median_between_two_histogram_readings():
    from deploy.bench_gateway import _overhead

    name = "tucano_gateway_overhead_seconds"
    before = {f"{name}_count": 10, f"{name}_sum": 0.01, f"{name}_bucket0.001": 10, f"{name}_bucket0.003": 10,
              f"{name}_bucket0.005": 10, f"{name}_bucket+Inf": 10}
    # 100 more requests: 20 within 1 ms, 40 more within 3 ms, the rest within 5 ms
    after = {f"{name}_count": 110, f"{name}_sum": 0.31, f"{name}_bucket0.001": 30, f"{name}_bucket0.003": 70,
             f"{name}_bucket0.005": 110, f"{name}_bucket+Inf": 110}
    read = _overhead(before, after)
    assert read["requests"] == 100 and read["mean_ms"] == 3.0 and read["share_within_3ms"] == 0.6
    assert read["p50_ms"] == 2.5  # the 50th request: 30 of the 40 between 1 and 3 ms
    assert _overhead(after, after) == {"requests": 0, "mean_ms": None, "p50_ms": None, "share_within_3ms": None}


def _block_runs(rng, blocks: int, shift_ms: float, wall_s: float) -> list[dict]:
    return [{"latencies": [100 + rng.gauss(0, 5) + shift_ms for _ in range(16)], "wall_s": wall_s, "failures": []}
            for _ in range(blocks)]


def test_bench_intervals_hold_the_true_difference_and_narrow_with_more_blocks():
    import random

    from deploy.bench_gateway import _intervals

    rng = random.Random(3)
    few = _intervals(_block_runs(rng, 6, 0, 1.0), _block_runs(rng, 6, 2.0, 1.05), resamples=400)
    many = _intervals(_block_runs(rng, 60, 0, 1.0), _block_runs(rng, 60, 2.0, 1.05), resamples=400)
    for read in (few, many):
        for key in ("added_p50_ci95_ms", "added_paired_median_ci95_ms"):
            low, high = read[key]
            assert low < 2.0 < high  # every request of the side was 2 ms slower, plus noise
        assert read["throughput_ratio_ci95"] == [0.952, 0.952]  # every block pair took 1.0 s vs 1.05 s
    assert many["added_p50_ci95_ms"][1] - many["added_p50_ci95_ms"][0] < few["added_p50_ci95_ms"][1] - few["added_p50_ci95_ms"][0]
    direct, side = _block_runs(rng, 6, 0, 1.0), _block_runs(rng, 6, 1.0, 1.0)
    assert _intervals(direct, side, resamples=50, seed=9) == _intervals(direct, side, resamples=50, seed=9)  # reproducible


def test_bench_verdict_needs_both_intervals_inside_the_target():
    from deploy.bench_gateway import verdict

    def side(p50, ratio):
        return {"added_p50_ci95_ms": p50, "throughput_ratio_ci95": ratio}

    assert verdict(side([0.5, 2.9], [0.97, 1.01])) == "met"
    assert verdict(side([3.2, 6.0], [0.97, 1.01])) == "missed"  # slower beyond any doubt
    assert verdict(side([0.5, 2.9], [0.90, 0.94])) == "missed"  # fast, but costs throughput
    assert verdict(side([1.0, 4.0], [0.97, 1.01])) == "undecided"  # the interval straddles 3 ms
    assert verdict(side([0.5, 2.9], [0.93, 1.01])) == "undecided"


def test_split_cores_keeps_a_quarter_for_the_gateway_side():
    from deploy.bench_gateway import split_cores

    assert split_cores({3}) is None  # one core cannot be split
    assert split_cores({0, 1}) == (frozenset({0}), frozenset({1}))
    engine, others = split_cores(set(range(16)))
    assert engine == frozenset(range(12)) and others == frozenset(range(12, 16))
    engine, others = split_cores({2, 5, 7})
    assert engine == frozenset({2, 5}) and others == frozenset({7})


def test_the_bench_client_thread_runs_idle_and_leaves_the_process_as_it_was():
    """The load generator's thread yields to the gateway; the bench's main thread (and the
    gateway and Redis it starts) keep their policy, which an unprivileged process could not
    get back once it left it."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from deploy.bench_gateway import _idle_priority

    before = os.sched_getscheduler(0)
    with ThreadPoolExecutor(max_workers=1, initializer=_idle_priority) as client:
        assert client.submit(os.sched_getscheduler, 0).result() == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE


def test_an_engine_given_cores_starts_inside_them():
    """The launch hook an engine process runs before exec: its mask (which vLLM's engine-core
    children inherit) is the cores it was given, and its OpenMP runs one thread per core."""
    import functools

    from deploy.engines import _child_setup, vllm_env

    one = frozenset({min(os.sched_getaffinity(0))})
    shown = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           preexec_fn=functools.partial(_child_setup, one), capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == str(sorted(one))
    unpinned = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                              preexec_fn=functools.partial(_child_setup, None), capture_output=True, text=True, check=True)
    assert unpinned.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
    assert vllm_env("cpu", True, frozenset({0, 1, 2}))["OMP_NUM_THREADS"] == "3"


def test_an_engine_does_not_inherit_the_gateway_workers_metrics_dir(monkeypatch):
    from deploy.engines import vllm_env

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/gateway-metrics")
    assert "PROMETHEUS_MULTIPROC_DIR" not in vllm_env("cpu", True)


def test_a_cpu_engine_yields_to_the_gateway_in_the_same_session(tmp_path):
    """On CPU the engine runs at COMPUTE_NICE in its own process group (so it is signalled with
    its children) but in the gateway's session: the kernel weighs niceness only within a session."""
    from deploy.engines import COMPUTE_NICE, VllmServer

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

    from deploy.bench_gateway import _start, _wait_ready

    log = tmp_path / "proxy.log"
    with ExitStack() as stack:
        proxy = _start(stack, "_serve_proxy", log, "http://127.0.0.1:9", "not-a-port")
        with pytest.raises(RuntimeError, match=r"(?s)proxy exited with code 1; log tail:.*ValueError.*not-a-port"):
            _wait_ready(proxy, "proxy", "http://127.0.0.1:9", log, timeout_s=60)
