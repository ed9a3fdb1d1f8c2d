"""The access matrix, every /v1 route x {no key, user key, admin key, wrong key} x {no keys
configured, user only, admin only, both}, against the real app (its engines and Redis
unreachable: a request that gets past the key check fails later, never with 401 or 403), and
`serve`'s bind guard."""
from __future__ import annotations

import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from common.settings import load_settings
from common.store import Store
from deploy.starting import OpenBindRefused, check_bind
from router.engine_client import EnginePool
from router.route_table import RouteTable
from server.app import create_app
from server.state import GatewayState
from tests.conftest import REPO

KEYS = {"none": None, "user": "user-key", "admin": "admin-key", "wrong": "not-a-key"}
CONFIGS = {"no keys": (None, None), "user only": ("user-key", None), "admin only": (None, "admin-key"), "both": ("user-key", "admin-key")}
UNREACHABLE = "http://127.0.0.1:9"


def app_for(user_key: str | None, admin_key: str | None, host: str = "127.0.0.1"):
    settings = load_settings(user_api_key=SecretStr(user_key) if user_key else None, host=host,
                             admin_api_key=SecretStr(admin_key) if admin_key else None, rate_limit_per_minute=0,
                             feedback_rate_limit_per_minute=0)
    store = Store("redis://127.0.0.1:9/0")
    pools = {kind: EnginePool(kind, [UNREACHABLE], template=None, probe_timeout_s=0.2) for kind in ("base", "think")}
    return create_app(GatewayState(settings, store, RouteTable(store, poll_s=30), pools, adapter_action=None))


def routes(app) -> list[tuple[str, str, bool]]:
    """(method, path, admin) of every /v1 route."""
    out = []
    for route in app.routes:
        if route.path.startswith("/v1/"):
            path = route.path.replace("{task}", "sql").replace("{round_id}", "r1")
            admin = any(word in route.path for word in ("promote", "rollback", "canary"))
            out += [(method, path, admin) for method in route.methods]
    return out


def expected(config: str, key: str, admin_route: bool) -> set[int] | None:
    """The matrix (docs/serving.md, "Access"): the refusal a request gets, or None when it gets through."""
    user_key, admin_key = CONFIGS[config]
    if user_key is None and admin_key is None:
        return None  # a loopback-only gateway with no keys: everything goes through
    presented = KEYS[key]
    if presented is None or presented not in (user_key, admin_key):
        return {401}
    if admin_route and presented != admin_key:
        return {403}
    return None


@pytest.fixture(scope="module")
def clients():
    made = {name: TestClient(app_for(*keys)) for name, keys in CONFIGS.items()}
    for client in made.values():
        client.__enter__()
    yield made
    for client in made.values():
        client.__exit__(None, None, None)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("key", list(KEYS))
def test_every_route_enforces_the_access_matrix(clients, config, key):
    client = clients[config]
    headers = {"Authorization": f"Bearer {KEYS[key]}"} if KEYS[key] else {}
    listed = routes(client.app)
    assert len(listed) == 14 and sum(admin for *_, admin in listed) == 5  # the review queue is a user route
    for method, path, admin in listed:
        status = client.request(method, path, headers=headers).status_code
        refusal = expected(config, key, admin)
        if refusal is None:
            assert status not in (401, 403), (config, key, method, path, status)
        else:
            assert status in refusal, (config, key, method, path, status)


def test_admin_routes_without_an_admin_key_are_refused_and_say_which_setting():
    with TestClient(app_for("user-key", None)) as client:
        response = client.post("/v1/adapters/sql/rollback", headers={"Authorization": "Bearer user-key"})
        assert response.status_code == 403 and "TUCANO_ADMIN_API_KEY" in response.json()["error"]["message"]
    with TestClient(app_for(None, None, host="0.0.0.0")) as client:  # opened beyond loopback, no keys
        response = client.post("/v1/adapters/sql/rollback")
        assert response.status_code == 403 and "TUCANO_ADMIN_API_KEY" in response.json()["error"]["message"]
        assert client.get("/v1/models").status_code == 200  # user routes stay open: the operator opted in


def test_serve_refuses_a_public_address_without_keys():
    with pytest.raises(OpenBindRefused, match="TUCANO_USER_API_KEY"):
        check_bind(load_settings(host="0.0.0.0"))
    assert check_bind(load_settings(host="0.0.0.0", allow_open_bind=True)) is not None  # allowed, warned about admin routes
    assert check_bind(load_settings(host="0.0.0.0", user_api_key=SecretStr("u"), admin_api_key=SecretStr("a"))) is None
    assert check_bind(load_settings()) is None  # loopback, no keys: the default
    refused = subprocess.run([sys.executable, "-m", "cli", "serve"], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={"TUCANO_HOST": "0.0.0.0", "TUCANO_DATA_DIR": "/nonexistent-tucano", "PATH": "/usr/bin:/bin"})
    assert refused.returncode == 2 and "TUCANO_ALLOW_OPEN_BIND" in refused.stderr


def test_every_json_route_has_a_response_model():
    """Each route's answer is a typed model in the OpenAPI schema, never a bare dict; /metrics is
    Prometheus text, and the HTML pages are out of the schema."""
    app = app_for(None, None)
    untyped = sorted(f"{sorted(r.methods)[0]} {r.path}" for r in app.routes
                     if getattr(r, "include_in_schema", False) and r.path != "/metrics" and getattr(r, "response_model", None) in (None, dict))
    assert untyped == []
    schema = app.openapi()["paths"]
    assert schema["/readyz"]["get"]["responses"]["503"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Readiness"}
