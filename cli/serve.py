"""`tucano bootstrap` and `tucano serve`: the demo data and models, and the whole stack (contract §6).
The stack's imports (FastAPI, scipy, the engine client) take seconds: they come after the checks,
so that a refusal answers at once and the port already answers 503 while they load."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.shared import console, exit_cleanly_on_sigterm, fail, read_settings, run_bootstrap


def bootstrap(force: Annotated[bool, typer.Option(help="Rebuild every step even if it is up to date.")] = False,
              tiny: Annotated[bool, typer.Option(help="Build the tiny from-scratch models (TUCANO_BOOTSTRAP_MODEL=tiny).")] = False
              ) -> None:
    """Build the commerce DB, the task datasets and the demo Base and Think models in the data dir."""
    settings = read_settings()  # a bad setting is named before the bootstrap's heavy imports
    from demo.bootstrap import BootstrapError, check_writable, steps_of

    if tiny:
        settings = settings.model_copy(update={"bootstrap_model": "tiny"})
    exit_cleanly_on_sigterm()
    try:
        check_writable(settings.root)
    except BootstrapError as error:
        raise fail(f"bootstrap failed: {error}") from None
    manifest = run_bootstrap(settings, force)
    for step in steps_of(settings):
        entry = manifest["steps"][step]
        extra = f", {entry['parameters']:,} parameters" if "parameters" in entry else ""
        console.print(f"{step:<12} {entry['seconds']:>8.1f} s{extra}")
    console.print(f"model: {settings.bootstrap_model}; manifest: {settings.manifest_path}")



def serve() -> None:
    """Run the whole stack: gateway, vLLM engines, Redis and the periodic trainer."""
    from deploy.starting import OpenBindRefused, StartingResponder, check_bind

    settings = read_settings()
    try:
        check_bind(settings)
    except OpenBindRefused as error:
        raise fail(str(error), 2) from None
    exit_cleanly_on_sigterm()
    try:
        starting = StartingResponder(settings.host, settings.port)
    except OSError as error:
        raise fail(f"cannot listen on {settings.host}:{settings.port}: {error.strerror} (another program holds the port? "
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
            run_bootstrap(settings)
            finish_bootstrap = False
        elif finish_bootstrap and not is_serveable(settings):
            console.print(f"no bootstrap of the {settings.bootstrap_model} demo model in {settings.root} yet: building what serving "
                          "needs first (the commerce DB, the datasets, the pretrained model); its fine-tuning then runs beside the service")
            starting.stage = "building the commerce DB, the datasets and the pretrained model"
            run_bootstrap(settings, serveable_only=True)
        try:
            run_stack(settings, say=lambda text: console.print(text, highlight=False), finish_bootstrap=finish_bootstrap,
                      starting=starting)
        except RuntimeError as error:
            raise fail(str(error)) from None


