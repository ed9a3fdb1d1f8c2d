"""The `tucano` console script (contract §6): serve, train, eval, eval-set, rounds, adapters,
bootstrap, bench, settings; one module per command group, this one putting them together.

Settings come from TUCANO_* variables (docs/configuration.md); a bad one stops the command with a
message naming it and exit code 2, as do unknown subcommands and options.
"""
from __future__ import annotations

import json
import logging
import os
import sys

import typer

from cli import adapters, bench, evaluate, rounds, serve, train
from cli.shared import console, read_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="tucano-commerce: PT-BR e-commerce analysis on vLLM that keeps improving its own adapters.")
app.command()(serve.bootstrap)
app.command()(serve.serve)
app.command()(train.train)
app.command("eval")(evaluate.evaluate)
app.add_typer(evaluate.eval_set, name="eval-set")
app.add_typer(rounds.app, name="rounds")
app.add_typer(adapters.app, name="adapters")
app.add_typer(bench.app, name="bench")


@app.command()
def settings() -> None:
    """Print the effective settings (secrets masked)."""
    console.print_json(json.dumps(read_settings().model_dump(mode="json")))



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

