"""Where our gateway's CPU per request goes (`tucano bench parts`), measured by taking parts away.

A profile says where samples land, not what a change would save: py-spy put redis-py at 10% of
the gateway's samples, yet under concurrency a record write costs almost nothing, because the
event loop already serves many sockets per wake-up. So the same gateway process is started
several times on the proxies' core, each with one part of the request path replaced by nothing:

- `served`: the gateway as it serves (engine call to the mock over HTTP, record in Valkey);
- `no record write`: `Store.add_record` returns at once;
- `no engine call`: the engine pool answers in-process with the mock's completion;
- `neither`: both taken away (what is left: HTTP server, FastAPI, prompt, scoring, metrics);
- `served, no FastAPI`: as served, but the task route's request goes from uvicorn straight to
  the route's function (a plain ASGI shim, a prototype for the benchmark: no key check, no
  error handling, the same body and answer models), which prices taking FastAPI off the path;
- `uvicorn floor`: a bare ASGI app on the same uvicorn (uvloop, httptools) that reads the body
  and answers a fixed JSON: the least any Python gateway on this server pays;
- `python hop`: uvicorn plus the aiohttp client forwarding to the mock (`bench gateway`'s hop).

Blocks of the same extraction requests go to each variant in turn (the order alternating per
round), at each concurrency. A variant's CPU per request is its process's CPU over a block; a
part's cost is the difference of two variants in the same round, with a 95% interval from
resampling rounds. Every variant that writes records is counted against Valkey afterwards.
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from bench.mock_engine import COMPLETION
from bench.peers import Requests, sender
from bench.stack import Side, drive, pin, serve_gateway, start, wait_ready
from common.datasets import load_split
from common.processes import free_port
from common.settings import Settings
from common.stats import mean_interval
from common.store import RECORDS, Store
from deploy.embedded_redis import EmbeddedRedis

GATEWAY_VARIANTS = {"served": "", "no record write": "record", "no engine call": "engine", "neither": "record,engine",
                    "served, no FastAPI": "fastapi"}
VARIANTS = (*GATEWAY_VARIANTS, "uvicorn floor", "python hop")
WRITES_RECORDS = ("served", "no engine call", "served, no FastAPI")
# what each part costs: (name, variant with it, variant without it)
PARTS = (("engine call (aiohttp, to the mock and back)", "served", "no engine call"),
         ("record write (one Lua call to Valkey)", "served", "no record write"),
         ("the app without I/O (FastAPI, prompt, scoring, metrics)", "neither", "uvicorn floor"),
         ("FastAPI and Starlette on the task route", "served", "served, no FastAPI"),
         ("uvicorn itself (the floor)", "uvicorn floor", None))


def serve_gateway_without(parts: str, *args: str) -> None:
    """`stack.serve_gateway`, with the named parts (`record`, `engine`, `fastapi`, comma-separated)
    replaced in this process before it serves (one worker: uvicorn serves in this process)."""
    from deploy import serve
    from router.engine_client import Completion, EnginePool

    taken = set(filter(None, parts.split(",")))
    if taken - {"record", "engine", "fastapi"}:
        raise SystemExit(f"unknown parts {sorted(taken - {'record', 'engine', 'fastapi'})}")

    async def no_record_write(self, record, label=None) -> str:
        return "0-0"

    async def in_process_completion(self, prompt, adapter, sampling, json_schema) -> list[Completion]:
        return [Completion(COMPLETION, len(prompt) // 4, len(COMPLETION) // 4, "stop", "in-process", adapter or "base")]

    if "record" in taken:
        Store.add_record = no_record_write
    if "engine" in taken:
        EnginePool.complete_group = in_process_completion
    if "fastapi" in taken:  # uvicorn imports `deploy.serve:gateway_app` by name: it finds this one
        gateway_app = serve.gateway_app
        serve.gateway_app = lambda: without_fastapi(gateway_app())
    serve_gateway(*args)


def without_fastapi(app):
    """An ASGI app that hands `POST /v1/tasks/{task}` from uvicorn straight to the route's
    function (body and answer through the same pydantic models); everything else, lifespan
    included, goes to `app`."""
    from server.deps import Caller
    from server.routes.tasks import run_task
    from server.schemas import TaskRequest

    caller = Caller(app.state.gateway, None, False, "bench")

    async def shim(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/tasks/"):
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        answer = await run_task(scope["path"].rsplit("/", 1)[1], TaskRequest.model_validate_json(b"".join(chunks)), caller)
        body = answer.model_dump_json().encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return shim


def differences(with_part: list[float], without_part: list[float] | None, seed: int = 0) -> dict:
    """Mean of the per-round differences (ms per request) and its 95% interval from resampled
    rounds; with no `without_part`, the variant's own mean and interval."""
    values = [a - (b if without_part else 0.0) for a, b in zip(with_part, without_part or with_part)]
    mean, low, high = mean_interval(values, seed=seed)
    return {"ms": round(mean, 4), "ci95": [round(low, 4), round(high, 4)]}


