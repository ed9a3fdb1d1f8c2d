"""The fault matrix, run against `tucano serve` itself (two gateway workers, both vLLM engines, the
embedded Valkey) under steady traffic: SIGKILL a gateway worker, a vLLM engine, the trainer in
each phase of a round (generation, optimisation, evaluation, promotion, canary), and `serve`
(Valkey's parent: Valkey gets SIGTERM, flushes its append-only file, and restarts from it); fill
the disk under an adapter save (a file-size limit on the trainer: the write fails as on a full
disk).

After each fault: every answer the client received has its record; no route points at a version
that some engine lacks; no half-written adapter is registered; the next round runs cleanly. The
figures (faults injected and survived, requests failed) are printed and written to
`faults.json` in the test's tmp dir. `TUCANO_FAULT_REPEATS` repeats the matrix (the long form)."""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import psutil
import pytest

from common.datasets import load_split
from common.processes import free_port
from common.records import Route
from common.store import Store, content_sha256
from tasks import TASKS
from tests.conftest import REPO

REPEATS = int(os.environ.get("TUCANO_FAULT_REPEATS", "1"))
# trainer phase -> (method setting, the line that says the phase has begun, seconds to wait after it, settings)
PHASES = {
    "generation": ("grpo", "training grpo", 3.0, {}),
    # SFT here takes a few seconds and then saves: more steps than the time budget allows keep it
    # optimising until the budget ends, so the kill lands in optimisation, not in the save
    "optimisation": ("sft", "training sft", 4.0, {"TUCANO_SFT_MIN_STEPS": "100000"}),
    "evaluation": ("sft", ": gate:", 1.0, {}),
    "promotion": ("sft", "| total |", 0.0, {}),
    "canary": ("sft", "| total |", 0.2, {"TUCANO_CANARY_SHARE": "0.3"}),
}


class Serve:
    """`tucano serve` in a scratch data dir that links the bootstrap's models, DB and datasets."""

    def __init__(self, built, root: Path):
        self.root, self.port = root, free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("models", "commerce.db", "datasets", "manifest.json", "review_labels.jsonl"):
            if not (root / name).exists():
                (root / name).symlink_to(built.root / name)
        self.env = {**os.environ, "TUCANO_DATA_DIR": str(root), "TUCANO_PORT": str(self.port), "TUCANO_GATEWAY_WORKERS": "2",
                    "TUCANO_TRAIN_ENABLED": "false", "TUCANO_DRAIN_SECONDS": "1", "TUCANO_MIN_RECORDS_PER_TASK": "8",
                    "TUCANO_TRAIN_TIME_BUDGET_S": "20", "TUCANO_TASK_TRAINING": "{}", "TUCANO_GATE_MAX_ROWS": "24", "TUCANO_GATE_MIN_ROWS": "8",
                    "TUCANO_SHADOW_RECORDS": "8", "TUCANO_MIN_SFT_EXAMPLES": "4", "TUCANO_MIN_DPO_PAIRS": "1000",
                    "TUCANO_MIN_KTO_EXAMPLES": "1000", "TUCANO_PROMOTE_MARGIN": "0", "TUCANO_ROUND_LOCK_SECONDS": "6", "TUCANO_CANARY_SHARE": "0",
                    "OMP_NUM_THREADS": "1"}
        self.env.pop("TUCANO_REDIS_URL", None)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log = (self.root / "serve.log").open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", "cli", "serve"], cwd=REPO, env=self.env,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 400
        while not self.ready():
            assert self.process.poll() is None, (self.root / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(1)

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def store(self) -> Store:
        state = json.loads((self.root / "redis" / "server.json").read_text())
        return Store(state["url"])

    def children(self, words: tuple[str, ...]) -> list[psutil.Process]:
        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if any(w in " ".join(child.cmdline()) for w in words):
                    found.append(child)
            except (psutil.ZombieProcess, psutil.NoSuchProcess):  # a killed process not reaped yet
                continue
        return found

    def train(self, method: str = "sft", extra: dict | None = None, preexec=None) -> subprocess.Popen:
        env = {**self.env, "TUCANO_TRAIN_METHOD": method, **(extra or {})}
        return subprocess.Popen([sys.executable, "-m", "cli", "train", "--once"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=preexec)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)


class Traffic:
    """Steady requests from a thread; every 200 answer's record id is kept."""

    def __init__(self, url: str, rows: list[dict]):
        self.url, self.rows, self.stop_event = url, rows, threading.Event()
        self.answered: list[str] = []
        self.failed: Counter = Counter()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(5)
        with httpx.Client(timeout=60) as http:
            while not self.stop_event.is_set():
                row = rng.choice(self.rows)
                try:
                    response = http.post(f"{self.url}/v1/tasks/push", json={"input": row["input"], "options": {"max_tokens": 24}})
                    if response.status_code == 200:
                        self.answered.append(response.json()["id"])
                    else:
                        self.failed[response.status_code] += 1
                except httpx.HTTPError as error:
                    self.failed[type(error).__name__] += 1
                time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=60)


def invariants(serve: Serve, answered: list[str]) -> list[str]:
    """What must hold after any fault; the list of what does not."""
    problems = []
    store = serve.store()
    missing = [rid for rid in answered if _missing(store, rid)]
    if missing:
        problems.append(f"{len(missing)} answered requests have no record, e.g. {missing[:3]}")
    engines = {kind: store.engine_urls(kind) for kind in ("base", "think")}
    for task, route in store.routes()[1].items():
        kind = "think" if task == "insights" else "base"
        for arm, version in (("active", route.active), ("canary", route.canary)):
            for url in engines[kind] if version else []:
                served = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
                if version not in served:
                    problems.append(f"{task} {arm} {version} is not loaded in {url}")
    for meta in store.adapters(*TASKS):
        path = Path(meta.path)
        if not (path / "adapter_config.json").is_file() or not (path / "adapter_model.safetensors").is_file():
            problems.append(f"{meta.version} is registered but its files are incomplete")
        elif meta.sha256 and content_sha256(path) != meta.sha256:
            problems.append(f"{meta.version}'s files do not match its hash")
    if any(p.name.endswith(".partial") for p in (serve.root / "adapters").glob("*")):
        problems.append("a half-written adapter dir is left")
    return problems


