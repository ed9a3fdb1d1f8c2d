"""The unit tier: no bootstrap, no vLLM, no Redis server. What needs the commerce DB gets a small
one (500 orders, built in well under a second by the demo generator) in a temporary dir.

Collecting the tier imports none of the `TRAINING_LIBRARIES`: in two workers (`-n auto`) each
worker collects every module, and those imports take 10-20 s of a worker on two cores. The tests
that need them import them in their bodies and are marked `xdist_group("torch")`, so that with
`--dist loadgroup` one worker imports them and the other runs the rest meanwhile;
`heavy_at_collection` names the module whose collection broke the rule (tests/unit/test_house.py).
A module whose module-scoped fixture costs seconds is one group too, so that one worker builds it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from common.records import RewardContext

SQL_TIME_LIMIT_S = 1.0
SQL_ROW_CAP = 1000
_db: dict[str, Path] = {}
TRAINING_LIBRARIES = ("torch", "transformers", "trl", "peft", "vllm")
heavy_at_collection: dict[str, str] = {}  # a training library -> the collected node after which it was first imported


def pytest_collectreport(report: pytest.CollectReport) -> None:
    for library in TRAINING_LIBRARIES:
        if library in sys.modules and library not in heavy_at_collection:
            heavy_at_collection[library] = report.nodeid


@pytest.fixture(scope="session", autouse=True)
def small_commerce_db(tmp_path_factory) -> Path:
    from demo import commerce_db

    path = tmp_path_factory.mktemp("commerce") / "commerce.db"
    commerce_db.generate(path, 500, seed=7)
    _db["path"] = path
    return path


def ctx(task: str | None = None, **task_input) -> RewardContext:
    """A reward context over the small DB, as `Settings.reward_context` builds one: the input's fields
    read as `task`'s input model (no task: a context without an input)."""
    from tasks import typed_input

    return RewardContext(typed_input(task, task_input) if task else None, str(_db["path"]), SQL_TIME_LIMIT_S, SQL_ROW_CAP)
