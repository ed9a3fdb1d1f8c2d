"""The `tucano` console script (PRODUCT §6): serve, train, eval, adapters, bootstrap, bench.

Settings come from TUCANO_* variables (see the README); a bad one stops the command with a
message naming it and exit code 2, as do unknown subcommands and options.
"""
from __future__ import annotations

import json
import signal
import sys
from contextlib import nullcontext, suppress
from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.settings import ConfigError, Settings, load_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="tucano-commerce: PT-BR e-commerce analysis on vLLM that keeps improving its own adapters.")
adapters_app = typer.Typer(no_args_is_help=True, help="List, promote and roll back adapter versions.")
bench_app = typer.Typer(no_args_is_help=True, help="Performance benchmarks (results under <data dir>/bench).")
app.add_typer(adapters_app, name="adapters")
app.add_typer(bench_app, name="bench")
console = Console(stderr=True)
_BAR_COLUMNS = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]{message}[/red]", soft_wrap=True, highlight=False, markup=True)
    return typer.Exit(code)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as error:
        raise _fail(str(error), 2) from None


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every `with` block (embedded Redis, engines) stops cleanly."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


@app.command()
def bootstrap(force: Annotated[bool, typer.Option(help="Rebuild every step even if it is up to date.")] = False) -> None:
    """Build the commerce DB, the task datasets and the two tiny demo models in the data dir."""
    from demo.bootstrap import STEPS, BootstrapError, check_writable, run

    settings = _settings()
    _exit_cleanly_on_sigterm()
    try:
        check_writable(settings.root)
    except BootstrapError as error:
        raise _fail(f"bootstrap failed: {error}") from None
    with Progress(*_BAR_COLUMNS, console=console) as bars:
        tasks = {step: bars.add_task(step, total=None) for step in STEPS}

        def report(step: str, completed: float, total: float) -> None:
            bars.update(tasks[step], completed=completed, total=total)

        try:
            manifest = run(settings, report, force=force)
        except BootstrapError as error:
            failure = error
        else:
            failure = None
    if failure:
        raise _fail(f"bootstrap failed: {failure}")
    for step in STEPS:
        entry = manifest["steps"][step]
        extra = f", {entry['parameters']:,} parameters" if "parameters" in entry else ""
        console.print(f"{step:<12} {entry['seconds']:>8.1f} s{extra}")
    console.print(f"manifest: {settings.manifest_path}")


@app.command()
def serve() -> None:
    """Run the whole stack: gateway, vLLM engines, Redis and the periodic trainer."""
    from demo.bootstrap import BootstrapError, is_built
    from demo.bootstrap import run as run_bootstrap
    from deploy.serve import serve as run_stack

    settings = _settings()
    _exit_cleanly_on_sigterm()
    uses_demo_models = settings.base_model is None or settings.think_model is None
    if uses_demo_models and not is_built(settings):
        console.print("no bootstrap in the data dir yet: building the demo models, DB and datasets first")
        try:
            run_bootstrap(settings, lambda step, done, total: None)
        except BootstrapError as error:
            raise _fail(f"bootstrap failed: {error}") from None
    try:
        run_stack(settings, say=lambda text: console.print(text, highlight=False))
    except RuntimeError as error:
        raise _fail(str(error)) from None


def _store_url(settings: Settings):
    """The configured Redis, else the embedded one in the data dir (shared with a running `serve`)."""
    from deploy.embedded_redis import EmbeddedRedis

    return EmbeddedRedis(settings.redis_dir) if settings.redis_url is None else nullcontext(settings.redis_url)


def _task_option(task: str | None) -> tuple[str, ...] | None:
    from trainer.round import TRAINED_TASKS

    if task is not None and task not in TRAINED_TASKS:
        raise _fail(f"--task must be one of {', '.join(TRAINED_TASKS)} (insights runs on the Think model, without adapters)", 2)
    return (task,) if task else None


