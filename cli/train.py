"""`tucano train`: one learning round now, or rounds on a schedule (APScheduler). The round's
imports (torch, TRL) come inside the command: `tucano --help` does not wait for them."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from cli.shared import console, exit_cleanly_on_sigterm, fail, progress_display, read_settings, store_url, task_option


def train(once: Annotated[bool, typer.Option("--once", help="Run one round now and exit.")] = False,
          task: Annotated[str | None, typer.Option(help="Only this task.")] = None) -> None:
    """Run one training round now (--once), or rounds every TUCANO_TRAIN_INTERVAL_MINUTES."""
    from common.store import Store
    from deploy.hotswap import HotSwap
    from tasks import TASKS
    from trainer.round import RoundError, run_round, stage_seconds

    settings = read_settings()
    tasks = task_option(task)
    exit_cleanly_on_sigterm()
    with store_url(settings) as url:
        store = Store(url, maxlen=settings.records_stream_maxlen)
        fleet = HotSwap.for_settings(store, settings, drain="later")  # serve unloads what the round retired

        def one_round() -> None:
            last = store.rounds(1)
            weights = stage_seconds(last[0] if last else None, tasks or TASKS)  # what its stages took the last time
            try:
                with progress_display("round", weights, publish=store.set_progress) as (say, progress):
                    run_round(settings, store, fleet, tasks, say=say, progress=progress)
            except RoundError as error:
                raise fail(str(error)) from None
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


