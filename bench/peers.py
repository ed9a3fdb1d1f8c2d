"""`tucano bench peers`: what our gateway adds to a request, side by side with what a team would
otherwise put in front of vLLM, all against one mock engine (`bench/mock_engine.py`), as
TensorZero and LiteLLM measure their own overhead.

Sides: `direct` (the client straight to the mock), `tucano` (our gateway, one worker, doing all
its work: prompt, schema, parsing, scoring and the record in Redis before the answer returns),
`litellm` (LiteLLM's proxy, `litellm[proxy]` from the registry in its own virtual environment so
its pins never touch ours) and `vllm-router` (the Rust load balancer for vLLM, in its own virtual
environment too: the floor of a bare hop, which neither scores nor records), and `python-hop`
(`tucano bench gateway`'s bare proxy: the same uvicorn server and aiohttp client as our gateway,
forwarding the body and nothing else, which splits what our gateway costs into what its Python
HTTP stack costs and what its own work costs). A peer that fails to install or start is reported
with its error and measured as absent, never skipped silently.

Two workloads: `extraction` (a review with the task's JSON schema; ours through
`/v1/tasks/extraction`, the peers as a chat completion with `response_format` and the same
messages) and `chat` (a plain chat completion; ours as `tucano-extraction`).

Closed loop: at each concurrency, blocks of the same requests go to each side in turn, the order
reversed every other block, so a slow spell of the shared machine falls on every side; a side's
added latency at a percentile is its percentile minus direct's, with a 95% interval from
resampling whole blocks. Open loop: requests sent at a fixed rate whatever the answers do
(latency counted from when each was due, so a side that falls behind is not excused by its own
slowness), in alternating passes per side, up to the first rate a side cannot hold (over 1%
errors, p99 over a second, or under 90% of the rate answered).

Cores: with two or more, the proxies get one core of their own (one worker each) and the mock,
Valkey and the load generator share another. CPU per request is each side's own processes' CPU
time over its requests (ours: the gateway; Valkey's is given apart). Our gateway's own time is
read from its /metrics histogram. py-spy profiles our gateway at a fixed rate; the flame graph
(SVG) and the hottest frames are written with the results.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from bench.gateway import _overhead_counts
from bench.stack import Side, drive, pin, start, wait_ready
from common.datasets import load_split
from common.processes import free_port
from common.settings import Settings
from common.stats import RESAMPLES, block_interval, percentile
from common.store import RECORDS, Store
from deploy.embedded_redis import EmbeddedRedis

PEER_PACKAGES = {"litellm": "litellm[proxy]==1.108.7", "vllm-router": "vllm-router==0.1.17"}
SIDES = ("direct", "tucano", "python-hop", "litellm", "vllm-router")
WORKLOADS = ("extraction", "chat")
KEY = "sk-bench-" + "5f1d" * 8  # LiteLLM refuses to start without a master key; ours gets the same as its user key
TARGET = {"own_p50_ms": 0.5, "own_p99_ms": 2.0, "rate": 1000, "vs_litellm": 2.0}
HOLDS = {"errors": 0.01, "p99_ms": 1000.0, "answered": 0.9}


class PeerUnavailable(RuntimeError):
    """A peer could not be installed or started; the message says why."""


def peer_python(root: Path, name: str, say) -> Path:
    """The peer's own virtual environment under `root`, made and filled from the registry once
    (a stamp names the package it holds)."""
    venv, package = root / name, PEER_PACKAGES[name]
    stamp = venv / ".tucano-package"
    if stamp.is_file() and stamp.read_text() == package:
        return venv / "bin"
    say(f"installing {package} into its own virtual environment {venv} (once)")
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)], [str(venv / "bin" / "pip"), "install", "--quiet", package]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise PeerUnavailable(f"`{' '.join(step[-2:])}` failed with code {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    stamp.write_text(package)
    return venv / "bin"




def _start_peer(stack: ExitStack, name: str, bin_dir: Path, mock_url: str, scratch: Path, cores: set[int] | None) -> Side:
    port = free_port()
    log_path = scratch / f"{name}.log"
    log = stack.enter_context(log_path.open("wb"))
    if name == "litellm":
        config = scratch / "litellm.yaml"
        config.write_text(json.dumps({"model_list": [{"model_name": "mock", "litellm_params": {
            "model": "openai/mock", "api_base": f"{mock_url}/v1", "api_key": "none"}}]}))  # YAML reads JSON
        command = [str(bin_dir / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
        env = dict(os.environ, LITELLM_MASTER_KEY=KEY, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
        ready, version_of = f"http://127.0.0.1:{port}/health/liveliness", "litellm"
    else:
        command = [str(bin_dir / "vllm-router"), "--worker-urls", mock_url, "--host", "127.0.0.1", "--port", str(port),
                   "--policy", "round_robin", "--log-level", "warning", "--max-concurrent-requests", "1024", "--queue-size", "4096",
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        env, ready, version_of = dict(os.environ), f"http://127.0.0.1:{port}/health", "vllm-router"
    for key in [k for k in env if k.startswith(("TUCANO_", "VIRTUAL_ENV", "PYTHONPATH"))]:
        env.pop(key)
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    stack.callback(process.wait, 15)
    stack.callback(process.terminate)
    try:
        wait_ready(process, name, ready, log_path, timeout_s=180)
    except RuntimeError as error:
        raise PeerUnavailable(str(error)) from None
    pin(process.pid, cores)
    version = subprocess.run([str(bin_dir / "pip"), "show", version_of], capture_output=True, text=True).stdout
    version = next((line.split(":", 1)[1].strip() for line in version.splitlines() if line.startswith("Version:")), "?")
    return Side(name, f"http://127.0.0.1:{port}", version, [process.pid])


class Requests:
    """Every side's body for one review and workload, encoded once."""

    def __init__(self, reviews: list[str]):
        from router.prompts import build_messages
        from tasks import definition, typed_input

        schema = definition("extraction").json_schema
        self.bodies: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
        for workload in WORKLOADS:
            for side in SIDES:
                made = []
                for review in reviews:
                    if side == "tucano":
                        path, body = (("/v1/tasks/extraction", {"input": {"review": review}}) if workload == "extraction" else
                                      ("/v1/chat/completions", {"model": "tucano-extraction", "messages": [{"role": "user", "content": review}]}))
                    elif workload == "extraction":
                        path, body = "/v1/chat/completions", {
                            "model": "mock", "messages": build_messages("extraction", typed_input("extraction", {"review": review})),
                            "response_format": {"type": "json_schema", "json_schema": {"name": "extraction", "schema": schema}}}
                    else:
                        path, body = "/v1/chat/completions", {"model": "mock", "messages": [{"role": "user", "content": review}]}
                    made.append((path, json.dumps(body, ensure_ascii=False).encode()))
                self.bodies[workload, side] = made


