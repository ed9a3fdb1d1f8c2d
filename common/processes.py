"""Process helpers every long-running piece uses, written once: a free loopback port, a child
that dies with its parent, progress bars that lock within the process, the cores it may use, a stop that asks first (SIGTERM) and insists later (SIGKILL),
whether this machine has an NVIDIA GPU, and whether its CPU computes bf16 natively.
"""
from __future__ import annotations

import ctypes
import functools
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading

from tqdm import tqdm

PR_SET_PDEATHSIG = 1


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """For `preexec_fn`: the kernel sends this child SIGTERM when its parent dies, even by
    SIGKILL, so no engine or Redis server outlives the process that owns it."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def bars_lock_within_the_process() -> None:
    """tqdm's bars (bm25s wraps its indexing in one even when hidden) lock with a thread lock
    instead of tqdm's default, a multiprocessing lock. In a process started by spawn, as uvicorn
    starts the gateway's workers, that lock is a named semaphore registered with the resource
    tracker; a worker ends by the SIGTERM uvicorn re-raises, so no exit handler unlinks it and the
    tracker printed "leaked semaphore" at every stop of `serve`. No bar here is shared with
    another process."""
    tqdm.set_lock(threading.RLock())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; always reaped."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (2^30 bytes)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def return_freed_memory() -> None:
    """Hand the free pages of glibc's heap back to the system (`malloc_trim(0)`). Training steps
    allocate and free activations of a different size each step; glibc keeps the freed pages in
    its heap, so a process's resident set grows step after step though it holds no more tensors.
    A no-op where the C library has no `malloc_trim`."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0))


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible to processes started here (engines pick cuda then)."""
    return shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_computes_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has bf16 arithmetic (AVX512-BF16 or AMX): there a bf16 matrix product runs at
    about twice the fp32 rate (measured here, on AVX512-BF16); elsewhere bf16 is emulated and slower."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def bf16_on_cpu(precision: str) -> bool:
    """Whether work on this CPU computes in bf16, as a precision setting (`train_cpu_precision`,
    `engine_cpu_precision`) says: `bf16`, or `auto` where the CPU computes bf16 natively."""
    return precision == "bf16" or (precision == "auto" and cpu_computes_bf16())
