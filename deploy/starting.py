"""The gateway's port while `tucano serve` starts: every request gets a 503 with Retry-After and
the stage the start is at, in the gateway's error shape, instead of a refused connection.

Between `tucano serve` and the gateway's first answer lie the bootstrap's serving steps on a
fresh data dir (the commerce DB, the datasets, the converted model: about 30 s) and the engines
loading their models (20-45 s each). A client, a load balancer or a newcomer's curl probing the
port meanwhile learns that the service is starting and when to ask again. The listener is a
plain `http.server` in a thread of its own: nothing of the gateway (Redis, engines) exists yet.
It lets go of the port just before uvicorn binds it.

Before the port is opened at all, `check_bind` refuses an address beyond loopback with no key:
it runs first, in a second, before `serve` imports the stack.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common.settings import Settings
from server.errors import RETRY_AFTER_S

STARTING_ERROR = "starting"


class OpenBindRefused(RuntimeError):
    """`serve` was asked to listen beyond loopback with no key configured."""


def check_bind(settings: Settings) -> str | None:
    """Refuse a non-loopback address without keys (unless TUCANO_ALLOW_OPEN_BIND says so); a
    warning when admin routes will be unreachable."""
    keys = settings.user_api_key is not None or settings.admin_api_key is not None
    if not settings.loopback_only and not keys and not settings.allow_open_bind:
        raise OpenBindRefused(
            f"refusing to listen on {settings.host} without keys: anyone who reaches it could use the service. Set "
            "TUCANO_USER_API_KEY (and TUCANO_ADMIN_API_KEY for adapter changes), listen on 127.0.0.1 (TUCANO_HOST), "
            "or set TUCANO_ALLOW_OPEN_BIND=true to accept it")
    if settings.admin_api_key is None and (keys or not settings.loopback_only):
        return "admin routes (promote, rollback, canary) are refused: TUCANO_ADMIN_API_KEY is not set"
    return None


class _Handler(BaseHTTPRequestHandler):
    server: _StartingServer

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))  # read what was sent, so the client sees the answer, not a reset
        stage = self.server.stage
        if self.path.split("?")[0] == "/readyz":
            body = {"ready": False, "degraded": True, "starting": stage, "jobs": []}  # the gateway's /readyz keys a client reads
        else:
            body = {"error": {"type": STARTING_ERROR,
                              "message": f"tucano is starting ({stage}); ask again in {RETRY_AFTER_S} s"}}
        data = json.dumps(body).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Retry-After", str(RETRY_AFTER_S))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def log_message(self, format, *args) -> None:
        pass  # a probe every second would flood serve's output


class _StartingServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # uvicorn binds the same port right after, as it does (SO_REUSEADDR)
    stage = "starting"


class StartingResponder:
    """`with StartingResponder(host, port) as starting:` answers 503 on host:port until `close()`
    (or the block's end); `starting.stage = "..."` names what the start is doing. Binding raises
    OSError at once if the port is taken, before anything slow has begun."""

    def __init__(self, host: str, port: int):
        self._server = _StartingServer((host, port), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="starting-responder", daemon=True)
        self._thread.start()

    @property
    def stage(self) -> str:
        return self._server.stage

    @stage.setter
    def stage(self, text: str) -> None:
        self._server.stage = text

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        """Stop answering and free the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()

    def __enter__(self) -> StartingResponder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
