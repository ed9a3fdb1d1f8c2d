"""`tucano bench first-answer`: what a newcomer's first `tucano serve` costs, on a fresh data dir.

It starts `tucano serve` (a separate process, its own data dir, embedded defaults) and measures:
- the seconds until the first successful answer (an SQL question, asked every second until then
  and every `ask_every_s` after, each answer's status kept: a 503 with Retry-After while the
  engines start or restart is expected, a hang or a 500 is not);
- the seconds until the fine-tuned demo model serves (serve's log says so after restarting its
  engines on the fine-tuned weights), and the first answer after it;
- the peak resident memory of every process of serve's tree (sampled each second: the gateway,
  each vLLM engine, the fine-tuning), against the 6 GB target;
- what `/readyz` said about the fine-tuning while it ran (the job, its stage, the share done);
- that a clean stop (SIGINT) leaves no leak noise in serve's own output.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from common.processes import free_port
from deploy.starting import STARTING_ERROR

QUESTION = {"input": {"question": "Quantos pedidos foram entregues?"}}
ASK_EVERY_S = 30.0  # after the first answer: a newcomer trying it now and then, not a load test that slows the fine-tuning
TARGET_FIRST_ANSWER_S = 300.0
TARGET_PEAK_RSS_GB = 6.0
DONE_LINE = "the fine-tuned demo model serves now"


class _NotYet(Exception):
    """Not the time to ask again."""


class Sampler:
    """Peak resident memory per process of a tree, sampled every `every_s` seconds."""

    def __init__(self, root_pid: int, every_s: float = 1.0):
        self.root, self.every_s = psutil.Process(root_pid), every_s
        self.peaks: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            for process in processes:
                try:
                    rss, command = process.memory_info().rss, " ".join(process.cmdline()[1:6])
                except psutil.Error:
                    continue
                seen = self.peaks.setdefault(process.pid, {"command": command, "peak_rss_gb": 0.0})
                seen["peak_rss_gb"] = max(seen["peak_rss_gb"], round(rss / 2**30, 3))

    def table(self) -> list[dict]:
        return sorted(self.peaks.values(), key=lambda p: -p["peak_rss_gb"])


def role(command: str) -> str:
    if "vllm" in command:
        return "vLLM " + ("think" if "think" in command else "base")
    if "bootstrap" in command:
        return "bootstrap (fine-tuning)"
    if "train" in command:
        return "training round"
    if "valkey" in command or "redis" in command:
        return "embedded Valkey"
    if "serve" in command:
        return "serve (gateway)"
    return command[:60]


def run(settings, timeout_s: float = 3600.0, say: Callable[[str], None] = print, keep: bool = False,
        ask_every_s: float = ASK_EVERY_S) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="tucano-first-answer-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUCANO_")}
    env.update(TUCANO_DATA_DIR=str(data_dir), TUCANO_PORT=str(port), TUCANO_BOOTSTRAP_MODEL=settings.bootstrap_model,
               TUCANO_TRAIN_ENABLED="false")  # no round: what is measured is the bootstrap alone
    statuses: dict[int, int] = {}
    starting_503 = 0  # answered by the port's placeholder while serve started (deploy/starting.py)
    progress_seen: list[dict] = []
    results: dict = {"bootstrap_model": settings.bootstrap_model, "ask_every_s": ask_every_s, "targets": {"first_answer_s": TARGET_FIRST_ANSWER_S,
                                                                               "peak_rss_gb": TARGET_PEAK_RSS_GB}}
    started = time.monotonic()
    say(f"tucano serve on a fresh data dir {data_dir}, port {port}; log {log_path}")
    with log_path.open("wb") as log:
        serve = subprocess.Popen([sys.executable, "-m", "cli", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    try:
        # a newcomer waits for the answer: one request at a time, each given as long as the gateway
        # gives the engine (a client that gave up would leave the engine generating for nobody)
        with Sampler(serve.pid) as sampler, httpx.Client(timeout=httpx.Timeout(10.0, read=settings.engine_timeout_s + 30)) as client:
            first = finetuned = after = None
            asked = -ask_every_s
            while time.monotonic() - started < timeout_s and serve.poll() is None:
                now = time.monotonic() - started
                try:
                    ready = client.get(f"{url}/readyz").json()
                    for job in ready.get("jobs", []):
                        if not progress_seen or progress_seen[-1]["text"] != job["text"]:
                            progress_seen.append({"at_s": round(now, 1), "stage": job["stage"], "share": job["share"],
                                                  "text": job["text"]})
                    if first is not None and now - asked < ask_every_s:
                        raise _NotYet
                    asked = now
                    response = client.post(f"{url}/v1/tasks/sql", json=QUESTION)
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.status_code == 503 and "Retry-After" not in response.headers:
                        results.setdefault("problems", []).append(f"a 503 without Retry-After at {now:.0f} s")
                    if response.status_code == 503 and response.json().get("error", {}).get("type") == STARTING_ERROR:
                        starting_503 += 1
                    if response.status_code == 200 and first is None:
                        first = time.monotonic() - started
                        results["first_answer"] = str(response.json()["output"])[:200]
                        say(f"first answer after {first:.0f} s: {results['first_answer']}")
                except _NotYet:
                    pass
                except httpx.TransportError:
                    statuses[0] = statuses.get(0, 0) + 1  # not listening yet
                if finetuned is None and DONE_LINE in log_path.read_text(errors="replace"):
                    finetuned = time.monotonic() - started
                    say(f"the fine-tuned model serves after {finetuned:.0f} s")
                if finetuned is not None and after is None and first is not None:
                    try:
                        response = client.post(f"{url}/v1/tasks/sql", json=QUESTION)
                        if response.status_code == 200:
                            after = time.monotonic() - started
                            results["first_finetuned_answer"] = str(response.json()["output"])[:200]
                    except httpx.TransportError:
                        pass
                if after is not None:
                    break
                time.sleep(1.0)
            peaks = sampler.table()
        results.update(first_answer_s=round(first, 1) if first is not None else None,
                       finetuned_serving_s=round(finetuned, 1) if finetuned is not None else None,
                       first_finetuned_answer_s=round(after, 1) if after is not None else None,
                       statuses={("refused" if code == 0 else str(code)): n for code, n in sorted(statuses.items())},
                       starting_503=starting_503,
                       progress=progress_seen[:: max(1, len(progress_seen) // 20)],
                       processes=[{"role": role(p["command"]), **p} for p in peaks])
    finally:
        exit_code = stop(serve)
        output = log_path.read_text(errors="replace")
        results.update(stop_exit_code=exit_code, leak_lines=sum(1 for line in output.splitlines() if "leaked" in line or "nanobind" in line))
        results["serve_log_tail"] = output.splitlines()[-15:]
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    peak = max((p["peak_rss_gb"] for p in results.get("processes", [])), default=None)
    results["verdict"] = {
        "first_answer": results.get("first_answer_s") is not None and results["first_answer_s"] <= TARGET_FIRST_ANSWER_S,
        "peak_rss": peak is not None and peak <= TARGET_PEAK_RSS_GB,
        "clean_stop": results["leak_lines"] == 0,
    }
    return results


def stop(process: subprocess.Popen, timeout_s: float = 60.0) -> int | None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def table(results: dict) -> str:
    lines = [f"Demo model {results['bootstrap_model']}, `tucano serve` on a fresh data dir:", "",
             "| measure | value | target |", "|---|---:|---:|",
             f"| first successful answer | {results.get('first_answer_s')} s | <= {TARGET_FIRST_ANSWER_S:.0f} s |",
             f"| the fine-tuned model serves | {results.get('finetuned_serving_s')} s | |",
             f"| its first answer | {results.get('first_finetuned_answer_s')} s | |",
             f"| leak lines at a clean stop | {results.get('leak_lines')} | 0 |", "",
             "| process | peak resident memory (GB) |", "|---|---:|"]
    lines += [f"| {p['role']} | {p['peak_rss_gb']:.2f} |" for p in results.get("processes", [])[:8]]
    lines += ["", "Answers by status while it started: " + ", ".join(f"{k}: {v}" for k, v in results.get("statuses", {}).items())
              + f" (of the 503s, {results.get('starting_503', 0)} from the port's placeholder before the gateway was up)",
              "", f"The first answer: {results.get('first_answer')}", "", f"The fine-tuned model's first: {results.get('first_finetuned_answer')}"]
    if results.get("progress"):
        lines += ["", "What /readyz said meanwhile (a sample):", ""] + [f"- {p['at_s']} s: {p['text']}" for p in results["progress"]]
    return "\n".join(lines)