def sender(client, side: Side, answered: Counter):
    """Sends one encoded request to a side; counts its 200s in `answered` (ours must have as
    many records in Redis)."""
    headers = {"content-type": "application/json"}
    if side.name in ("tucano", "litellm"):
        headers["authorization"] = f"Bearer {KEY}"

    async def send(request: tuple[str, bytes]) -> tuple[int, str]:
        path, body = request
        async with client.post(side.url + path, data=body, headers=headers) as response:
            text = (await response.read()).decode(errors="replace")
            answered[side.name] += response.status == 200
            return response.status, text
    return send


def _stats(latencies: list[float]) -> dict:
    return {"p50_ms": round(percentile(latencies, 0.5), 3), "p99_ms": round(percentile(latencies, 0.99), 3),
            "p999_ms": round(percentile(latencies, 0.999), 3)}


def _added_intervals(direct_blocks: list[list[float]], side_blocks: list[list[float]], seed: int = 0) -> dict:
    """95% intervals of a side's added p50, p99 and p99.9 (its percentile minus direct's), whole
    blocks resampled (their requests shared the machine's moment)."""
    pairs = list(zip(direct_blocks, side_blocks))

    def added(q: float):
        return lambda chosen: (percentile([ms for _, s in chosen for ms in s], q) - percentile([ms for d, _ in chosen for ms in d], q))

    return {f"added_{name}_ci95_ms": [round(bound, 3) for bound in block_interval(pairs, added(q), seed=seed)]
            for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))}


