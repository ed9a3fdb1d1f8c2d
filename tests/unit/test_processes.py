"""`die_with_parent`: a child started with it (an engine, the embedded Valkey, a gateway worker, a
training round) is sent SIGTERM when the process that started it dies, even by SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from common.processes import pid_alive


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for a parent (init, here) to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

PARENT = """
import subprocess, sys, time
from common.processes import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_started_with_die_with_parent_goes_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    child = int(parent.stdout.readline())
    assert pid_alive(child) and running(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)


BAR_THEN_EXIT = """
import multiprocessing, os, sys
from tqdm import tqdm
multiprocessing.set_start_method("spawn")  # as in a gateway worker, which uvicorn starts by spawn
{setup}
list(tqdm(range(3), disable=True))  # as bm25s's hidden bar does
sys.stderr.flush()
os._exit(0)  # a worker ends by a re-raised SIGTERM: no exit handler unlinks a semaphore
"""


def test_bars_lock_within_the_process_so_an_exit_without_handlers_leaks_no_semaphore():
    def stderr_of(setup: str) -> str:
        return subprocess.run([sys.executable, "-c", BAR_THEN_EXIT.format(setup=setup)], capture_output=True, text=True,
                              timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))).stderr

    assert "leaked semaphore" in stderr_of("")  # tqdm's default lock: the noise serve's stop printed
    assert stderr_of("from common.processes import bars_lock_within_the_process; bars_lock_within_the_process()") == ""