def _missing(store: Store, record_id: str) -> bool:
    try:
        return store.get_record(record_id).record is None
    except KeyError:
        return True


def _wait_engines(serve: Serve, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not serve.ready():
        assert time.monotonic() < deadline, "the engines did not come back"
        time.sleep(1)
    time.sleep(3)  # the supervisor reloads the active adapters just after an engine is back


def _labels(serve: Serve, rows: list[dict], corrections: int = 16) -> None:
    with httpx.Client(base_url=serve.url, timeout=120) as http:
        for row in rows[:corrections]:
            answer = http.post("/v1/tasks/push", json={"input": row["input"], "options": {"max_tokens": 24}}).json()
            assert http.post("/v1/feedback", json={"id": answer["id"], "rating": -1, "correction": row["reference"]}).status_code == 200


def _kill_in_phase(serve: Serve, phase: str, seed: int) -> dict:
    method, cue, delay, extra = PHASES[phase]
    trainer = serve.train(method, {**extra, "TUCANO_PROMOTE_MARGIN": "-1"})  # every candidate passes: promotion happens
    seen = []
    for line in trainer.stdout:
        seen.append(line)
        if cue in line:
            break
    reached = trainer.poll() is None
    time.sleep(delay * random.Random(seed).uniform(0.5, 1.5))
    trainer.kill()
    trainer.wait()
    return {"reached": reached, "output": "".join(seen[-5:])}


@pytest.mark.slow
def test_fault_matrix(built, tmp_path):
    serve = Serve(built, tmp_path / "data")
    rows = load_split(built.datasets_dir, "push", "train")
    figures: dict[str, dict] = defaultdict(lambda: {"injected": 0, "survived": 0, "failed_requests": 0})
    serve.start()
    try:
        _labels(serve, rows)
        for repeat in range(REPEATS):
            # a gateway worker: uvicorn starts another; the other worker keeps answering
            with Traffic(serve.url, rows) as traffic:
                time.sleep(2)
                worker = serve.children(("multiprocessing", "spawn_main"))[0]
                worker.send_signal(signal.SIGKILL)
                time.sleep(6)
            _record("gateway worker", figures, serve, traffic)
            # the base vLLM engine (its whole process group): the supervisor restarts it and reloads adapters
            with Traffic(serve.url, rows) as traffic:
                time.sleep(2)
                engine = serve.children(("--served-model-name base",))[0]
                os.killpg(engine.pid, signal.SIGKILL)
                _wait_engines(serve)
                time.sleep(2)
            _record("vllm engine", figures, serve, traffic)
            # the trainer in each phase of a round; then a round runs cleanly
            for phase in PHASES:
                with Traffic(serve.url, rows) as traffic:
                    outcome = _kill_in_phase(serve, phase, seed=repeat)
                    assert outcome["reached"], (phase, outcome["output"])
                    time.sleep(7)  # the dead trainer's round lock expires (TUCANO_ROUND_LOCK_SECONDS below)
                _record(f"trainer during {phase}", figures, serve, traffic)
                _abort_canaries(serve)
            clean = serve.train("sft")
            output = clean.communicate(timeout=900)[0]
            assert clean.returncode == 0 and "done in" in output, output[-3000:]
            # a full disk under the adapter save
            with Traffic(serve.url, rows) as traffic:
                _labels(serve, rows[40:], corrections=4)
                full = serve.train("sft", preexec=_small_files)
                output = full.communicate(timeout=900)[0]
                assert full.returncode == 0 and "could not be saved" in output, output[-3000:]
            _record("disk full during a save", figures, serve, traffic)
            # Valkey's parent (serve itself): Valkey flushes its AOF on the SIGTERM the kernel sends it
            with Traffic(serve.url, rows) as traffic:
                time.sleep(3)
                serve.process.send_signal(signal.SIGKILL)
                serve.process.wait()
                time.sleep(3)
            serve.start()
            _record("valkey's parent (serve)", figures, serve, traffic)
        again = serve.train("sft")
        output = again.communicate(timeout=900)[0]
        assert again.returncode == 0, output[-3000:]
    finally:
        serve.stop()
    (tmp_path / "faults.json").write_text(json.dumps(figures, indent=2))
    print("\nfault | injected | survived | failed requests")
    for kind, f in figures.items():
        print(f"{kind} | {f['injected']} | {f['survived']} | {f['failed_requests']}")
    assert all(f["survived"] == f["injected"] for f in figures.values()), dict(figures)


def _small_files() -> None:
    """A child whose files cannot grow past 128 KiB: the adapter's weights (256 KiB) fail to write."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (128 * 1024, 128 * 1024))


def _abort_canaries(serve: Serve) -> None:
    store = serve.store()
    for task, route in store.routes()[1].items():
        if route.canary:
            store.change_route(task, Route.without_canary)


def _record(kind: str, figures: dict, serve: Serve, traffic: Traffic) -> None:
    problems = invariants(serve, traffic.answered)
    entry = figures[kind]
    entry["injected"] += 1
    entry["survived"] += not problems
    entry["failed_requests"] += sum(traffic.failed.values())
    entry.setdefault("answered", 0)
    entry["answered"] += len(traffic.answered)
    if problems:
        entry.setdefault("problems", []).extend(problems)