def run(settings: Settings, levels: list[int], rounds: int, block: int, say=print) -> dict:
    reviews = [row["input"]["review"] for row in load_split(settings.datasets_dir, "extraction", "eval")]
    bodies = Requests(reviews).bodies
    cores = sorted(os.sched_getaffinity(0))
    shared_core, proxy_core = ({cores[0]}, {cores[1]}) if len(cores) >= 2 else (None, None)
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-parts-")))
        mock_port = free_port()
        mock = start(stack, "bench.mock_engine:serve", scratch / "mock.log", str(mock_port), "0",
                     str(cores[0]) if shared_core else "")
        mock_url = f"http://127.0.0.1:{mock_port}"
        wait_ready(mock, "mock engine", f"{mock_url}/health", scratch / "mock.log")
        embedded = EmbeddedRedis(scratch / "redis")  # a fresh dir: it starts its own server
        redis_url = stack.enter_context(embedded)
        pin(embedded.process.pid, shared_core)
        # one completion a request, as the mock engine gives: the gateway's cost per request, not per group
        env = dict(os.environ, TUCANO_RATE_LIMIT_PER_MINUTE="0", TUCANO_ACCESS_LOG="false", TUCANO_SERVE_SAMPLES="{}")
        env.pop("TUCANO_USER_API_KEY", None)
        env.pop("TUCANO_ADMIN_API_KEY", None)
        sides: dict[str, Side] = {}
        for name in VARIANTS:
            port, log = free_port(), scratch / f"{name.replace(' ', '-')}.log"
            url = f"http://127.0.0.1:{port}"
            if name in GATEWAY_VARIANTS:
                process = start(stack, "bench.parts:serve_gateway_without", log, GATEWAY_VARIANTS[name], str(settings.root),
                                redis_url, mock_url, mock_url, str(port), "1", str(scratch / f"metrics-{port}"), "off", env=env)
                wait_ready(process, name, f"{url}/readyz", log)
            elif name == "uvicorn floor":
                process = start(stack, "bench.floor:serve", log, str(port))
                wait_ready(process, name, f"{url}/", log)
            else:
                process = start(stack, "bench.gateway:_serve_proxy", log, mock_url, str(port))
                wait_ready(process, name, url, log)
            pin(process.pid, proxy_core)
            sides[name] = Side("tucano" if name in GATEWAY_VARIANTS else name, url, name, [process.pid])
        if shared_core:
            os.sched_setaffinity(0, shared_core)
            stack.callback(os.sched_setaffinity, 0, cores)
        say(f"variants up: {', '.join(VARIANTS)}")
        found, answered = asyncio.run(_measure(sides, bodies, levels, rounds, block, say))
        in_redis = Store(redis_url).redis.xlen(RECORDS)
    written = sum(answered[name] for name in WRITES_RECORDS)
    if in_redis != written:
        say(f"[red]the recording variants answered {written} requests but Valkey holds {in_redis} records[/red]")
    return {"levels": found, "rounds": rounds, "block": block, "records": {"answered_by_recording_variants": written, "in_redis": in_redis},
            "cores": {"variants": sorted(proxy_core), "mock_redis_client": sorted(shared_core)} if proxy_core else "shared",
            "python": sys.version.split()[0]}


async def _measure(sides: dict[str, Side], bodies: dict, levels: list[int], rounds: int, block: int, say) -> tuple[list[dict], Counter]:
    import aiohttp

    answered: Counter = Counter()
    found = []
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        counts: dict[str, Counter] = {name: Counter() for name in sides}
        senders = {name: sender(client, side, counts[name]) for name, side in sides.items()}

        def payloads(name: str) -> list:
            pool = bodies["extraction", "python-hop" if name == "python hop" else "tucano"]  # the hop gets what the gateway sends on
            return [pool[i % len(pool)] for i in range(block)]

        for name in sides:  # every path warm
            await drive(senders[name], payloads(name)[:64], 8)
        for level in levels:
            cpu_ms: dict[str, list[float]] = {name: [] for name in sides}
            failures: Counter = Counter()
            for index in range(rounds):
                for name in (list(sides) if index % 2 == 0 else list(sides)[::-1]):
                    before = sides[name].cpu_s()
                    run = await drive(senders[name], payloads(name), level)
                    cpu_ms[name].append(1000 * (sides[name].cpu_s() - before) / block)
                    failures[name] += len(run["failures"])
            row = {"concurrency": level, "variants": {name: {**differences(cpu_ms[name], None), "failed": failures[name]}
                                                      for name in sides},
                   "parts": {part: differences(cpu_ms[with_part], cpu_ms[without] if without else None)
                             for part, with_part, without in PARTS}}
            found.append(row)
            say(f"c={level}: " + ", ".join(f"{name} {v['ms']} ms" for name, v in row["variants"].items()))
        for name in sides:
            answered[name] = counts[name][sides[name].name]
    return found, answered


def table(results: dict) -> str:
    lines = [f"CPU per request of each variant on its own core (ms, mean of {results['rounds']} rounds of {results['block']} "
             "extraction requests each, 95% interval from resampled rounds):", "",
             "| variant | " + " | ".join(f"c={row['concurrency']}" for row in results["levels"]) + " |",
             "|---|" + "---|" * len(results["levels"])]
    for name in VARIANTS:
        cells = [f"{row['variants'][name]['ms']:.3f} [{row['variants'][name]['ci95'][0]:.3f}, {row['variants'][name]['ci95'][1]:.3f}]"
                 + (f" ({row['variants'][name]['failed']} failed)" if row["variants"][name]["failed"] else "") for row in results["levels"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "What each part costs (the difference of two variants in the same round):", "",
              "| part | " + " | ".join(f"c={row['concurrency']}" for row in results["levels"]) + " |",
              "|---|" + "---|" * len(results["levels"])]
    for part, _, _ in PARTS:
        cells = [f"{row['parts'][part]['ms']:.3f} [{row['parts'][part]['ci95'][0]:.3f}, {row['parts'][part]['ci95'][1]:.3f}]"
                 for row in results["levels"]]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    records = results["records"]
    lines += ["", f"Records: the variants that write them answered {records['answered_by_recording_variants']}; "
                  f"Valkey holds {records['in_redis']}.",
              "Variants run on one core (one worker each); the mock, Valkey and the load generator on another."]
    return "\n".join(lines)
