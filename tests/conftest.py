"""Both tiers: the repository's paths, and the rule that a failing unit test stops the run before
the integration tier starts (the unit tier runs first; see `testpaths` in pyproject.toml)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
UNIT = Path(__file__).resolve().parent / "unit"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and Path(report.fspath).resolve().is_relative_to(UNIT):
        pytest.unit_failed = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if getattr(pytest, "unit_failed", False) and not Path(item.fspath).resolve().is_relative_to(UNIT):
        item.session.shouldstop = "a unit test failed: the integration tier does not start"
        pytest.skip("a unit test failed; the integration tier does not start")
