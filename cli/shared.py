"""What every `tucano` command shares: the console (stderr), a failure's message and exit code, the
settings (a bad one is exit code 2, naming it), the store's URL (the configured Redis, else the
embedded one), the tasks an option names, the progress display of a long job, the bootstrap behind
it, and a benchmark's report. Imports that take seconds (the bootstrap, the store's server) stay
inside the helper that needs them, so that `tucano --help` and a refused option answer at once."""
from __future__ import annotations

import signal
import sys
from contextlib import contextmanager, nullcontext

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from common.settings import ConfigError, Settings, load_settings
from tasks import TASKS, check_settings

console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]{message}[/red]", soft_wrap=True, highlight=False, markup=True)
    return typer.Exit(code)


def read_settings() -> Settings:
    try:
        return check_settings(load_settings())
    except ConfigError as error:
        raise fail(str(error), 2) from None


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every `with` block (embedded Redis, engines) stops cleanly."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


@contextmanager
def progress_display(job: str, weights: dict[str, float] | None = None, publish=None):
    """One account of a long job's progress (`deploy.progress.ProgressLines`: the stage, the share
    done, the time spent and left), shown as a bar on a terminal and as plain lines elsewhere (a
    bar draws nothing in a log); `publish` hears it too. Yields `(say, progress)` for the job."""
    from deploy.progress import ProgressLines, duration

    if not console.is_terminal:
        def say(text: str) -> None:
            console.print(text, highlight=False, soft_wrap=True)
        yield say, ProgressLines(job, say, weights, publish=publish)
        return
    columns = (TextColumn("{task.description:<28}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(), TextColumn("{task.fields[left]}"))
    with Progress(*columns, console=console, transient=True) as bars:
        bar = bars.add_task(job, total=100, left="")

        def show(account) -> None:
            left = f"about {duration(account.seconds_left)} left" if account.seconds_left is not None else ""
            bars.update(bar, description=f"{job} {account.stage}", completed=round(100 * account.share), left=left)
            if publish is not None:
                publish(account)
        yield (lambda text: bars.console.print(text, highlight=False)), ProgressLines(job, lambda _: None, weights, publish=show)


def run_bootstrap(settings: Settings, force: bool = False, serveable_only: bool = False) -> dict:
    """The bootstrap behind one progress display, each stage weighted by its expected seconds; with
    a Redis configured (as `serve` runs it beside the service) where it stands is published there
    too, for /readyz and the dashboard."""
    from demo.bootstrap import BootstrapError, expected_seconds, run

    store = None
    if settings.redis_url:
        from common.store import Store

        store = Store(settings.redis_url)
    try:
        with progress_display("bootstrap", expected_seconds(settings, serveable_only), store and store.set_progress) as (_, progress):
            try:
                return run(settings, progress, force=force, serveable_only=serveable_only)
            except BootstrapError as error:
                failure = error
    finally:
        if store is not None:
            store.end_progress("bootstrap")
    raise fail(f"bootstrap failed: {failure}")



def store_url(settings: Settings):
    """The configured Redis, else the embedded one in the data dir (shared with a running `serve`)."""
    from deploy.embedded_redis import EmbeddedRedis

    return EmbeddedRedis(settings.redis_dir) if settings.redis_url is None else nullcontext(settings.redis_url)


def known_tasks(tasks, option: str = "--task") -> tuple[str, ...]:
    """The tasks an option names, each known; else the command stops (exit 2) before anything runs."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise fail(f"{option}: unknown task {', '.join(map(repr, unknown))}; tasks are {', '.join(TASKS)}", 2)
    return tuple(tasks)


def task_option(task: str | None) -> tuple[str, ...] | None:
    return known_tasks((task,)) if task else None



def built_settings() -> Settings:
    from demo.bootstrap import is_built

    settings = read_settings()
    if not is_built(settings, any_model=True):
        raise fail(f"no bootstrap in {settings.root}: run `tucano bootstrap` first")
    return settings


def report(settings: Settings, name: str, results: dict, table: str) -> None:
    """The one tail of every benchmark: write the results, print the table and where they went."""
    from bench.results import write

    json_path, _ = write(settings.bench_dir, name, results, table)
    console.print(table, highlight=False, markup=False)
    console.print(f"written to {json_path}")