@app.command()
def train(once: Annotated[bool, typer.Option("--once", help="Run one round now and exit.")] = False,
          task: Annotated[str | None, typer.Option(help="Only this task.")] = None) -> None:
    """Run one training round now (--once), or rounds every TUCANO_TRAIN_INTERVAL_MINUTES."""
    from common.store import Store
    from deploy.hotswap import HotSwap
    from trainer.round import RoundError, run_round

    settings = _settings()
    tasks = _task_option(task)
    _exit_cleanly_on_sigterm()
    with _store_url(settings) as url:
        store = Store(url, maxlen=settings.records_stream_maxlen)
        fleet = HotSwap.for_settings(store, settings)

        def one_round() -> None:
            with Progress(*_BAR_COLUMNS, console=console, transient=True) as bars:
                bar = bars.add_task("round", total=None)

                def say(text: str) -> None:
                    bars.console.print(text, highlight=False)

                def step(name: str, done: int, total: int) -> None:
                    bars.update(bar, description=name, completed=done, total=total)
                try:
                    run_round(settings, store, fleet, tasks, say=say, progress=step)
                except RoundError as error:
                    raise _fail(str(error)) from None
        if once:
            one_round()
            return
        from apscheduler.schedulers.blocking import BlockingScheduler

        scheduler = BlockingScheduler()
        scheduler.add_job(one_round, "interval", minutes=settings.train_interval_minutes, max_instances=1,
                          coalesce=True, next_run_time=datetime.now())
        console.print(f"a round every {settings.train_interval_minutes} min; Ctrl-C stops")
        with suppress(KeyboardInterrupt, SystemExit):
            scheduler.start()


@app.command("eval")
def evaluate(task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
             version: Annotated[list[str] | None, typer.Option(help="Also score these versions (repeatable).")] = None,
             json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False) -> None:
    """Score the base model, the active version and any given versions on the held-out eval split."""
    import asyncio

    from common.store import Store
    from deploy.hotswap import load_everywhere
    from router.engine_client import ChatTemplate, EnginePool, EngineUnavailable
    from trainer.gate import evaluate as score_versions
    from trainer.gate import table
    from trainer.round import TRAINED_TASKS

    settings = _settings()
    tasks = _task_option(task) or TRAINED_TASKS
    with _store_url(settings) as url:
        store = Store(url)
        urls = settings.base_engine_urls or store.engine_urls("base")
        if not urls:
            raise _fail("no base engine is registered: start `tucano serve` (or set TUCANO_BASE_ENGINE_URLS)")
        _, routes = store.routes()
        extra = {}
        for name in version or []:
            meta = store.adapter(name)
            if meta is None:
                raise _fail(f"unknown adapter version {name!r}", 2)
            extra.setdefault(meta.task, []).append(meta)

        async def run() -> dict:
            out = {}
            for t in tasks:
                versions = [None] + ([routes[t]["active"]] if routes.get(t, {}).get("active") else [])
                for meta in extra.get(t, []):
                    await load_everywhere(urls, meta.version, meta.path)
                    versions.append(meta.version)
                pool = EnginePool("base", urls, ChatTemplate.load(settings.base_model_path))
                try:
                    out[t] = await score_versions(pool, settings, t, list(dict.fromkeys(versions)))
                finally:
                    await pool.close()
            return out
        try:
            results = asyncio.run(run())
        except EngineUnavailable as error:
            raise _fail(str(error)) from None
    if json_out:
        print(json.dumps({t: [s.as_dict() for s in scores] for t, scores in results.items()}, indent=2))
        return
    for t, scores in results.items():
        console.print(table(t, scores), highlight=False)


@adapters_app.command("list")
def adapters_list() -> None:
    """List adapter versions and the active route of each task."""
    from rich.table import Table

    from common.store import Store

    settings = _settings()
    with _store_url(settings) as url:
        store = Store(url)
        _, routes = store.routes()
        table = Table("version", "task", "status", "method", "eval total", "created")
        for meta in store.adapters():
            table.add_row(meta.version, meta.task, meta.status, meta.method or "-",
                          str(meta.gate.get("total", "-")), str(meta.created))
        console.print(table)
        for task, route in sorted(routes.items()):
            console.print(f"route {task}: active={route.get('active')} previous={route.get('previous')}")


