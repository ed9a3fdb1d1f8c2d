"""`tucano eval` (each eval source's table per adapter version) and `tucano eval-set add` (the
team's own eval rows, every row checked first)."""
from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.shared import console, fail, read_settings, store_url, task_option


def evaluate(task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
             version: Annotated[list[str] | None, typer.Option(help="Also score these versions (repeatable).")] = None,
             json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False) -> None:
    """Score the base model, the active version and any given versions on every eval row (the
    team's, loaded files', the bootstrap's), with each version's mean and 95% interval."""
    import asyncio

    from common.records import BASE_VERSION
    from common.stats import mean_interval
    from common.store import Store
    from deploy.hotswap import HotSwap
    from router.engine_client import EnginePool, EngineUnavailable
    from tasks import TASK_ENGINE, TASKS
    from trainer import gate

    settings = read_settings()
    tasks = task_option(task) or TASKS
    with store_url(settings) as url:
        store = Store(url)
        fleet = HotSwap.for_settings(store, settings)
        extra: dict[str, list] = {}
        for name in version or []:
            meta = store.adapter(name)
            if meta is None:
                raise fail(f"unknown adapter version {name!r}", 2)
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
            raise fail(str(error)) from None
    if json_out:
        print(json.dumps(results, indent=2))
        return
    for t, result in results.items():
        rows = ", ".join(f"{n} {source}" for source, n in result["rows"].items() if n)
        console.print(f"{t}: {sum(result['rows'].values())} eval rows ({rows or 'none'})", highlight=False)
        for v, figures in result["versions"].items():
            console.print(f"  {v:<16} {figures['mean']:.4f}  95% interval [{figures['low']:.4f}, {figures['high']:.4f}]", highlight=False)



eval_set = typer.Typer(no_args_is_help=True, help="The team's own eval rows.")


@eval_set.command("add")
def eval_set_add(file: Annotated[str, typer.Argument(help="JSONL rows: {\"task\", \"input\", \"reference\"} as in the datasets.")]) -> None:
    """Add a file of eval rows; every row is checked first, and one bad row adds nothing."""
    from common.store import Store
    from deploy.eval_set import EvalFileError, read_eval_file

    settings = read_settings()
    try:
        rows = read_eval_file(file)
    except EvalFileError as error:
        raise fail(f"{file}: nothing added: {error}", 2) from None
    with store_url(settings) as url:
        store = Store(url)
        added = {task: store.add_eval_rows(task, by_hash) for task, by_hash in rows.items()}
    for task, by_hash in rows.items():
        console.print(f"{task}: {added[task]} new eval rows ({len(by_hash) - added[task]} already there)")


