"""The unit tier: no bootstrap, no vLLM, no Redis server. What needs the commerce DB gets a small
one (500 orders, built in well under a second by the demo generator) in a temporary dir."""
from __future__ import annotations

from pathlib import Path

import pytest

SQL_TIME_LIMIT_S = 1.0
SQL_ROW_CAP = 1000
_db: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def small_commerce_db(tmp_path_factory) -> Path:
    from demo import commerce_db

    path = tmp_path_factory.mktemp("commerce") / "commerce.db"
    commerce_db.generate(path, 500, seed=7)
    _db["path"] = path
    return path


def ctx(**task_input) -> dict:
    """A reward context over the small DB, as `Settings.reward_context` builds one."""
    return dict(task_input, db_path=str(_db["path"]), timeout_s=SQL_TIME_LIMIT_S, row_cap=SQL_ROW_CAP)