@adapters_app.command("promote")
def adapters_promote(version: str) -> None:
    """Load a version into every base engine, verify it answers, flip its task's route, drain, unload the old one."""
    _hotswap("promote", version)


@adapters_app.command("rollback")
def adapters_rollback(task: str) -> None:
    """Flip a task's route back to its previous version (re-loading it if needed)."""
    _task_option(task)
    _hotswap("rollback", task)


def _hotswap(action: str, target: str) -> None:
    import asyncio

    from common.store import Store
    from deploy.hotswap import AdapterLoadError, HotSwap, PromotionRefused

    settings = _settings()
    with _store_url(settings) as url:
        store = Store(url)
        hotswap = HotSwap.for_settings(store, settings)
        if not hotswap.urls("base"):
            console.print("[yellow]no base engine is registered: the route flips now and engines load it when they start[/yellow]")
        try:
            result = asyncio.run(hotswap.act(action, target))
        except LookupError as error:
            raise _fail(str(error).strip("'\""), 2) from None
        except (PromotionRefused, AdapterLoadError) as error:
            raise _fail(f"{action} refused, nothing flipped: {error}") from None
    console.print(f"{result['task']}: active={result['active']} previous={result['previous']}")


def _built_settings() -> Settings:
    from demo.bootstrap import is_built

    settings = _settings()
    if not is_built(settings):
        raise _fail(f"no bootstrap in {settings.root}: run `tucano bootstrap` first")
    return settings


def _report(settings: Settings, name: str, results: dict, table: str) -> None:
    """The one tail of every benchmark: write the results, print the table and where they went."""
    from deploy.bench.results import write

    json_path, _ = write(settings.bench_dir, name, results, table)
    console.print(table, highlight=False)
    console.print(f"written to {json_path}")


@bench_app.command("rewards")
def bench_rewards(seconds: Annotated[float, typer.Option(help="Seconds of scoring per task.")] = 3.0) -> None:
    """Scores per second per task on one core (eval-split answers and realistic variants)."""
    from deploy.bench import rewards as bench

    settings = _built_settings()
    results = bench.run(settings, seconds)
    _report(settings, "rewards", results, bench.table(results))


@bench_app.command("gateway")
def bench_gateway(
    concurrency: Annotated[list[int], typer.Option(help="Concurrency levels (repeat the option).")] = [1, 8, 32],  # noqa: B006
    requests: Annotated[int, typer.Option(min=8, help="Requests per level (at least twice the concurrency).")] = 64,
    max_tokens: Annotated[int, typer.Option(min=1, max=2048, help="Completion tokens per request.")] = 32,
    shared_cores: Annotated[bool, typer.Option("--shared-cores", help=(
        "Leave a local CPU engine on the same cores as the gateway (by default it gets cores of its own, "
        "as on a GPU box)."))] = False,
) -> None:
    """Latency and throughput straight to vLLM and through the gateway, side by side."""
    from deploy.bench import gateway as bench

    settings = _built_settings()
    if any(c < 1 or c > 256 for c in concurrency):
        raise _fail("--concurrency must be between 1 and 256", 2)
    results = bench.run(settings, sorted(set(concurrency)), requests, max_tokens, shared_cores, say=console.print)
    _report(settings, "gateway", results, bench.table(results))


@bench_app.command("train")
def bench_train(round_id: Annotated[str | None, typer.Option("--round", help="A round id (default: the latest that trained).")] = None) -> None:
    """Wall time per phase and tokens per second of a finished training round."""
    from deploy.bench import train as bench

    settings = _settings()
    try:
        summary = bench.find_round(settings.rounds_dir, round_id)
    except LookupError as error:
        raise _fail(str(error)) from None
    manifest = json.loads(settings.manifest_path.read_text()) if settings.manifest_path.is_file() else {}
    parameters = manifest.get("steps", {}).get("base_model", {}).get("parameters")
    results = bench.results(summary, parameters)
    _report(settings, "train", results, bench.table(results))


@app.command()
def settings() -> None:
    """Print the effective settings (secrets masked)."""
    console.print_json(json.dumps(_settings().model_dump(mode="json")))


if __name__ == "__main__":
    app()
