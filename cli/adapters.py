"""`tucano adapters`: list versions and routes; promote, roll back and canary through the same
hot-swap the admin API uses (`deploy.hotswap.HotSwap.act`), whose every promotion retires the
examples the version absorbed. A result is printed as JSON on stdout, for a script to read."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from cli.shared import console, fail, read_settings, store_url, task_option
from common.lifecycle import Action
from tasks import TASKS

app = typer.Typer(no_args_is_help=True, help="List, promote, roll back and canary adapter versions.")
@app.command("list")
def adapters_list() -> None:
    """List adapter versions (with their gate decision and dates) and each task's route."""
    from common.store import Store
    from deploy.history import adapters_table

    settings = read_settings()
    with store_url(settings) as url:
        store = Store(url)
        console.print(adapters_table(store.adapters(*TASKS)))
        for task, route in sorted(store.routes()[1].items()):
            canary = f" canary={route.canary} ({route.canary_share:.0%})" if route.canary else ""
            console.print(f"route {task}: active={route.active} previous={route.previous}{canary}")


@app.command("promote")
def adapters_promote(version: str) -> None:
    """Load a version into every engine of its model, verify it answers, flip its task's route, drain, unload the old one."""
    _hotswap(Action.PROMOTE, version)


@app.command("rollback")
def adapters_rollback(task: str) -> None:
    """Flip a task's route back to its previous version (re-loading it if needed)."""
    task_option(task)
    _hotswap(Action.ROLLBACK, task)


canary_app = typer.Typer(no_args_is_help=True, help="Start, promote or abort a canary.")
app.add_typer(canary_app, name="canary")


@canary_app.command("start")
def canary_start(version: str, share: Annotated[float, typer.Option(help="Share of the task's traffic, in (0, 1).")] = 0.2) -> None:
    """Serve a candidate version to a share of its task's traffic."""
    if not 0 < share < 1:
        raise fail(f"--share must be between 0 and 1 (exclusive), not {share}", 2)
    _hotswap(Action.CANARY, version, share=share)


@canary_app.command("promote")
def canary_promote(task: str) -> None:
    """Promote the task's running canary."""
    task_option(task)
    _hotswap(Action.CANARY_PROMOTE, task)


@canary_app.command("abort")
def canary_abort(task: str) -> None:
    """Roll the task's canary back: all traffic to the active version."""
    task_option(task)
    _hotswap(Action.CANARY_ABORT, task)


def _hotswap(action: Action, target: str, share: float | None = None) -> None:
    import asyncio

    from common.lifecycle import TransitionRefused
    from common.store import Store
    from common.tasks import EngineKind
    from deploy.hotswap import AdapterLoadError, HotSwap

    settings = read_settings()
    with store_url(settings) as url:
        store = Store(url)
        hotswap = HotSwap.for_settings(store, settings)
        if not hotswap.urls(EngineKind.BASE):
            console.print("[yellow]no base engine is registered: the route flips now and engines load it when they start[/yellow]")
        try:
            result = asyncio.run(hotswap.act(action, target, share=share))
        except LookupError as error:
            raise fail(str(error).strip("'\""), 2) from None
        except (TransitionRefused, AdapterLoadError, ValueError) as error:
            raise fail(f"{action} refused, nothing changed: {error}") from None
    print(json.dumps(asdict(result), ensure_ascii=False))  # the result on stdout, unwrapped, for a script to read


