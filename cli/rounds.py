"""`tucano rounds`: the history of training rounds, and one round in full."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.shared import console, fail, read_settings, store_url

app = typer.Typer(no_args_is_help=False, invoke_without_command=True, help="The history of training rounds.")


@app.callback()
def rounds_list(ctx: typer.Context, limit: Annotated[int, typer.Option(min=1, max=500, help="How many rounds.")] = 20) -> None:
    """List past rounds: per task the methods, examples, gate decision with its interval, canary outcome."""
    if ctx.invoked_subcommand:
        return
    from common.store import Store
    from deploy.history import rounds_table

    settings = read_settings()
    with store_url(settings) as url:
        console.print(rounds_table(Store(url).rounds(limit)), highlight=False)


@app.command("show")
def rounds_show(round_id: str) -> None:
    """One round in full (JSON)."""
    import msgspec

    from common.rounds import encode_round
    from common.store import Store

    settings = read_settings()
    with store_url(settings) as url:
        found = Store(url).round(round_id)
    if found is None:
        raise fail(f"no round {round_id!r}", 2)
    print(msgspec.json.format(encode_round(found), indent=2).decode())


