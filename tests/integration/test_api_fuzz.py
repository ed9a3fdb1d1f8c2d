"""Schemathesis against the gateway's own OpenAPI schema (real vLLM engines, real Valkey, both
keys configured and sent): valid and invalid requests for every operation, then stateful
sequences that follow the schema's links (an answer, then feedback on it). No response may be a
server error or break the schema it documents (the chat completion included)."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error

FUZZ_CONFIG = schemathesis.Config.from_dict({"generation": {"mode": "all", "max-examples": 12}, "seed": 20261122})
ADMIN = {"Authorization": "Bearer fuzz-admin"}


@pytest.fixture(scope="module")
def keyed_gateway(built, redis_url, engines):
    from pydantic import SecretStr

    from server.app import create_app
    from tests.integration.conftest import RunningServer, make_state

    keyed = built.model_copy(update={"redis_url": redis_url, "user_api_key": SecretStr("fuzz-user"),
                                     "admin_api_key": SecretStr("fuzz-admin"), "rate_limit_per_minute": 0})
    with RunningServer(create_app(make_state(keyed, redis_url, [engines["base"].url], engines["think"].url))) as running:
        yield running


@pytest.fixture(scope="module")
def api_schema(keyed_gateway):
    return schemathesis.openapi.from_url(f"{keyed_gateway.url}/openapi.json", config=FUZZ_CONFIG)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    case.call_and_validate(headers=ADMIN, checks=[not_a_server_error], timeout=120)


def test_stateful_sequences_get_no_server_error_and_follow_the_schema(api_schema):
    from schemathesis.specs.openapi.checks import response_schema_conformance

    class Workflow(api_schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"headers": ADMIN, "timeout": 120}

        def validate_response(self, response, case, additional_checks=(), **kwargs):
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    Workflow.run(settings=hypothesis_settings(max_examples=15, stateful_step_count=4, deadline=None,
                                              suppress_health_check=list(HealthCheck)))
