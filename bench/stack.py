"""The throwaway pieces benchmarks run beside the stack under test: a server in its own
interpreter (stopped when the benchmark ends, its output in a log whose tail a start-up failure
quotes), a readiness wait, the gateway process as `tucano serve` runs it, a closed-loop load
driver, and a measured side's CPU time and core pinning."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from common.processes import die_with_parent


def serve_gateway(data_dir: str, redis_url: str, base_url: str, think_url: str, port: str, workers: str, metrics_dir: str,
                  access_log: str) -> None:
    """The gateway's process (its own interpreter, as `tucano serve` runs it, so uvicorn can
    start workers from it, with serve's log level and access-log setting); the rest of its
    settings come from the environment it inherits."""
    from deploy.serve import run_gateway

    os.environ["TUCANO_DATA_DIR"] = data_dir
    run_gateway(redis_url, [base_url], think_url, "127.0.0.1", int(port), int(workers), Path(metrics_dir), access_log == "on")


def start(stack: ExitStack, target: str, log_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`module:function(*args)` in its own interpreter, its output in `log_path`, stopped when the
    stack unwinds, or when the benchmark dies without unwinding it (killed, or stopped by a signal
    it does not handle): it never outlives the run as an orphan."""
    module, function = target.split(":")
    log = stack.enter_context(log_path.open("wb"))
    process = subprocess.Popen([sys.executable, "-c", f"import sys; from {module} import {function}; {function}(*sys.argv[1:])",
                                *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                               preexec_fn=die_with_parent)
    stack.callback(process.wait, 15)
    stack.callback(process.terminate)
    return process


def wait_ready(process: subprocess.Popen, name: str, url: str, log_path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        failure = (f"exited with code {process.returncode}" if process.poll() is not None else
                   f"did not become ready in {timeout_s:.0f} s" if time.monotonic() > deadline else None)
        if failure:  # the log lives in the benchmark's scratch directory, which goes when it stops
            raise RuntimeError(f"the benchmark {name} {failure}; log tail:\n" + log_path.read_text(errors="replace")[-2000:])
        time.sleep(0.2)


async def drive(send, payloads: list, concurrency: int) -> dict:
    """Send every payload with at most `concurrency` in flight; latencies in ms (in payload
    order) and throughput."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = [0.0] * len(payloads)
    failures: list[str] = []

    async def one(index: int, payload) -> None:
        async with gate:
            started = time.perf_counter()
            status, text = await send(payload)
            latencies[index] = (time.perf_counter() - started) * 1000
            if status != 200:
                failures.append(f"HTTP {status}: {text[:300]}")

    started = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(payloads)))
    return {"latencies": latencies, "failures": failures, "wall_s": time.perf_counter() - started}


@dataclass
class Side:
    """One thing a benchmark sends requests to, and the processes whose CPU time it costs."""
    name: str
    url: str = ""
    version: str = ""
    pids: list[int] = field(default_factory=list)  # whose CPU time counts
    error: str | None = None

    def cpu_s(self) -> float:
        total = 0.0
        for pid in self.pids:
            try:
                process = psutil.Process(pid)
                total += sum(process.cpu_times()[:2]) + sum(sum(c.cpu_times()[:2]) for c in process.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return total


def pin(pid: int, cores: set[int] | None) -> None:
    """Keep a process and its children on `cores` (none given: leave them where they are)."""
    if cores:
        for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            process.cpu_affinity(sorted(cores))
