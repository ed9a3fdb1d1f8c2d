"""Schemathesis against the gateway's own OpenAPI schema (real vLLM engines, real Valkey):
valid and invalid requests generated for every operation, and none may answer 5xx other than
the documented 503 (an engine or Redis unavailable), which a healthy stack never returns."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

FUZZ_CONFIG = schemathesis.Config.from_dict({"generation": {"mode": "all", "max-examples": 12}, "seed": 20261122})


@pytest.fixture(scope="module")
def api_schema(gateway):
    return schemathesis.openapi.from_url(f"{gateway.url}/openapi.json", config=FUZZ_CONFIG)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    case.call_and_validate(checks=[not_a_server_error], timeout=120)
