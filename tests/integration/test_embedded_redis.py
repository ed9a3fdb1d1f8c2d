"""The embedded Valkey keeps what was written before a clean stop and before a SIGKILL of the
process that started it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import redis

from deploy.embedded_redis import EmbeddedRedis
from tests.conftest import REPO


def test_data_survives_clean_stop(tmp_path):
    with EmbeddedRedis(tmp_path) as url:
        client = redis.Redis.from_url(url)
        client.xadd("records", {"task": "sql", "n": "1"})
        client.set("route:sql", "sql-v1")
        assert client.config_get("appendonly")["appendonly"] == "yes"
    assert not (tmp_path / "server.json").exists()
    with EmbeddedRedis(tmp_path) as url:
        client = redis.Redis.from_url(url)
        assert client.get("route:sql") == b"sql-v1"
        assert client.xlen("records") == 1


def _start_owner(tmp_path, keys: int) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time, redis
        from deploy.embedded_redis import EmbeddedRedis
        server = EmbeddedRedis({str(tmp_path)!r})
        url = server.start()
        client = redis.Redis.from_url(url)
        for i in range({keys}):
            client.xadd("records", {{"i": str(i)}})
        print(server.process.pid, flush=True)
        time.sleep(600)
    """)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_data_survives_sigkill_of_the_parent(tmp_path):
    owner = _start_owner(tmp_path, keys=500)
    server_pid = int(owner.stdout.readline())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    # The kernel tells the orphaned server to shut down (PDEATHSIG), so no stray server is left.
    assert _wait_gone(server_pid), "embedded server outlived its killed parent"
    with EmbeddedRedis(tmp_path) as url:
        assert redis.Redis.from_url(url).xlen("records") == 500


def test_second_user_of_the_data_dir_shares_the_running_server(tmp_path):
    with EmbeddedRedis(tmp_path) as url:
        joined = EmbeddedRedis(tmp_path)
        assert joined.start() == url
        assert joined.process is None  # not its server: its stop leaves it running
        joined.stop()
        assert redis.Redis.from_url(url).ping()


def test_sigterm_of_the_cli_stops_its_server_cleanly(tmp_path):
    code = textwrap.dedent(f"""
        import redis, signal, sys, time
        from deploy.embedded_redis import EmbeddedRedis
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with EmbeddedRedis({str(tmp_path)!r}) as url:
            redis.Redis.from_url(url).set("k", "v")
            print("ready", flush=True)
            time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().strip() == "ready"
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=20) == 143
    assert not (tmp_path / "server.json").exists()
    with EmbeddedRedis(tmp_path) as url:
        assert redis.Redis.from_url(url).get("k") == b"v"


def test_one_store_writes_records_from_one_event_loop_after_another(tmp_path):
    """An asyncio Redis client belongs to the loop that made it; the store keeps one per loop, so
    a second loop (a restarted gateway in the same process, a test) writes records too."""
    import asyncio

    from common.store import RECORDS, Store
    from tests.unit.test_shapes_and_routing import make_record

    with EmbeddedRedis(tmp_path / "redis") as url:
        store = Store(url)
        for n in range(2):
            entry_id = asyncio.run(store.add_record(make_record(id=f"record-{n}")))
            stored = store.get_record(f"record-{n}")
            assert stored.entry_id == entry_id and stored.record == make_record(id=f"record-{n}")
        assert store.redis.xlen(RECORDS) == 2


def test_the_examples_state_moves_with_feedback_and_the_pretrained_flag_in_one_read(tmp_path):
    import asyncio

    from common.store import Store
    from tests.unit.test_shapes_and_routing import make_record

    with EmbeddedRedis(tmp_path / "redis") as url:
        store = Store(url)
        record = make_record(id="record-0")
        asyncio.run(store.add_record(record))
        assert store.examples_state(record.task) == (0, False)
        store.add_feedback("record-0", 1)
        store.set_serving_pretrained(True)
        assert store.examples_state(record.task) == (1, True)
        assert store.examples_state("push" if record.task != "push" else "sql") == (0, True)  # another task's labels did not move
        store.set_serving_pretrained(False)
        assert store.examples_state(record.task) == (1, False)