def _histogram_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float | None:
    """A quantile of our gateway's own-time histogram between two readings, interpolated inside
    its bucket as Prometheus's `histogram_quantile` does; None past the last finite bucket."""
    prefix = "tucano_gateway_overhead_seconds_bucket"
    count = after.get("tucano_gateway_overhead_seconds_count", 0.0) - before.get("tucano_gateway_overhead_seconds_count", 0.0)
    if not count:
        return None
    bounds = sorted(float(k[len(prefix):]) for k in after if k.startswith(prefix) and not k.endswith("+Inf"))
    lower, below = 0.0, 0.0
    for bound in bounds:
        within = after.get(f"{prefix}{bound}", 0.0) - before.get(f"{prefix}{bound}", 0.0)
        if within >= q * count:
            return round(1000 * (lower + (bound - lower) * (q * count - below) / max(within - below, 1e-9)), 3)
        lower, below = bound, within
    return None


class Bench:
    def __init__(self, client, sides: dict[str, Side], requests: Requests, gateway_metrics: str, redis_side: Side):
        self.client, self.sides, self.requests = client, sides, requests
        self.live = [name for name in SIDES if name in sides and sides[name].error is None]
        self.answered: Counter = Counter()
        self.senders = {name: sender(client, sides[name], self.answered) for name in self.live}
        self.gateway_metrics, self.redis_side = gateway_metrics, redis_side

    async def own_time(self) -> dict[str, float]:
        async with self.client.get(self.gateway_metrics) as response:
            counts = _overhead_counts(await response.text())
        return counts

    async def closed(self, workload: str, concurrency: int, requests_per_level: int) -> dict:
        block = max(2 * concurrency, 16)
        blocks = max(6, -(-requests_per_level // block))
        blocks += blocks % 2
        pool = self.requests.bodies
        latencies = {name: [] for name in self.live}
        failures: dict[str, list[str]] = {name: [] for name in self.live}
        cpu = dict.fromkeys(self.live, 0.0)
        redis_cpu = 0.0
        own_before = await self.own_time()
        for index in range(blocks):
            start = index * block
            for name in (self.live if index % 2 == 0 else self.live[::-1]):
                bodies = pool[workload, name]
                chosen = [bodies[(start + i) % len(bodies)] for i in range(block)]
                cpu_before, redis_before = self.sides[name].cpu_s(), self.redis_side.cpu_s()
                run = await drive(self.senders[name], chosen, concurrency)
                cpu[name] += self.sides[name].cpu_s() - cpu_before
                if name == "tucano":
                    redis_cpu += self.redis_side.cpu_s() - redis_before
                latencies[name].append(run["latencies"])
                failures[name] += run["failures"]
        own_after = await self.own_time()
        row = {"workload": workload, "concurrency": concurrency, "blocks": blocks, "block": block, "sides": {}}
        direct = _stats([ms for run in latencies["direct"] for ms in run])
        for name in self.live:
            merged = [ms for run in latencies[name] for ms in run]
            entry = {"requests": len(merged), "failed": len(failures[name]), "first_failure": failures[name][0] if failures[name] else None,
                     **_stats(merged), "cpu_ms_per_request": round(1000 * cpu[name] / len(merged), 3) if name != "direct" else None}
            if name != "direct":
                entry.update({f"added_{k}": round(entry[f"{k}_ms"] - direct[f"{k}_ms"], 3) for k in ("p50", "p99", "p999")})
                entry.update(_added_intervals(latencies["direct"], latencies[name]))
            row["sides"][name] = entry
        if "tucano" in self.live:
            row["sides"]["tucano"].update(redis_cpu_ms_per_request=round(1000 * redis_cpu / row["sides"]["tucano"]["requests"], 3),
                                          own_p50_ms=_histogram_quantile(own_before, own_after, 0.5),
                                          own_p99_ms=_histogram_quantile(own_before, own_after, 0.99))
        return row

    async def open_run(self, name: str, workload: str, rate: float, seconds: float) -> dict:
        """Requests due at a fixed rate; each latency counts from when it was due."""
        loop, bodies, send = asyncio.get_running_loop(), self.requests.bodies[workload, name], self.senders[name]
        total = max(1, int(rate * seconds))
        latencies: list[float] = []
        failures: list[str] = []

        async def one(index: int, due: float) -> None:
            try:
                status, text = await asyncio.wait_for(send(bodies[index % len(bodies)]), 10)
            except Exception as error:  # every kind of failure counts, with its name
                failures.append(f"{type(error).__name__}: {error}")
                return
            latencies.append(1000 * (loop.time() - due))
            if status != 200:
                failures.append(f"HTTP {status}: {text[:200]}")

        cpu_before, redis_before = self.sides[name].cpu_s(), self.redis_side.cpu_s()
        started = loop.time() + 0.05
        tasks, index = [], 0
        while index < total:
            now = loop.time()
            while index < total and started + index / rate <= now:
                tasks.append(loop.create_task(one(index, started + index / rate)))
                index += 1
            if index < total:
                await asyncio.sleep(max(0.0, started + index / rate - loop.time()))
        await asyncio.gather(*tasks)
        wall = loop.time() - started
        return {"latencies": latencies, "failures": failures, "wall_s": wall, "cpu_s": self.sides[name].cpu_s() - cpu_before,
                "redis_cpu_s": self.redis_side.cpu_s() - redis_before}

    async def settle(self, name: str, idle_share: float = 0.05, most_s: float = 60.0) -> None:
        """Wait until a side's processes are idle: a proxy that fell behind keeps working on
        requests its clients gave up on, on the core the next side's pass gets."""
        deadline = time.monotonic() + most_s
        while time.monotonic() < deadline:
            before = self.sides[name].cpu_s()
            await asyncio.sleep(0.25)
            if self.sides[name].cpu_s() - before < idle_share * 0.25:
                return

    async def open_loop(self, workload: str, rates: list[float], seconds: float, passes: int, say) -> list[dict]:
        rows, held = [], set(self.live)
        for rate in rates:
            runs = {name: [] for name in held}
            own_before = await self.own_time()
            for index in range(passes):
                for name in (sorted(held, key=SIDES.index) if index % 2 == 0 else sorted(held, key=SIDES.index)[::-1]):
                    runs[name].append(await self.open_run(name, workload, rate, seconds))
                    await self.settle(name)
            own_after = await self.own_time()
            row = {"workload": workload, "rate": rate, "seconds": seconds, "passes": passes, "sides": {}}
            for name, side_runs in runs.items():
                merged = [ms for run in side_runs for ms in run["latencies"]]
                failed = sum(len(run["failures"]) for run in side_runs)
                sent = round(rate * seconds) * passes
                answered = len(merged) - sum(1 for run in side_runs for f in run["failures"] if f.startswith("HTTP"))
                entry = {"sent": sent, "failed": failed, "first_failure": next((f for run in side_runs for f in run["failures"]), None),
                         **(_stats(merged) if merged else {}),
                         "cpu_ms_per_request": round(1000 * sum(r["cpu_s"] for r in side_runs) / sent, 3) if name != "direct" else None}
                entry["holds"] = (failed <= HOLDS["errors"] * sent and bool(merged) and entry["p99_ms"] <= HOLDS["p99_ms"]
                                  and answered >= HOLDS["answered"] * sent)
                if name == "tucano":
                    entry.update(redis_cpu_ms_per_request=round(1000 * sum(r["redis_cpu_s"] for r in side_runs) / sent, 3),
                                 own_p50_ms=_histogram_quantile(own_before, own_after, 0.5),
                                 own_p99_ms=_histogram_quantile(own_before, own_after, 0.99))
                row["sides"][name] = entry
            direct = row["sides"].get("direct")
            for name, entry in row["sides"].items():
                if name != "direct" and direct and "p50_ms" in entry and "p50_ms" in direct:
                    entry.update({f"added_{k}": round(entry[f"{k}_ms"] - direct[f"{k}_ms"], 3) for k in ("p50", "p99", "p999")})
                    entry.update(_added_intervals([r["latencies"] for r in runs["direct"]], [r["latencies"] for r in runs[name]]))
            rows.append(row)
            say(_describe_open(row))
            held = {name for name in held if row["sides"][name]["holds"] or name == "direct"}
        return rows


def _describe_open(row: dict) -> str:
    parts = []
    for name, entry in row["sides"].items():
        figures = f"p50 {entry.get('p50_ms')} ms, p99 {entry.get('p99_ms')} ms, {entry['failed']} failed"
        if name == "tucano":
            figures += f", own time p50 {entry['own_p50_ms']} / p99 {entry['own_p99_ms']} ms"
        parts.append(f"{name}: {figures}{'' if entry['holds'] else ' (does not hold)'}")
    return f"{row['workload']} at {row['rate']:.0f} req/s: " + "; ".join(parts)


def _describe_closed(row: dict) -> str:
    parts = []
    for name, entry in row["sides"].items():
        if name == "direct":
            parts.append(f"direct p50 {entry['p50_ms']} ms")
        else:
            parts.append(f"{name} +{entry['added_p50']} ms p50 [{entry['added_p50_ci95_ms'][0]}, {entry['added_p50_ci95_ms'][1]}], "
                         f"+{entry['added_p99']} ms p99, {entry['cpu_ms_per_request']} ms CPU/request")
    return f"{row['workload']} at concurrency {row['concurrency']}: " + "; ".join(parts)


def _profile(pid: int, seconds: float, out: Path, fmt: str) -> subprocess.Popen:
    py_spy = Path(sys.executable).parent / "py-spy"
    # --gil: only samples that hold the GIL, so the event loop's wait in epoll (no Python frame
    # under uvloop's C loop) is not counted as work
    return subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250", "--gil",
                             "--nonblocking", "--format", fmt, "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stacks(collapsed: str):
    """(frames, samples) of each line of py-spy's collapsed stacks ("frame;frame;... count")."""
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def hottest_frames(collapsed: str, top: int = 15) -> list[dict]:
    """The frames where the samples were taken (self share), with their share of samples on the
    stack at all (inclusive: each frame once per stack), most self first."""
    inclusive: Counter = Counter()
    leaf: Counter = Counter()
    total = 0
    for frames, samples in _stacks(collapsed):
        total += samples
        for frame in set(frames):
            inclusive[frame] += samples
        leaf[frames[-1]] += samples
    return [{"frame": frame, "self": round(n / total, 3), "inclusive": round(inclusive[frame] / total, 3)}
            for frame, n in leaf.most_common(top)] if total else []


def by_package(collapsed: str) -> dict[str, float]:
    """Self samples per package (the first part of the frame's file path: aiohttp, uvicorn,
    redis...; ours are server, router, rewards, common), as shares, largest first."""
    shares: Counter = Counter()
    total = 0
    for frames, samples in _stacks(collapsed):
        total += samples
        where = frames[-1].rpartition("(")[2].split(":")[0]
        shares[where.split("/")[0] if "/" in where else (where or "?")] += samples
    return {name: round(n / total, 3) for name, n in shares.most_common()} if total else {}


def run(settings: Settings, levels: list[int], rates: list[float], requests_per_level: int, seconds: float, passes: int,
        delays_ms: list[float], say=print, peers: tuple[str, ...] = SIDES[1:], name: str = "peers") -> dict:
    """Every side in `peers` (our gateway, the bare hop, LiteLLM, vllm-router) against the mock
    straight (`direct`, always measured); result files under the bench dir are named `name`."""
    reviews = [row["input"]["review"] for row in load_split(settings.datasets_dir, "extraction", "eval")]
    requests = Requests(reviews)
    cores = sorted(os.sched_getaffinity(0))
    shared_core, proxy_core = ({cores[0]}, {cores[1]}) if len(cores) >= 2 else (None, None)
    results: dict = {"cores": {"proxies": sorted(proxy_core), "mock_redis_client": sorted(shared_core)} if proxy_core else "shared",
                     "peers": {}, "delays": [], "target": TARGET, "rates": rates, "sides": ["direct", *peers], "name": name}
    bench_dir = settings.bench_dir
    bench_dir.mkdir(parents=True, exist_ok=True)
    peer_root = settings.root / "peers"
    for delay in delays_ms:
        with ExitStack() as stack:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-peers-")))
            mock_port = free_port()
            mock = start(stack, "bench.mock_engine:serve", scratch / "mock.log", str(mock_port), str(delay),
                         str(cores[0]) if shared_core else "")
            mock_url = f"http://127.0.0.1:{mock_port}"
            wait_ready(mock, "mock engine", f"{mock_url}/health", scratch / "mock.log")
            embedded = EmbeddedRedis(scratch / "redis")  # a fresh dir: it starts its own server
            redis_url = stack.enter_context(embedded)
            redis_pid = embedded.process.pid
            pin(redis_pid, shared_core)
            gateway_port = free_port()
            # one completion a request, as each peer asks of the mock engine
            env = dict(os.environ, TUCANO_USER_API_KEY=KEY, TUCANO_RATE_LIMIT_PER_MINUTE="0", TUCANO_ACCESS_LOG="false",
                       TUCANO_SERVE_SAMPLES="{}")
            gateway = start(stack, "bench.stack:serve_gateway", scratch / "gateway.log", str(settings.root), redis_url, mock_url,
                            mock_url, str(gateway_port), "1", str(scratch / "metrics"), "off", env=env)
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            wait_ready(gateway, "gateway", f"{gateway_url}/readyz", scratch / "gateway.log")
            pin(gateway.pid, proxy_core)
            hop_port = free_port()
            hop = start(stack, "bench.gateway:_serve_proxy", scratch / "python-hop.log", mock_url, str(hop_port))
            wait_ready(hop, "python hop", f"http://127.0.0.1:{hop_port}", scratch / "python-hop.log")
            pin(hop.pid, proxy_core)
            sides = {"direct": Side("direct", mock_url, "mock", [mock.pid]),
                     "tucano": Side("tucano", gateway_url, "this checkout", [gateway.pid]),
                     "python-hop": Side("python-hop", f"http://127.0.0.1:{hop_port}", "uvicorn + aiohttp", [hop.pid])}
            for peer in ("litellm", "vllm-router"):
                if peer not in peers:
                    continue
                try:
                    sides[peer] = _start_peer(stack, peer, peer_python(peer_root, peer, say), mock_url, scratch, proxy_core)
                except PeerUnavailable as error:
                    sides[peer] = Side(peer, error=str(error))
                    say(f"[red]{peer} is not measured: {error}[/red]")
                results["peers"][peer] = {"package": PEER_PACKAGES[peer], "version": sides[peer].version, "error": sides[peer].error}
            sides = {side: sides[side] for side in ("direct", *peers)}  # our gateway runs in every case: it writes the records counted
            if shared_core:
                os.sched_setaffinity(0, shared_core)
                stack.callback(os.sched_setaffinity, 0, cores)
            redis_side = Side("valkey", pids=[redis_pid])
            say(f"mock delay {delay} ms: sides {', '.join(n for n in sides if sides[n].error is None)}")

            plan = {"levels": levels, "rates": rates, "requests_per_level": requests_per_level, "seconds": seconds, "passes": passes}
            found = asyncio.run(_measure(sides, requests, redis_side, (gateway.pid, gateway_url), delay, plan,
                                         bench_dir / name if delay == delays_ms[0] and "tucano" in sides else None, say))
            found["records"]["in_redis"] = Store(redis_url).redis.xlen(RECORDS)
            if found["records"]["in_redis"] != found["records"]["answered"]:
                say(f"[red]our gateway answered {found['records']['answered']} requests but Redis holds "
                    f"{found['records']['in_redis']} records[/red]")
            results["delays"].append(found)
    return results


async def _measure(sides: dict[str, Side], requests: Requests, redis_side: Side, gateway: tuple[int, str], delay: float, plan: dict,
                   profile_prefix: Path | None, say) -> dict:
    """Every measurement at one mock delay: the mock's own ceiling, the closed loop per workload
    and concurrency, the open loop, and (with `profile_prefix`) our gateway's profile."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        gateway_pid, gateway_url = gateway
        bench = Bench(client, sides, requests, f"{gateway_url}/metrics", redis_side)
        for name in bench.live:  # every path warm
            await drive(bench.senders[name], requests.bodies["extraction", name][:32], 8)
        ceiling_cpu = sides["direct"].cpu_s()
        ceiling = await drive(bench.senders["direct"], requests.bodies["chat", "direct"] * 8, 64)
        mock_cpu_ms = 1000 * (sides["direct"].cpu_s() - ceiling_cpu) / len(ceiling["latencies"])
        found: dict = {"delay_ms": delay, "mock": {
            "cpu_ms_per_request": round(mock_cpu_ms, 4), "ceiling_rps_one_core": round(1000 / mock_cpu_ms) if mock_cpu_ms else None,
            "client_and_mock_rps_at_64": round(len(ceiling["latencies"]) / ceiling["wall_s"])}, "closed": [], "open": []}
        say(f"mock: {found['mock']}")
        for workload in WORKLOADS:
            for level in plan["levels"]:
                found["closed"].append(await bench.closed(workload, level, plan["requests_per_level"]))
                say(_describe_closed(found["closed"][-1]))
        found["open"] = await bench.open_loop("extraction", plan["rates"], plan["seconds"], plan["passes"], say)
        if profile_prefix is not None:
            found["profile"] = await _profiled(bench, gateway_pid, profile_prefix, say)
        found["records"] = {"answered": bench.answered["tucano"]}
        return found


async def _profiled(bench: Bench, pid: int, prefix: Path, say, rate: float = 500, seconds: float = 8) -> dict:
    """py-spy on our gateway while it answers `rate` requests a second: a flame graph and the
    collapsed stacks (from two runs at the same rate), and the hottest frames."""
    outputs = {"flamegraph": prefix.with_name(f"{prefix.name}-flame.svg"), "raw": prefix.with_name(f"{prefix.name}-stacks.txt")}
    for fmt, path in outputs.items():
        profiler = _profile(pid, seconds, path, fmt)
        await asyncio.sleep(0.5)
        await bench.open_run("tucano", "extraction", rate, seconds)
        output, _ = await asyncio.get_running_loop().run_in_executor(None, profiler.communicate)
        if profiler.returncode != 0 or not path.is_file():
            say(f"[red]py-spy failed ({profiler.returncode}): {output[-500:]}[/red]")
            return {"error": f"py-spy exited {profiler.returncode}: {output[-500:]}"}
    collapsed = outputs["raw"].read_text()
    return {"rate": rate, "seconds": seconds, "flamegraph": outputs["flamegraph"].name, "stacks": outputs["raw"].name,
            "hottest": hottest_frames(collapsed), "packages": by_package(collapsed)}


def verdicts(results: dict) -> list[tuple[str, str, str]]:
    """(target, measured, met/missed) from the first delay's figures."""
    found = results["delays"][0]
    out = []
    if "tucano" not in results.get("sides", SIDES):
        return out
    at_rate = next((row for row in found["open"] if row["rate"] == TARGET["rate"]), None)
    tucano = (at_rate or {}).get("sides", {}).get("tucano")
    if tucano:
        for key, limit in (("own_p50_ms", TARGET["own_p50_ms"]), ("own_p99_ms", TARGET["own_p99_ms"])):
            value = tucano.get(key)
            out.append((f"our own time {key[4:7]} <= {limit} ms at {TARGET['rate']} req/s, one worker", str(value),
                        "met" if value is not None and value <= limit else "missed"))
    elif TARGET["rate"] in results.get("rates", [TARGET["rate"]]):
        out.append((f"our gateway holds {TARGET['rate']} req/s", "did not hold a lower rate", "missed"))
    else:
        out.append((f"our own time at {TARGET['rate']} req/s", f"not measured (--rate did not ask for {TARGET['rate']})", "not measured"))
    for row in found["closed"]:
        ours, theirs = row["sides"].get("tucano"), row["sides"].get("litellm")
        if ours and theirs:
            ratio = theirs["added_p50"] / ours["added_p50"] if ours["added_p50"] > 0 else float("inf")
            out.append((f"{row['workload']} c={row['concurrency']}: LiteLLM's added p50 >= {TARGET['vs_litellm']}x ours",
                        f"{theirs['added_p50']} vs {ours['added_p50']} ms (x{ratio:.1f})", "met" if ratio >= TARGET["vs_litellm"] else "missed"))
    return out


def table(results: dict) -> str:
    lines = []
    for name, peer in results["peers"].items():
        lines.append(f"- {name}: {peer['package']} " + (f"version {peer['version']}" if not peer["error"] else f"NOT MEASURED: {peer['error']}"))
    for found in results["delays"]:
        mock = found["mock"]
        lines += ["", f"## Mock engine delay {found['delay_ms']} ms", "",
                  f"Mock: {mock['cpu_ms_per_request']} ms CPU per request (ceiling about {mock['ceiling_rps_one_core']} req/s on its core); "
                  f"client and mock together {mock['client_and_mock_rps_at_64']} req/s at concurrency 64. Records in Redis "
                  f"{found['records']['in_redis']}, answers of our gateway {found['records']['answered']}.", "",
                  "| workload | concurrency | side | p50 ms | added p50 ms [95%] | added p99 ms [95%] | added p99.9 ms [95%] | CPU ms/req | failed |",
                  "|---|---:|---|---:|---|---|---|---:|---:|"]
        for row in found["closed"]:
            for name, e in row["sides"].items():
                added = ["-"] * 3 if name == "direct" else [f"{e[f'added_{k}']} [{e[f'added_{k}_ci95_ms'][0]}, {e[f'added_{k}_ci95_ms'][1]}]"
                                                           for k in ("p50", "p99", "p999")]
                cpu = e["cpu_ms_per_request"] if e["cpu_ms_per_request"] is not None else "-"
                if name == "tucano":
                    cpu = f"{cpu} (+{e['redis_cpu_ms_per_request']} Valkey); own p50 {e['own_p50_ms']} / p99 {e['own_p99_ms']}"
                lines.append(f"| {row['workload']} | {row['concurrency']} | {name} | {e['p50_ms']} | " + " | ".join(added) + f" | {cpu} | {e['failed']} |")
        lines += ["", "| rate req/s | side | p50 ms | p99 ms | p99.9 ms | added p50 [95%] | added p99 [95%] | CPU ms/req | failed | holds |",
                  "|---:|---|---:|---:|---:|---|---|---:|---:|---|"]
        for row in found["open"]:
            for name, e in row["sides"].items():
                added = ["-", "-"] if "added_p50" not in e else [f"{e[f'added_{k}']} [{e[f'added_{k}_ci95_ms'][0]}, {e[f'added_{k}_ci95_ms'][1]}]"
                                                                for k in ("p50", "p99")]
                cpu = e["cpu_ms_per_request"] if e["cpu_ms_per_request"] is not None else "-"
                if name == "tucano":
                    cpu = f"{cpu} (+{e['redis_cpu_ms_per_request']} Valkey); own p50 {e['own_p50_ms']} / p99 {e['own_p99_ms']}"
                lines.append(f"| {row['rate']:.0f} | {name} | {e.get('p50_ms', '-')} | {e.get('p99_ms', '-')} | {e.get('p999_ms', '-')} | "
                             + " | ".join(added) + f" | {cpu} | {e['failed']} | {'yes' if e['holds'] else 'no'} |")
        if found.get("profile", {}).get("hottest"):
            profile = found["profile"]
            lines += ["", f"py-spy on our gateway at {profile['rate']:.0f} req/s, samples holding the GIL ({profile['flamegraph']}); "
                          "where they were taken, by package: " + ", ".join(f"{name} {share:.1%}" for name, share in
                                                                           list(profile["packages"].items())[:14]),
                      "", "| frame | self | inclusive |", "|---|---:|---:|"]
            lines += [f"| `{f['frame'][:110]}` | {f['self']} | {f['inclusive']} |" for f in profile["hottest"]]
    lines += ["", "| target | measured | |", "|---|---|---|"] + [f"| {t} | {m} | {v} |" for t, m, v in verdicts(results)]
    cores = results["cores"]
    layout = "every process on shared cores" if cores == "shared" else (
        f"proxies (one worker each) on core {cores['proxies']}; mock, Valkey and load generator on core {cores['mock_redis_client']}")
    lines.append(f"\n{layout}. Added latency: a side's percentile minus direct's over the same requests; 95% intervals from "
                 f"resampling whole blocks ({RESAMPLES} times). Open loop: latency from when each request was due; a side holds a "
                 f"rate with at most {HOLDS['errors']:.0%} errors, p99 under {HOLDS['p99_ms']:.0f} ms and {HOLDS['answered']:.0%} answered. "
                 "vllm-router neither scores nor records: it is the floor of a bare hop. Ours does every step it does when serving.")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = results["delays"][0]
    figure, (closed_ax, open_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in SIDES[1:]:
        rows = [r for r in found["closed"] if r["workload"] == "extraction" and name in r["sides"]]
        if rows:
            levels = [r["concurrency"] for r in rows]
            closed_ax.errorbar(levels, [r["sides"][name]["added_p50"] for r in rows], marker="o", label=f"{name} p50",
                               yerr=[[r["sides"][name]["added_p50"] - r["sides"][name]["added_p50_ci95_ms"][0] for r in rows],
                                     [r["sides"][name]["added_p50_ci95_ms"][1] - r["sides"][name]["added_p50"] for r in rows]])
            closed_ax.plot(levels, [r["sides"][name]["added_p99"] for r in rows], linestyle="--", marker="x", label=f"{name} p99")
        rows = [r for r in found["open"] if name in r["sides"] and "added_p50" in r["sides"][name]]
        if rows:
            open_ax.plot([r["rate"] for r in rows], [r["sides"][name]["added_p50"] for r in rows], marker="o", label=f"{name} p50")
            open_ax.plot([r["rate"] for r in rows], [r["sides"][name]["added_p99"] for r in rows], linestyle="--", marker="x", label=f"{name} p99")
    closed_ax.set(xscale="log", yscale="symlog", xlabel="concurrency", ylabel="added latency, ms", title="closed loop, extraction")
    open_ax.set(yscale="symlog", xlabel="requests per second", ylabel="added latency, ms", title="open loop, extraction")
    for axis in (closed_ax, open_ax):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"Added latency over a mock engine ({found['delay_ms']} ms delay)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
