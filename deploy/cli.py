"""The `tucano` console script (PRODUCT §6): serve, train, eval, adapters, bootstrap, bench.

Settings come from TUCANO_* variables (see the README); a bad one stops the command with a
message naming it and exit code 2, as do unknown subcommands and options.
"""
from __future__ import annotations

import json
import signal
from contextlib import nullcontext
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from foundation.config import ConfigError, Settings, load_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="tucano-commerce: PT-BR e-commerce analysis on vLLM that keeps improving its own adapters.")
adapters_app = typer.Typer(no_args_is_help=True, help="List, promote and roll back adapter versions.")
bench_app = typer.Typer(no_args_is_help=True, help="Performance benchmarks (results under <data dir>/bench).")
app.add_typer(adapters_app, name="adapters")
app.add_typer(bench_app, name="bench")
console = Console(stderr=True)


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


def _not_yet(what: str, issue: int) -> None:
    console.print(f"[yellow]`tucano {what}` is not available yet: it arrives with issue #{issue}.[/yellow]")
    raise typer.Exit(1)


@app.command()
def bootstrap(force: Annotated[bool, typer.Option(help="Rebuild every step even if it is up to date.")] = False) -> None:
    """Build the commerce DB, the task datasets and the two tiny demo models in the data dir."""
    from trainer.bootstrap import STEPS, BootstrapError, check_writable, run

    settings = _settings()
    _exit_cleanly_on_sigterm()
    try:
        check_writable(settings.root)
    except BootstrapError as error:
        raise _fail(f"bootstrap failed: {error}") from None
    columns = (TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bars:
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
    from deploy.serve import serve as run_stack
    from trainer.bootstrap import BootstrapError, is_built
    from trainer.bootstrap import run as run_bootstrap

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


@app.command()
def train(once: Annotated[bool, typer.Option("--once", help="Run one round now.")] = False,
          task: Annotated[str | None, typer.Option(help="Only this task.")] = None) -> None:
    """Run a training round (or rounds periodically)."""
    _not_yet("train", 5)


@app.command("eval")
def evaluate() -> None:
    """The held-out benchmark table per task and adapter."""
    _not_yet("eval", 5)


@adapters_app.command("list")
def adapters_list() -> None:
    """List adapter versions and the active route of each task."""
    from rich.table import Table

    from foundation.embedded_redis import EmbeddedRedis
    from foundation.store import Store

    settings = _settings()
    with EmbeddedRedis(settings.redis_dir) if settings.redis_url is None else nullcontext(settings.redis_url) as url:
        store = Store(url)
        _, routes = store.routes()
        table = Table("version", "task", "status", "method", "eval total", "created")
        for meta in store.adapters():
            table.add_row(meta["version"], meta["task"], meta.get("status", "?"), meta.get("method", "-"),
                          str((meta.get("eval") or {}).get("total", "-")), str(meta.get("created", "-")))
        console.print(table)
        for task, route in sorted(routes.items()):
            console.print(f"route {task}: active={route.get('active')} previous={route.get('previous')}")


@adapters_app.command("promote")
def adapters_promote(version: str) -> None:
    """Load a version into every engine and flip its task's route to it."""
    _not_yet("adapters promote", 5)


@adapters_app.command("rollback")
def adapters_rollback(task: str) -> None:
    """Flip a task's route back to its previous version."""
    _not_yet("adapters rollback", 5)


@bench_app.command("rewards")
def bench_rewards(seconds: Annotated[float, typer.Option(help="Seconds of scoring per task.")] = 3.0) -> None:
    """Scores per second per task on one core (eval-split answers and realistic variants)."""
    from foundation.benchmarks import write_result
    from rewards import bench
    from trainer.bootstrap import is_built

    settings = _settings()
    if not is_built(settings):
        raise _fail(f"no bootstrap in {settings.root}: run `tucano bootstrap` first")
    results = bench.run(settings.datasets_dir, settings.db_path, seconds)
    table = bench.table(results)
    json_path, _ = write_result(settings.bench_dir, "rewards", results, table)
    console.print(table, highlight=False)
    console.print(f"written to {json_path}")


@app.command()
def settings() -> None:
    """Print the effective settings (secrets masked)."""
    console.print_json(json.dumps(_settings().model_dump(mode="json")))


if __name__ == "__main__":
    app()
