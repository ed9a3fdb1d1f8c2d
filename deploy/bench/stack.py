"""The throwaway pieces benchmarks run beside the stack under test: a server in its own
interpreter (stopped when the benchmark ends, its output in a log whose tail a start-up failure
quotes), a readiness wait, and the gateway process as `tucano serve` runs it."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx


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
    stack unwinds."""
    module, function = target.split(":")
    log = stack.enter_context(log_path.open("wb"))
    process = subprocess.Popen([sys.executable, "-c", f"import sys; from {module} import {function}; {function}(*sys.argv[1:])",
                                *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
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
