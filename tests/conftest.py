"""Shared fixtures. The bootstrap (DB, datasets, tiny models) is built once per test session in
a temporary data dir; set TUCANO_TEST_DATA_DIR to reuse one across sessions while developing."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from foundation.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Settings:
    """Settings of a fully bootstrapped data dir (built by the real `run`)."""
    from trainer.bootstrap import run

    data_dir = Path(os.environ.get("TUCANO_TEST_DATA_DIR") or tmp_path_factory.mktemp("tucano-data"))
    settings = load_settings(data_dir=data_dir)
    run(settings)
    return settings
