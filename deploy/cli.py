"""The `tucano` console script (contract §6): serve, train, eval, eval-set, rounds, adapters,
bootstrap, bench, settings.

Settings come from TUCANO_* variables (docs/configuration.md); a bad one stops the command with a
message naming it and exit code 2, as do unknown subcommands and options.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from common.settings import ConfigError, Settings, load_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="tucano-commerce: PT-BR e-commerce analysis on vLLM that keeps improving its own adapters.")
adapters_app = typer.Typer(no_args_is_help=True, help="List, promote, roll back and canary adapter versions.")
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


@contextmanager
def _progress_display(job: str, weights: dict[str, float] | None = None, publish=None):
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


def _run_bootstrap(settings: Settings, force: bool = False, serveable_only: bool = False) -> dict:
    """The bootstrap behind one progress display, each stage weighted by its expected seconds; with
    a Redis configured (as `serve` runs it beside the service) where it stands is published there
    too, for /readyz and the dashboard."""
    from demo.bootstrap import BootstrapError, expected_seconds, run

    store = None
    if settings.redis_url:
        from common.store import Store

        store = Store(settings.redis_url)
    try:
        with _progress_display("bootstrap", expected_seconds(settings, serveable_only), store and store.set_progress) as (_, progress):
            try:
                return run(settings, progress, force=force, serveable_only=serveable_only)
            except BootstrapError as error:
                failure = error
    finally:
        if store is not None:
            store.end_progress("bootstrap")
    raise _fail(f"bootstrap failed: {failure}")


@app.command()
def bootstrap(force: Annotated[bool, typer.Option(help="Rebuild every step even if it is up to date.")] = False,
              tiny: Annotated[bool, typer.Option(help="Build the tiny from-scratch models (TUCANO_BOOTSTRAP_MODEL=tiny).")] = False
              ) -> None:
    """Build the commerce DB, the task datasets and the demo Base and Think models in the data dir."""
    settings = _settings()  # a bad setting is named before the bootstrap's heavy imports
    from demo.bootstrap import BootstrapError, check_writable, steps_of

    if tiny:
        settings = settings.model_copy(update={"bootstrap_model": "tiny"})
    _exit_cleanly_on_sigterm()
    try:
        check_writable(settings.root)
    except BootstrapError as error:
        raise _fail(f"bootstrap failed: {error}") from None
    manifest = _run_bootstrap(settings, force)
    for step in steps_of(settings):
        entry = manifest["steps"][step]
        extra = f", {entry['parameters']:,} parameters" if "parameters" in entry else ""
        console.print(f"{step:<12} {entry['seconds']:>8.1f} s{extra}")
    console.print(f"model: {settings.bootstrap_model}; manifest: {settings.manifest_path}")


@app.command()
def serve() -> None:
    """Run the whole stack: gateway, vLLM engines, Redis and the periodic trainer."""
    from deploy.starting import OpenBindRefused, StartingResponder, check_bind

    settings = _settings()
    try:
        check_bind(settings)
    except OpenBindRefused as error:
        raise _fail(str(error), 2) from None
    _exit_cleanly_on_sigterm()
    try:
        starting = StartingResponder(settings.host, settings.port)
    except OSError as error:
        raise _fail(f"cannot listen on {settings.host}:{settings.port}: {error.strerror} (another program holds the port? "
                    "set TUCANO_PORT)", 2) from None
    with starting:
        # the stack's imports (FastAPI, scipy, the engine client; not torch, which only the bootstrap's
        # builders and the trainers import) take seconds: after the checks above, so that a refusal
        # comes at once, and while the port already answers 503
        from demo.bootstrap import is_built, is_serveable
        from deploy.serve import serve as run_stack

        uses_demo_models = settings.base_model is None or settings.think_model is None
        finish_bootstrap = uses_demo_models and not is_built(settings)
        if finish_bootstrap and (settings.bootstrap_model == "tiny" or settings.base_engine_urls or settings.think_engine_url):
            # the tiny models build in a minute; engines this `serve` does not start cannot be restarted on new weights
            console.print(f"no bootstrap of the {settings.bootstrap_model} demo models in {settings.root} yet: "
                          "building the models, the commerce DB and the datasets first (once)")
            starting.stage = "building the demo models"
            _run_bootstrap(settings)
            finish_bootstrap = False
        elif finish_bootstrap and not is_serveable(settings):
            console.print(f"no bootstrap of the {settings.bootstrap_model} demo model in {settings.root} yet: building what serving "
                          "needs first (the commerce DB, the datasets, the pretrained model); its fine-tuning then runs beside the service")
            starting.stage = "building the commerce DB, the datasets and the pretrained model"
            _run_bootstrap(settings, serveable_only=True)
        try:
            run_stack(settings, say=lambda text: console.print(text, highlight=False), finish_bootstrap=finish_bootstrap,
                      starting=starting)
        except RuntimeError as error:
            raise _fail(str(error)) from None


def _store_url(settings: Settings):
    """The configured Redis, else the embedded one in the data dir (shared with a running `serve`)."""
    from deploy.embedded_redis import EmbeddedRedis

    return EmbeddedRedis(settings.redis_dir) if settings.redis_url is None else nullcontext(settings.redis_url)


def _known_tasks(tasks, option: str = "--task") -> tuple[str, ...]:
    """The tasks an option names, each known; else the command stops (exit 2) before anything runs."""
    from common.tasks import TASKS

    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise _fail(f"{option}: unknown task {', '.join(map(repr, unknown))}; tasks are {', '.join(TASKS)}", 2)
    return tuple(tasks)


def _task_option(task: str | None) -> tuple[str, ...] | None:
    return _known_tasks((task,)) if task else None


@app.command()
def train(once: Annotated[bool, typer.Option("--once", help="Run one round now and exit.")] = False,
          task: Annotated[str | None, typer.Option(help="Only this task.")] = None) -> None:
    """Run one training round now (--once), or rounds every TUCANO_TRAIN_INTERVAL_MINUTES."""
    from common.store import Store
    from common.tasks import TASKS
    from deploy.hotswap import HotSwap
    from trainer.round import RoundError, run_round, stage_seconds

    settings = _settings()
    tasks = _task_option(task)
    _exit_cleanly_on_sigterm()
    with _store_url(settings) as url:
        store = Store(url, maxlen=settings.records_stream_maxlen)
        fleet = HotSwap.for_settings(store, settings, drain="later")  # serve unloads what the round retired

        def one_round() -> None:
            last = store.rounds(1)
            weights = stage_seconds(last[0] if last else None, tasks or TASKS)  # what its stages took the last time
            try:
                with _progress_display("round", weights, publish=store.set_progress) as (say, progress):
                    run_round(settings, store, fleet, tasks, say=say, progress=progress)
            except RoundError as error:
                raise _fail(str(error)) from None
            finally:
                store.end_progress("round")
        if once:
            one_round()
            return
        from apscheduler.schedulers.blocking import BlockingScheduler

        scheduler = BlockingScheduler()
        scheduler.add_job(one_round, "interval", minutes=settings.train_interval_minutes, max_instances=1,
                          coalesce=True, next_run_time=datetime.now())
        console.print(f"a round every {settings.train_interval_minutes} min; Ctrl-C stops")
        try:
            scheduler.start()
        except (KeyboardInterrupt, SystemExit):
            pass


@app.command("eval")
def evaluate(task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
             version: Annotated[list[str] | None, typer.Option(help="Also score these versions (repeatable).")] = None,
             json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False) -> None:
    """Score the base model, the active version and any given versions on every eval row (the
    team's, loaded files', the bootstrap's), with each version's mean and 95% interval."""
    import asyncio

    from common.records import BASE_VERSION
    from common.stats import mean_interval
    from common.store import Store
    from common.tasks import TASK_ENGINE, TASKS
    from deploy.hotswap import HotSwap
    from router.engine_client import EnginePool, EngineUnavailable
    from trainer import gate

    settings = _settings()
    tasks = _task_option(task) or TASKS
    with _store_url(settings) as url:
        store = Store(url)
        fleet = HotSwap.for_settings(store, settings)
        extra: dict[str, list] = {}
        for name in version or []:
            meta = store.adapter(name)
            if meta is None:
                raise _fail(f"unknown adapter version {name!r}", 2)
            extra.setdefault(meta.task, []).append(meta)
        routes = store.routes()[1]

        async def run() -> dict:
            out = {}
            for t in tasks:
                kind = TASK_ENGINE[t]
                if not fleet.urls(kind):
                    raise EngineUnavailable(f"no {kind} engine is registered: start `tucano serve` (or set its URLs)")
                versions = [None, routes[t].active if t in routes else None] + [m.version for m in extra.get(t, [])]
                for meta in extra.get(t, []):
                    await fleet.load(meta.version, meta.path, kind)
                rows = gate.eval_rows(settings, store, t)
                pool = EnginePool.for_task(settings, t, fleet.urls(kind))
                try:
                    scores = {v or BASE_VERSION: await gate.answer(pool, settings, t, v, rows, settings.seed) for v in dict.fromkeys(versions)}
                finally:
                    await pool.close()
                out[t] = {"rows": {s: sum(1 for r in rows if r.source == s) for s in gate.SOURCES},
                          "versions": {v: dict(zip(("mean", "low", "high"), (round(x, 4) for x in mean_interval([s.total for s in sc]))))
                                       for v, sc in scores.items()}}
            return out
        try:
            results = asyncio.run(run())
        except EngineUnavailable as error:
            raise _fail(str(error)) from None
    if json_out:
        print(json.dumps(results, indent=2))
        return
    for t, result in results.items():
        rows = ", ".join(f"{n} {source}" for source, n in result["rows"].items() if n)
        console.print(f"{t}: {sum(result['rows'].values())} eval rows ({rows or 'none'})", highlight=False)
        for v, figures in result["versions"].items():
            console.print(f"  {v:<16} {figures['mean']:.4f}  95% interval [{figures['low']:.4f}, {figures['high']:.4f}]", highlight=False)


eval_set_app = typer.Typer(no_args_is_help=True, help="The team's own eval rows.")
app.add_typer(eval_set_app, name="eval-set")


@eval_set_app.command("add")
def eval_set_add(file: Annotated[str, typer.Argument(help="JSONL rows: {\"task\", \"input\", \"reference\"} as in the datasets.")]) -> None:
    """Add a file of eval rows; every row is checked first, and one bad row adds nothing."""
    from common.store import Store
    from deploy.eval_set import EvalFileError, read_eval_file

    settings = _settings()
    try:
        rows = read_eval_file(file)
    except EvalFileError as error:
        raise _fail(f"{file}: nothing added: {error}", 2) from None
    with _store_url(settings) as url:
        store = Store(url)
        added = {task: store.add_eval_rows(task, by_hash) for task, by_hash in rows.items()}
    for task, by_hash in rows.items():
        console.print(f"{task}: {added[task]} new eval rows ({len(by_hash) - added[task]} already there)")


rounds_app = typer.Typer(no_args_is_help=False, invoke_without_command=True, help="The history of training rounds.")
app.add_typer(rounds_app, name="rounds")


@rounds_app.callback()
def rounds_list(ctx: typer.Context, limit: Annotated[int, typer.Option(min=1, max=500, help="How many rounds.")] = 20) -> None:
    """List past rounds: per task the methods, examples, gate decision with its interval, canary outcome."""
    if ctx.invoked_subcommand:
        return
    from common.store import Store
    from deploy.history import rounds_table

    settings = _settings()
    with _store_url(settings) as url:
        console.print(rounds_table(Store(url).rounds(limit)), highlight=False)


@rounds_app.command("show")
def rounds_show(round_id: str) -> None:
    """One round in full (JSON)."""
    import msgspec

    from common.rounds import encode_round
    from common.store import Store

    settings = _settings()
    with _store_url(settings) as url:
        found = Store(url).round(round_id)
    if found is None:
        raise _fail(f"no round {round_id!r}", 2)
    print(msgspec.json.format(encode_round(found), indent=2).decode())


@adapters_app.command("list")
def adapters_list() -> None:
    """List adapter versions (with their gate decision and dates) and each task's route."""
    from common.store import Store
    from deploy.history import adapters_table

    settings = _settings()
    with _store_url(settings) as url:
        store = Store(url)
        console.print(adapters_table(store.adapters()))
        for task, route in sorted(store.routes()[1].items()):
            canary = f" canary={route.canary} ({route.canary_share:.0%})" if route.canary else ""
            console.print(f"route {task}: active={route.active} previous={route.previous}{canary}")


@adapters_app.command("promote")
def adapters_promote(version: str) -> None:
    """Load a version into every engine of its model, verify it answers, flip its task's route, drain, unload the old one."""
    _hotswap("promote", version)


@adapters_app.command("rollback")
def adapters_rollback(task: str) -> None:
    """Flip a task's route back to its previous version (re-loading it if needed)."""
    _task_option(task)
    _hotswap("rollback", task)


canary_app = typer.Typer(no_args_is_help=True, help="Start, promote or abort a canary.")
adapters_app.add_typer(canary_app, name="canary")


@canary_app.command("start")
def canary_start(version: str, share: Annotated[float, typer.Option(help="Share of the task's traffic, in (0, 1).")] = 0.2) -> None:
    """Serve a candidate version to a share of its task's traffic."""
    if not 0 < share < 1:
        raise _fail(f"--share must be between 0 and 1 (exclusive), not {share}", 2)
    _hotswap("canary", version, share=share)


@canary_app.command("promote")
def canary_promote(task: str) -> None:
    """Promote the task's running canary."""
    _task_option(task)
    _hotswap("canary-promote", task)


@canary_app.command("abort")
def canary_abort(task: str) -> None:
    """Roll the task's canary back: all traffic to the active version."""
    _task_option(task)
    _hotswap("canary-abort", task)


def _hotswap(action: str, target: str, **options) -> None:
    import asyncio

    from common.lifecycle import TransitionRefused
    from common.store import Store
    from common.tasks import EngineKind
    from deploy.hotswap import AdapterLoadError, HotSwap

    settings = _settings()
    with _store_url(settings) as url:
        store = Store(url)
        hotswap = HotSwap.for_settings(store, settings)
        if not hotswap.urls(EngineKind.BASE):
            console.print("[yellow]no base engine is registered: the route flips now and engines load it when they start[/yellow]")
        try:
            result = asyncio.run(hotswap.act(action, target, **options))
        except LookupError as error:
            raise _fail(str(error).strip("'\""), 2) from None
        except (TransitionRefused, AdapterLoadError, ValueError) as error:
            raise _fail(f"{action} refused, nothing changed: {error}") from None
    print(json.dumps(result, ensure_ascii=False))  # the result on stdout, unwrapped, for a script to read


def _built_settings() -> Settings:
    from demo.bootstrap import is_built

    settings = _settings()
    if not is_built(settings, any_model=True):
        raise _fail(f"no bootstrap in {settings.root}: run `tucano bootstrap` first")
    return settings


def _report(settings: Settings, name: str, results: dict, table: str) -> None:
    """The one tail of every benchmark: write the results, print the table and where they went."""
    from deploy.bench.results import write

    json_path, _ = write(settings.bench_dir, name, results, table)
    console.print(table, highlight=False, markup=False)
    console.print(f"written to {json_path}")


@bench_app.command("rewards")
def bench_rewards(seconds: Annotated[float, typer.Option(help="Seconds of scoring per task.")] = 3.0) -> None:
    """Scores per second per task on one core (eval-split answers and realistic variants)."""
    from deploy.bench import rewards as bench

    settings = _built_settings()
    results = bench.run(settings, seconds)
    _report(settings, "rewards", results, bench.table(results))


@bench_app.command("trivial")
def bench_trivial(
    rows: Annotated[int, typer.Option(help="Test rows per task.", min=4)] = 60,
    served: Annotated[bool, typer.Option(help="Start the engines and score the demo model's own answers beside the others.")] = True,
    save_answers: Annotated[str | None, typer.Option(help="Write the model's answers with their rows to this JSONL file.")] = None,
) -> None:
    """The references, the demo model's answers and answers that do no work, scored side by side."""
    from pathlib import Path

    from deploy.bench import trivial as bench

    settings = _built_settings()
    results = bench.run(settings, rows, served, Path(save_answers) if save_answers else None, say=console.print)
    _report(settings, "trivial", results, bench.table(results))


@bench_app.command("early")
def bench_early(rows: Annotated[int, typer.Option(help="Test rows per task.", min=4)] = 60) -> None:
    """The pretrained demo model's answers, with and without the bootstrap rows as demonstrations,
    beside the fine-tuned model's: what a first serve answers before its fine-tuning is done."""
    from deploy.bench import early as bench

    settings = _built_settings()
    try:
        results = bench.run(settings, rows, say=console.print)
    except FileNotFoundError as missing:
        raise _fail(str(missing), 2) from None
    _report(settings, "early", results, bench.table(results))


@bench_app.command("first-answer")
def bench_first_answer(
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.", min=60)] = 3600.0,
    keep: Annotated[bool, typer.Option(help="Keep the fresh data dir (its logs) afterwards.")] = False,
    ask_every: Annotated[float, typer.Option(help="Seconds between questions after the first answer (each keeps an engine "
                                                  "busy beside the fine-tuning).", min=1)] = 30.0,
) -> None:
    """A newcomer's first `tucano serve` on a fresh data dir: seconds to the first answer and until the
    fine-tuned demo model serves, each process's peak memory, and a clean stop."""
    from deploy.bench import first_answer as bench

    settings = _settings()
    results = bench.run(settings, timeout, say=lambda text: console.print(text, highlight=False), keep=keep, ask_every_s=ask_every)
    _report(settings, "first-answer", results, bench.table(results))


@bench_app.command("finetune")
def bench_finetune(
    steps: Annotated[int, typer.Option(help="Steps per arm.", min=2)] = 8,
    arm: Annotated[list[str] | None, typer.Option(help="Arms (repeatable): plain, checkpointing.")] = None,
    task: Annotated[str | None, typer.Option(help="Measure a round's SFT of this task instead of the bootstrap's fine-tuning.")] = None,
) -> None:
    """The bootstrap's fine-tuning (TRL's SFTTrainer), or with --task a round's SFT of that task,
    with and without gradient checkpointing: seconds per step and peak memory, each arm in its own process."""
    from deploy.bench import finetune as bench

    _task_option(task)
    settings = _built_settings()
    if settings.bootstrap_model == "tiny" and task is None:
        raise _fail("the tiny models are built from scratch, not fine-tuned: set TUCANO_BOOTSTRAP_MODEL to a pretrained demo model", 2)
    arms = tuple(arm or bench.ARMS)
    unknown = [a for a in arms if a not in bench.ARMS]
    if unknown:
        raise _fail(f"unknown arm {unknown}; arms are {', '.join(bench.ARMS)}", 2)
    try:
        results = bench.run(settings, steps, arms, say=lambda text: console.print(text, highlight=False), task=task)
    except RuntimeError as error:
        raise _fail(str(error)) from None
    _report(settings, f"finetune-{task}" if task else "finetune", results, bench.table(results))


@bench_app.command("calibration")
def bench_calibration(
    answers: Annotated[str | None, typer.Option(help="A JSONL file of answers with references (`bench trivial --save-answers`).")] = None,
    team: Annotated[bool, typer.Option(help="Also the labels of the team's traffic in Redis (needs TUCANO_REDIS_URL or a running serve).")] = False,
) -> None:
    """The served score against labels: rank correlation with the reference score, and liked above corrected."""
    from pathlib import Path

    from deploy.bench import calibration as bench

    settings = _settings()
    if answers is None and not team:
        raise _fail("give --answers FILE, --team, or both")
    path = Path(answers) if answers else None
    if path is not None and not path.is_file():
        raise _fail(f"no answers file at {path}")
    store = None
    if team:
        from common.store import Store

        if not settings.redis_url:
            raise _fail("--team reads the Redis that `tucano serve` uses: set TUCANO_REDIS_URL to it")
        store = Store(settings.redis_url)
        if not store.ping():
            raise _fail(f"Redis at {settings.redis_url} does not answer: start `tucano serve` or set TUCANO_REDIS_URL")
    results = bench.run(settings, path, store)
    _report(settings, "calibration", results, bench.table(results))


@bench_app.command("fix")
def bench_fix(
    task: Annotated[list[str] | None, typer.Option(help="Tasks (repeatable; default sql and push).")] = None,
    corrections: Annotated[int, typer.Option(min=4, help="Corrections per task.")] = 30,
    measure_rows: Annotated[int, typer.Option(min=8, help="Held-out rows per task the served reward is measured on.")] = 40,
) -> None:
    """Time-to-fix: served reward on held-out rows at once (examples), after the next round, and both."""
    from deploy.bench import fix as bench

    tasks = _known_tasks(task or ("sql", "push"))
    settings = _built_settings()
    results = bench.run(settings, tasks, corrections, measure_rows, say=lambda text: console.print(text, highlight=False))
    _report(settings, "fix", results, bench.table(results))


@bench_app.command("samples")
def bench_samples(
    task: Annotated[list[str] | None, typer.Option(help="Tasks (repeatable; default extraction, sql and push).")] = None,
    samples: Annotated[list[int] | None, typer.Option(min=2, max=32, help="Group sizes to compare with 1 (repeatable; default 4).")] = None,
    measure_rows: Annotated[int, typer.Option(min=10, help="Held-out rows per task.")] = 40,
    temperature: Annotated[float | None, typer.Option(min=0.0, max=2.0, help="A group's temperature; unset: the task's own.")] = None,
) -> None:
    """Best of n: reward with references on held-out rows and p95 latency, each group size beside one sample."""
    from deploy.bench import samples as bench

    tasks = _known_tasks(task or ("extraction", "sql", "push"))
    settings = _built_settings()
    results = bench.run(settings, tasks, samples or [4], measure_rows, temperature, say=lambda text: console.print(text, highlight=False))
    _report(settings, "samples", results, bench.table(results))


@bench_app.command("busy")
def bench_busy(
    task: Annotated[list[str] | None, typer.Option(help="Served tasks (repeatable; default sql and push).")] = None,
    load: Annotated[str, typer.Option(help="What trains beside them: round (a round's SFT) or bootstrap (the demo model's fine-tuning).")] = "round",
    train_task: Annotated[str, typer.Option(help="The task whose round's SFT trains (--load round).")] = "sql",
    pairs: Annotated[int, typer.Option(min=2, help="Block pairs (quiet and busy) per task.")] = 8,
    block_rows: Annotated[int, typer.Option(min=1, help="Requests per block.")] = 5,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Requests in flight.")] = 1,
) -> None:
    """Served p95 latency while training runs beside the engines, against the same requests without, side by side."""
    from deploy.bench import busy as bench

    tasks = _known_tasks(task or ("sql", "push"))
    _known_tasks((train_task,), "--train-task")
    if load not in bench.LOADS:
        raise _fail(f"--load {load!r}: one of {', '.join(bench.LOADS)}", 2)
    settings = _built_settings()
    results = bench.run(settings, tasks, load, train_task, pairs, block_rows, concurrency, say=lambda text: console.print(text, highlight=False))
    _report(settings, f"busy-{load}", results, bench.table(results))


@bench_app.command("grpo")
def bench_grpo(
    task: Annotated[str, typer.Option(help="The task whose served groups GRPO trains on.")] = "push",
    groups: Annotated[int, typer.Option(min=2, help="Groups sampled on the engine from the task's train rows.")] = 32,
    steps: Annotated[int, typer.Option(min=2, help="GRPO steps per arm and repeat.")] = 16,
    repeats: Annotated[int, typer.Option(min=1, max=6, help="Times each arm trains, the arms taking turns.")] = 2,
) -> None:
    """Seconds per GRPO step with each group's prompt run once, beside TRL's own forward, on the same served groups."""
    from deploy.bench import grpo as bench

    _known_tasks((task,))
    settings = _built_settings()
    results = bench.run(settings, task, groups, steps, repeats, say=lambda text: console.print(text, highlight=False))
    _report(settings, f"grpo-{task}", results, bench.table(results))


@bench_app.command("labels")
def bench_labels(
    task: Annotated[list[str] | None, typer.Option(help="Tasks (repeatable; default sql and push).")] = None,
    requests: Annotated[int, typer.Option(min=8, help="Requests per task, the answers the labels are chosen from.")] = 60,
    labels: Annotated[int, typer.Option(min=2, help="Labels per arm (the queue's, and each random draw's).")] = 30,
    draws: Annotated[int, typer.Option(min=1, max=10, help="Random draws of the same number of labels.")] = 2,
    measure_rows: Annotated[int, typer.Option(min=8, help="Held-out rows per task the reward is measured on.")] = 40,
    epochs: Annotated[float | None, typer.Option(min=0.5, max=20, help=(
        "Epochs of SFT over each arm's labels, with no time budget: every arm takes the same steps (default: one round's "
        "time budget, which buys fewer steps on longer references)."))] = None,
    trainings: Annotated[int, typer.Option(min=1, max=5, help=(
        "Trainings of each arm's labels, from consecutive seeds; each held-out row's reward is their mean, so an arm's gain "
        "is what its labels teach rather than one training's luck."))] = 1,
    name: Annotated[str, typer.Option(help="Result name under <data dir>/bench.")] = "labels",
) -> None:
    """The review queue's labels against random ones, side by side on the same traffic: what each set teaches per label."""
    from deploy.bench import labels as bench

    tasks = _known_tasks(task or ("sql", "push"))
    if labels > requests:
        raise _fail(f"--labels ({labels}) cannot be more than --requests ({requests}): the labels are chosen from the answers", 2)
    settings = _built_settings()
    results = bench.run(settings, requests, labels, draws, measure_rows, tasks, say=lambda text: console.print(text, highlight=False),
                        epochs=epochs, trainings=trainings)
    _report(settings, name, results, bench.table(results))


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


@bench_app.command("peers")
def bench_peers(
    concurrency: Annotated[list[int], typer.Option(help="Closed-loop concurrency levels (repeat the option).")] = [1, 8, 32, 128],  # noqa: B006
    rate: Annotated[list[float], typer.Option(help="Open-loop request rates per second (repeat the option).")] = [100, 500, 1000],  # noqa: B006
    requests: Annotated[int, typer.Option(min=16, help="Closed-loop requests per side per level.")] = 256,
    seconds: Annotated[float, typer.Option(min=0.5, max=60, help="Seconds per open-loop pass.")] = 3.0,
    passes: Annotated[int, typer.Option(min=2, max=20, help="Open-loop passes per side per rate (alternating order).")] = 4,
    delay_ms: Annotated[list[float], typer.Option(help="Mock engine delays in ms (repeat the option).")] = [0, 20],  # noqa: B006
    side: Annotated[list[str], typer.Option(help="Sides measured against the mock (repeat the option): tucano, python-hop, litellm, "
                                                 "vllm-router. Fewer than all writes peers-<sides>.*, not peers.*")] = [],  # noqa: B006
) -> None:
    """Our gateway against LiteLLM's proxy and vllm-router, side by side on a mock engine."""
    from deploy.bench import peers as bench

    settings = _built_settings()
    if any(c < 1 or c > 1024 for c in concurrency) or any(r <= 0 or r > 20_000 for r in rate) or any(d < 0 or d > 10_000 for d in delay_ms):
        raise _fail("--concurrency must be 1-1024, --rate above 0 and at most 20000, --delay-ms 0-10000", 2)
    unknown = sorted(set(side) - set(bench.SIDES[1:]))
    if unknown:
        raise _fail(f"--side takes {', '.join(bench.SIDES[1:])}; not {', '.join(unknown)}", 2)
    peers = tuple(s for s in bench.SIDES[1:] if s in side) if side else bench.SIDES[1:]
    name = "peers" if peers == bench.SIDES[1:] else "peers-" + "-".join(peers)
    results = bench.run(settings, sorted(set(concurrency)), sorted(set(rate)), requests, seconds, passes, list(dict.fromkeys(delay_ms)),
                        say=console.print, peers=peers, name=name)
    settings.bench_dir.mkdir(parents=True, exist_ok=True)
    bench.plot(results, settings.bench_dir / f"{name}.png")
    _report(settings, name, results, bench.table(results) + f"\n\n![added latency]({name}.png)")


@bench_app.command("parts")
def bench_parts(
    concurrency: Annotated[list[int], typer.Option(help="Closed-loop concurrency levels (repeat the option).")] = [1, 16],  # noqa: B006
    rounds: Annotated[int, typer.Option(min=4, max=100, help="Rounds of blocks per level (each variant once per round).")] = 10,
    block: Annotated[int, typer.Option(min=50, max=10_000, help="Requests per block.")] = 300,
) -> None:
    """Where our gateway's CPU per request goes: the gateway with parts taken away, side by side."""
    from deploy.bench import parts as bench

    settings = _built_settings()
    if any(c < 1 or c > 1024 for c in concurrency):
        raise _fail("--concurrency must be 1-1024", 2)
    results = bench.run(settings, sorted(set(concurrency)), rounds, block, say=console.print)
    _report(settings, "parts", results, bench.table(results))


@bench_app.command("train")
def bench_train(round_id: Annotated[str | None, typer.Option("--round", help="A round id (default: the latest that trained).")] = None) -> None:
    """Wall time per phase and tokens per second of a finished training round."""
    from deploy.bench import train as bench

    settings = _settings()
    try:
        summary = bench.find_round(settings.rounds_dir, round_id)
    except LookupError as error:
        raise _fail(str(error)) from None
    from demo.bootstrap import read_manifest

    parameters = read_manifest(settings).get("steps", {}).get("base_model", {}).get("parameters")
    results = bench.results(summary, parameters)
    _report(settings, "train", results, bench.table(results))


@bench_app.command("qlora")
def bench_qlora(
    shape: Annotated[str, typer.Option(help="An architecture measured with random weights: smollm2-135m, qwen3-1.7b or qwen3-8b.")] = "smollm2-135m",
    model: Annotated[Path | None, typer.Option(help="A checkpoint directory instead of a shape.")] = None,
    batch: Annotated[int, typer.Option(min=1)] = 8,
    length: Annotated[int, typer.Option(min=8, max=8192)] = 512,
    steps: Annotated[int, typer.Option(min=2)] = 20,
) -> None:
    """Peak accelerator memory and seconds per training step with the base in full precision and in 4-bit NF4."""
    from deploy.bench import qlora as bench

    if model is None and shape not in bench.SHAPES:
        raise _fail(f"unknown shape {shape!r}: one of {', '.join(sorted(bench.SHAPES))}, or --model DIR", 2)
    if model is not None and not (model / "config.json").is_file():
        raise _fail(f"{model} is not a checkpoint (no config.json)", 2)
    settings = _settings()
    results = bench.run(str(model) if model else None, shape, batch, length, steps, warmup=3)
    _report(settings, "qlora", results, bench.table(results))


@bench_app.command("learn")
def bench_learn(
    rounds: Annotated[int, typer.Option(min=1, max=20, help="Training rounds.")] = 3,
    requests: Annotated[int, typer.Option(min=8, help="Requests per task per round.")] = 150,
    correction_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of answers corrected.")] = 0.2,
    rating_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of answers rated.")] = 0.3,
    measure_rows: Annotated[int, typer.Option(min=8, help="Held-out rows per task the served reward is measured on.")] = 60,
    task: Annotated[list[str] | None, typer.Option(help="Only these tasks (repeatable).")] = None,
    oracle: Annotated[bool, typer.Option(help="Also train the oracle (SFT on every request's reference).")] = True,
    ablation: Annotated[list[str] | None, typer.Option(help="Tasks of the GRPO sum-vs-gdpo ablation (repeatable; default push).")] = None,
    no_ablation: Annotated[bool, typer.Option("--no-ablation", help="Skip the GRPO ablation.")] = False,
    canary: Annotated[str | None, typer.Option(help="Task whose oracle runs a canary on live traffic.")] = "extraction",
    no_canary: Annotated[bool, typer.Option("--no-canary", help="Skip the canary run.")] = False,
    label_curve: Annotated[list[int] | None, typer.Option(min=2, help="Also SFT from the base model on the first K requests' "
                                                            "references, per task (repeatable): label-bound or model-bound.")] = None,
    label_choice: Annotated[str, typer.Option(help="Which answers the team labels: `random`, or `queue` (the review queue's "
                                                   "order: the answers a label would help most first).")] = "random",
    traffic_only: Annotated[bool, typer.Option("--traffic-only", help="No corrections and no ratings: the rounds learn from the "
                                               "traffic alone (GRPO on the reference-free rewards); the held-out reward is still "
                                               "scored with references.")] = False,
    name: Annotated[str, typer.Option(help="Result name under <data dir>/bench.")] = "learn",
) -> None:
    """Play a team (traffic, corrections, ratings) for R rounds against the real stack; served reward per round on held-out rows."""
    from common.tasks import TASKS
    from deploy.bench import learn as bench

    tasks = _known_tasks(task or TASKS)
    _known_tasks(ablation or (), "--ablation")
    _known_tasks(() if no_canary else (canary,), "--canary")
    if label_choice not in ("random", "queue"):
        raise _fail(f"--label-choice takes random or queue, not {label_choice!r}", 2)
    if traffic_only:
        correction_rate = rating_rate = 0.0
    if correction_rate + rating_rate > 1:
        raise _fail("--correction-rate and --rating-rate add up to more than 1", 2)
    settings = _built_settings()
    results = bench.run(settings, rounds, requests, correction_rate, rating_rate, measure_rows, tasks, oracle,
                        () if no_ablation else tuple(ablation or ("push",)), None if no_canary else canary,
                        tuple(label_curve or ()), keep=settings.bench_dir / name, say=lambda text: console.print(text, highlight=False),
                        label_choice=label_choice)
    settings.bench_dir.mkdir(parents=True, exist_ok=True)
    bench.plot(results, settings.bench_dir / f"{name}.png")
    _report(settings, name, results, bench.table(results) + f"\n\n![learning curves]({name}.png)")
    bench.partial_path(settings.bench_dir / name).unlink(missing_ok=True)


@app.command()
def settings() -> None:
    """Print the effective settings (secrets masked)."""
    console.print_json(json.dumps(_settings().model_dump(mode="json")))


def main() -> None:
    """The console script: the command, then an exit that skips the interpreter's teardown. By then
    the command has stopped what it started (engines, Valkey, servers) and closed its files; what
    the teardown would add is triton's (imported with torch) hundreds of `nanobind: leaked` lines
    on stderr at every stop. The exit status is the command's."""
    try:
        app()
        code = 0
    except SystemExit as done:
        if isinstance(done.code, str):  # as the interpreter would: the message on stderr, status 1
            print(done.code, file=sys.stderr)
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    main()
