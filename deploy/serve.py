"""`tucano serve`: the whole stack in one process tree, with embedded defaults.

Redis: the configured URL, else an embedded Valkey in the data dir. Models: the configured
ones, else the bootstrap's (built first when missing). Engines: the configured URLs, else a
base and a think vLLM server (both with runtime LoRA) started here and restarted if they die.
Periodic jobs: trimming the records stream, judging canaries, unloading what rounds retired once
its drain is over, and the training rounds. Then the gateway (uvicorn, `gateway_workers`
processes) until SIGTERM/SIGINT, when everything stops cleanly in reverse order. A public
address without keys is refused before any of it (`deploy/starting.py`, `check_bind`).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import FastAPI
from redis.exceptions import LockError

from common.processes import bars_lock_within_the_process, die_with_parent, has_gpu, usable_cores
from common.settings import Settings, load_settings
from common.store import UNKNOWN_NUMERICS, Store
from common.tasks import EngineKind
from deploy.embedded_redis import EmbeddedRedis
from deploy.hotswap import AdapterLoadError, HotSwap, load_everywhere
from deploy.starting import StartingResponder, check_bind
from deploy.vllm_server import TRAINING_NICE, Supervisor, VllmServer, local_engine, run_engines
from router.engine_client import ChatTemplate, EnginePool
from router.route_table import RouteTable
from server.app import create_app
from server.state import GatewayState
from tasks import TASK_ENGINE
from trainer import canary

CANARY_WATCH_S = 5.0

log = logging.getLogger("tucano.serve")


def engine_device(settings: Settings) -> str:
    if settings.engine_device != "auto":
        return settings.engine_device
    return "cuda" if has_gpu() else "cpu"


def reload_active_adapters(store: Store, kind: str, urls: list[str], say=log.warning) -> None:
    """An engine that (re)starts has no adapters: load every active and canary version of the
    tasks its model serves into it. An engine that does not answer is left to the gateway, which
    loads what it lacks when it comes back, before it takes traffic (`EnginePool.check`)."""
    for version, path in store.routed_adapters(store.routes()[1], TASK_ENGINE).get(kind, {}).items():
        for url in urls:
            try:
                asyncio.run(load_everywhere([url], version, path))
            except AdapterLoadError as error:
                say(f"{kind} engine {url} did not take {version} now ({error}); the gateway loads it before "
                    "the engine takes traffic")


def build_state(settings: Settings, redis_url: str, base_urls: list[str], think_url: str) -> GatewayState:
    store = Store(redis_url, maxlen=settings.records_stream_maxlen)
    store.ensure_group()
    routes = RouteTable(store)
    pools = {
        EngineKind.BASE: EnginePool(EngineKind.BASE, base_urls, ChatTemplate.load(settings.base_model_path),
                                    timeout_s=settings.engine_timeout_s, routed_adapters=functools.partial(routes.served, EngineKind.BASE)),
        EngineKind.THINK: EnginePool(EngineKind.THINK, [think_url], ChatTemplate.load(settings.think_model_path),
                                     timeout_s=settings.engine_timeout_s, routed_adapters=functools.partial(routes.served, EngineKind.THINK)),
    }
    hotswap = HotSwap.for_settings(store, settings, base_urls, think_url, drain="background")
    return GatewayState(settings, store, routes, pools, adapter_action=hotswap.act)


def gateway_app() -> FastAPI:
    """One gateway worker's app (uvicorn's factory, called in each worker process): the settings
    come from the environment, where `run_gateway` put the Redis and engine URLs the stack uses."""
    settings = load_settings()
    if settings.gateway_workers > 1:  # a worker of uvicorn's supervisor: it must not outlive a killed `serve`
        die_with_parent()
        bars_lock_within_the_process()
    return create_app(build_state(settings, settings.redis_url, settings.base_engine_urls, settings.think_engine_url))


def run_gateway(redis_url: str, base_urls: list[str], think_url: str, host: str, port: int, workers: int,
                metrics_dir: Path, access_log: bool, log_level: str = "info") -> None:
    """Serve the gateway until SIGINT/SIGTERM: in this process with one worker, else in
    `workers` uvicorn worker processes on one socket. Each worker holds its own engine clients
    and routing table (a flip reaches all of them through Redis) and writes its metrics under
    `metrics_dir`, which /metrics sums; so one event loop's queue no longer holds every request
    when cores are free for more."""
    os.environ.update(TUCANO_REDIS_URL=redis_url, TUCANO_BASE_ENGINE_URLS=json.dumps(base_urls),
                      TUCANO_THINK_ENGINE_URL=think_url, TUCANO_GATEWAY_WORKERS=str(workers))
    if workers > 1:  # read by prometheus_client when each worker imports it
        shutil.rmtree(metrics_dir, ignore_errors=True)  # counts of workers of an earlier run
        metrics_dir.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    uvicorn.run("deploy.serve:gateway_app", factory=True, host=host, port=port, workers=workers, log_level=log_level,
                access_log=access_log)


def _run_round_process(settings: Settings, redis_url: str, say, trainable: threading.Event) -> None:
    """A round runs as its own process (`tucano train --once`): training never blocks the gateway,
    and a trainer that crashes or is killed takes nothing else down (its lock expires). None runs
    while the demo model is still being fine-tuned (`trainable` is not set): a round trains on the
    base model's weights."""
    if not trainable.is_set():
        say("the training round waits: the demo model's fine-tuning is still running")
        return
    log_path = settings.root / "logs" / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TUCANO_REDIS_URL=redis_url, TUCANO_DATA_DIR=str(settings.root))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the gateway workers' metrics files, not the trainer's
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // 2)))  # the engines keep the other half
    with log_path.open("ab") as log_file:
        # a stopping `serve` stops its round too (SIGTERM: an interrupted round loses nothing), rather than
        # leaving it to run on against the Valkey and engines that stop with `serve`
        trainer = subprocess.Popen([sys.executable, "-m", "cli", "train", "--once"], env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        if not has_gpu():  # it trains on the gateway's and the engines' cores: it yields to both
            os.setpriority(os.PRIO_PROCESS, trainer.pid, TRAINING_NICE)
        code = trainer.wait()
    say(f"training round finished with exit code {code}; log {log_path}")


def watch_canaries(settings: Settings, store: Store, fleet: HotSwap, say) -> None:
    """Judge every running canary on its live records; promote or roll it back when the verdict is
    in. One watcher acts at a time across every `serve` of the fleet (a Redis lock)."""
    lock = store.canary_lock()
    if not lock.acquire():
        return
    try:
        for task, route in store.routes()[1].items():
            if not route.canary:
                continue
            records = store.records_since(route.canary_since or "0-0", task)
            verdict = canary.judge(records, route.canary, route.canary_started or 0.0, settings.canary_min_requests,
                                   settings.canary_max_minutes, labelled=canary.labelled_scorer(settings, store, task, route.canary_started or 0.0))
            store.update_adapter(route.canary, canary=verdict.record)
            if verdict.action == "promote":
                promoted = asyncio.run(fleet.promote_canary(task, reason=verdict.reason))
                say(f"{task}: canary {route.canary} promoted ({verdict.reason}); examples retired: {promoted.examples_retired.reason}")
            elif verdict.action == "rollback":
                asyncio.run(fleet.abort_canary(task, reason=verdict.reason))
                say(f"{task}: canary {route.canary} rolled back ({verdict.reason})")
    finally:
        with contextlib.suppress(LockError):
            lock.release()


def unload_drained(fleet: HotSwap, say) -> None:
    unloaded = asyncio.run(fleet.unload_drained())
    if unloaded:
        say(f"unloaded after their drain: {', '.join(unloaded)}")


def _finish_bootstrap(settings: Settings, store: Store, redis_url: str, servers: list[VllmServer], supervisor: Supervisor,
                      trainable: threading.Event, say, command: list[str] | None = None) -> None:
    """The demo model's fine-tuning (`tucano bootstrap`, which publishes where it stands in the
    store for /readyz and the dashboard) as its own process beside the running service, while the
    engines serve the pretrained weights (prompts show the bootstrap split's rows meanwhile); then
    each engine is restarted on the fine-tuned weights, and training rounds may start."""
    log_path = settings.root / "logs" / "bootstrap.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TUCANO_REDIS_URL=redis_url, TUCANO_DATA_DIR=str(settings.root))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    say(f"fine-tuning the demo model beside the service (log {log_path}); the pretrained model answers meanwhile")
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(command or [sys.executable, "-m", "cli", "bootstrap"], env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        if not has_gpu():  # it trains on the gateway's and the engines' cores: it yields to both
            os.setpriority(os.PRIO_PROCESS, process.pid, TRAINING_NICE)
        code = process.wait()
    if supervisor.stopping:
        return
    if code != 0:
        say(f"[red]the demo model's fine-tuning failed (exit code {code}; log {log_path}): the pretrained model keeps "
            "serving; `tucano bootstrap` finishes it, and the next `tucano serve` serves it[/red]")
        return
    for server in servers:
        say(f"vLLM {server.name}: restarting on the fine-tuned weights (its tasks answer 503 with Retry-After meanwhile)")
        try:
            supervisor.restart(server)
        except RuntimeError as error:  # its supervisor keeps trying; rounds wait until a serve with the whole model
            say(f"[red]vLLM {server.name} did not come back on the fine-tuned weights: {error}[/red]")
            return
    store.set_serving_pretrained(False)
    trainable.set()
    say("the fine-tuned demo model serves now; training rounds may start")


def periodic_jobs(settings: Settings, store: Store, fleet: HotSwap, redis_url: str, say,
                  trainable: threading.Event) -> BackgroundScheduler:
    """Trimming of the records stream, the canary watcher, unloading what rounds retired, and (when
    enabled) the periodic training rounds."""
    scheduler = BackgroundScheduler()
    scheduler.add_job(store.trim_records, "interval", seconds=settings.records_trim_seconds, max_instances=1, coalesce=True)
    scheduler.add_job(watch_canaries, "interval", args=(settings, store, fleet, say), seconds=CANARY_WATCH_S, max_instances=1,
                      coalesce=True)
    scheduler.add_job(unload_drained, "interval", args=(fleet, say), seconds=CANARY_WATCH_S, max_instances=1, coalesce=True)
    if settings.train_enabled:
        scheduler.add_job(_run_round_process, "interval", args=(settings, redis_url, say, trainable), max_instances=1, coalesce=True,
                          minutes=settings.train_interval_minutes)
        say(f"training rounds every {settings.train_interval_minutes} min (log {settings.root / 'logs' / 'train.log'})")
    scheduler.start()
    return scheduler


class ModelNotFound(RuntimeError):
    """A configured model is not a checkpoint the engines can load; the message names the setting."""


def check_model(path: str, setting: str) -> None:
    """A local model path is a checkpoint: config, weights and tokenizer. A hub id (`owner/name`,
    nothing on disk by that name) is left to vLLM, which fetches it where a hub is reachable."""
    local = Path(path).expanduser()
    looks_local = path.startswith(("/", ".", "~")) or local.exists()
    if not looks_local:
        return
    hint = "" if setting.startswith("TUCANO_") else "; run `tucano bootstrap` to build it"
    if not local.is_dir():
        raise ModelNotFound(f"{setting}={path}: no such model directory{hint}")
    missing = [what for what, patterns in (("config.json", ("config.json",)), ("weights", ("*.safetensors", "*.bin")),
                                           ("tokenizer", ("tokenizer.json", "tokenizer_config.json")))
               if not any(any(local.glob(p)) for p in patterns)]
    if missing:
        raise ModelNotFound(f"{setting}={path} is not a model checkpoint: no {', no '.join(missing)} in it{hint}")


def check_models(settings: Settings) -> None:
    for path, configured, setting in ((settings.base_model_path, settings.base_model, "TUCANO_BASE_MODEL"),
                                      (settings.think_model_path, settings.think_model, "TUCANO_THINK_MODEL")):
        check_model(path, setting if configured else f"the bootstrap's model {Path(path).name}")


def serve(settings: Settings, say=print, finish_bootstrap: bool = False, starting: StartingResponder | None = None) -> None:
    """`finish_bootstrap`: the engines start on the demo model's early copies (the pretrained
    weights) and the rest of the bootstrap runs beside them (`_finish_bootstrap`). `starting`:
    what answers 503 on the gateway's port until the gateway binds it."""
    check_models(settings)
    warning = check_bind(settings)
    if warning:
        say(f"[yellow]{warning}[/yellow]")
    with ExitStack() as stack:
        redis_url = settings.redis_url or stack.enter_context(EmbeddedRedis(settings.redis_dir))
        say(f"redis: {redis_url if settings.redis_url else 'embedded Valkey in ' + str(settings.redis_dir)}")
        servers: list[VllmServer] = []
        device = engine_device(settings)
        if not settings.base_engine_urls:
            servers.append(local_engine(EngineKind.BASE, settings.base_model_path, device, settings.root / "logs", settings.engine_cpu_precision))
        if not settings.think_engine_url:
            servers.append(local_engine(EngineKind.THINK, settings.think_model_path, device, settings.root / "logs", settings.engine_cpu_precision))
        if starting is not None:
            starting.stage = "the engines are loading their models"
        run_engines(stack, servers, say)
        base_urls = settings.base_engine_urls or [s.url for s in servers if s.name == EngineKind.BASE]
        think_url = settings.think_engine_url or next(s.url for s in servers if s.name == EngineKind.THINK)
        store = Store(redis_url, maxlen=settings.records_stream_maxlen)
        numerics = {server.name: server.numerics for server in servers}
        store.register_engines(EngineKind.BASE, base_urls, numerics.get(EngineKind.BASE, UNKNOWN_NUMERICS))  # trainers and the CLI load adapters into these
        store.register_engines(EngineKind.THINK, [think_url], numerics.get(EngineKind.THINK, UNKNOWN_NUMERICS))
        store.set_serving_pretrained(finish_bootstrap)
        reload_active_adapters(store, EngineKind.BASE, base_urls, say)
        reload_active_adapters(store, EngineKind.THINK, [think_url], say)
        supervisor = Supervisor(servers, on_restart=lambda s: reload_active_adapters(store, s.name, [s.url]))
        stack.callback(supervisor.stop)
        supervisor.start()
        fleet = HotSwap.for_settings(store, settings, base_urls, think_url)
        trainable = threading.Event()
        if finish_bootstrap:
            threading.Thread(target=_finish_bootstrap, args=(settings, store, redis_url, servers, supervisor, trainable, say),
                             name="bootstrap", daemon=True).start()
        else:
            trainable.set()
        scheduler = periodic_jobs(settings, store, fleet, redis_url, say, trainable)
        stack.callback(scheduler.shutdown, wait=False)
        say(f"gateway on http://{settings.host}:{settings.port} (OpenAI base URL http://{settings.host}:{settings.port}/v1), "
            f"{settings.gateway_workers} worker(s)")
        if starting is not None:
            starting.close()
        # returns on SIGINT/SIGTERM (uvicorn's handlers), then the stack unwinds
        run_gateway(redis_url, base_urls, think_url, settings.host, settings.port, settings.gateway_workers,
                    settings.root / "run" / "gateway-metrics", settings.access_log)
