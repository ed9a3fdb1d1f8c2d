"""The gateway's port while serve starts: 503 with Retry-After and the stage, then the port is free."""
import json
import socket

import httpx
import pytest

from deploy.starting import StartingResponder
from server.errors import RETRY_AFTER_S


def test_every_request_gets_503_with_retry_after_and_the_stage():
    with StartingResponder("127.0.0.1", 0) as starting:
        starting.stage = "the engines are loading their models"
        base = f"http://127.0.0.1:{starting.port}"
        chat = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]}, timeout=5)
        assert chat.status_code == 503
        assert chat.headers["Retry-After"] == str(RETRY_AFTER_S)
        assert chat.json()["error"]["type"] == "starting"
        assert "the engines are loading their models" in chat.json()["error"]["message"]
        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 503
        assert ready.json() == {"ready": False, "degraded": True, "starting": "the engines are loading their models", "jobs": []}
        assert httpx.head(f"{base}/v1/tasks", timeout=5).status_code == 503
        assert httpx.delete(f"{base}/v1/adapters/x", timeout=5).status_code == 503


def test_close_frees_the_port_for_the_gateway():
    starting = StartingResponder("127.0.0.1", 0)
    port = starting.port
    starting.close()
    starting.close()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    with socket.socket() as gateway:
        gateway.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        gateway.bind(("127.0.0.1", port))


def test_a_taken_port_fails_at_once():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(OSError):
            StartingResponder("127.0.0.1", other.getsockname()[1])


def test_the_body_is_json_in_the_gateways_error_shape():
    with StartingResponder("127.0.0.1", 0) as starting:
        raw = httpx.get(f"http://127.0.0.1:{starting.port}/v1/stats", timeout=5)
        assert raw.headers["content-type"] == "application/json"
        assert set(json.loads(raw.content)) == {"error"}
