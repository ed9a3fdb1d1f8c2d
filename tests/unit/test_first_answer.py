"""The first `tucano serve` does not wait for the demo model's fine-tuning: the engines serve the
pretrained weights while the bootstrap finishes as its own process, then each engine is restarted
on the fine-tuned weights, and only then may training rounds start."""
from __future__ import annotations

import sys
import threading

import pytest

from common.settings import load_settings
from deploy import serve
from deploy.vllm_server import Supervisor


class Engine:
    """What the supervisor asks of a vLLM server, with each call written down."""

    def __init__(self, name: str, comes_up: bool = True):
        self.name, self.comes_up, self.calls, self.restarts = name, comes_up, [], 0

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        self.calls.append("stop")

    def start(self) -> None:
        self.calls.append("start")

    def wait_ready(self) -> None:
        self.calls.append("ready")
        if not self.comes_up:
            raise RuntimeError(f"vLLM {self.name} not ready")


class PretrainedFlag:
    """The store's word on whether the pretrained weights serve (prompts show the bootstrap rows)."""

    def __init__(self):
        self.pretrained = True

    def set_serving_pretrained(self, pretrained: bool) -> None:
        self.pretrained = pretrained


def finish(tmp_path, code: int, engines: list[Engine]) -> tuple[threading.Event, list[str], list[str], PretrainedFlag]:
    restarted, said, trainable, flag = [], [], threading.Event(), PretrainedFlag()
    supervisor = Supervisor(engines, on_restart=lambda server: restarted.append(server.name))
    settings = load_settings(data_dir=tmp_path)
    serve._finish_bootstrap(settings, flag, "redis://127.0.0.1:9/0", engines, supervisor, trainable, said.append,
                            command=[sys.executable, "-c", f"raise SystemExit({code})"])
    return trainable, restarted, said, flag


def test_a_finished_fine_tuning_restarts_every_engine_then_lets_rounds_train(tmp_path):
    engines = [Engine("base"), Engine("think")]
    trainable, restarted, said, flag = finish(tmp_path, 0, engines)
    assert restarted == ["base", "think"] and all(e.calls == ["stop", "start", "ready"] for e in engines)
    assert trainable.is_set() and said[-1] == "the fine-tuned demo model serves now; training rounds may start"
    assert not flag.pretrained  # the bootstrap rows leave the prompts
    assert (tmp_path / "logs" / "bootstrap.log").exists()


def test_a_failed_fine_tuning_keeps_the_pretrained_model_serving_and_rounds_waiting(tmp_path):
    engines = [Engine("base"), Engine("think")]
    trainable, restarted, said, flag = finish(tmp_path, 3, engines)
    assert restarted == [] and all(e.calls == [] for e in engines) and not trainable.is_set() and flag.pretrained
    assert "fine-tuning failed (exit code 3" in said[-1] and "the pretrained model keeps serving" in said[-1]
    waited: list[str] = []
    serve._run_round_process(load_settings(data_dir=tmp_path), "redis://127.0.0.1:9/0", waited.append, trainable)
    assert waited == ["the training round waits: the demo model's fine-tuning is still running"]


def test_an_engine_that_does_not_come_back_is_said_and_rounds_keep_waiting(tmp_path):
    engines = [Engine("base", comes_up=False), Engine("think")]
    trainable, restarted, said, flag = finish(tmp_path, 0, engines)
    assert not trainable.is_set() and engines[1].calls == [] and restarted == [] and flag.pretrained
    assert said[-1] == "[red]vLLM base did not come back on the fine-tuned weights: vLLM base not ready[/red]"


def test_serve_builds_only_what_serving_needs_before_it_starts(tmp_path, monkeypatch):
    """`tucano serve` on a data dir without the fine-tuned demo model: a pretrained demo model is
    served from its early copies with the fine-tuning left to run beside it; the tiny models, or
    engines it does not start, get the whole bootstrap first; a finished one, nothing."""
    import signal as signals
    import socket

    import httpx
    from typer.testing import CliRunner

    from cli import main as cli
    from cli import serve as serve_command

    calls: list[tuple] = []
    built = {"built": False, "serveable": False}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def port_answers() -> tuple[int, str]:  # what a client probing the gateway's port gets meanwhile
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        return answer.status_code, answer.headers.get("Retry-After", "")

    monkeypatch.setattr("demo.bootstrap.is_built", lambda settings: built["built"])
    monkeypatch.setattr("demo.bootstrap.is_serveable", lambda settings: built["serveable"])
    monkeypatch.setattr(serve_command, "run_bootstrap", lambda settings, force=False, serveable_only=False:
                        calls.append(("bootstrap", serveable_only)) or calls.append(port_answers()))
    monkeypatch.setattr("deploy.serve.serve", lambda settings, say, finish_bootstrap, starting:
                        calls.append(("serve", finish_bootstrap)) or calls.append(port_answers()))
    monkeypatch.setattr(signals, "signal", lambda *args: None)  # the CLI's SIGTERM handler would outlive the test
    runner = CliRunner()

    def serve(**env) -> list[tuple]:
        calls.clear()
        # the integration tier's conftest sets TUCANO_BOOTSTRAP_MODEL=tiny for the whole session
        result = runner.invoke(cli.app, ["serve"], env={"TUCANO_DATA_DIR": str(tmp_path), "TUCANO_BOOTSTRAP_MODEL": "smollm2",
                                                        "TUCANO_HOST": "127.0.0.1", "TUCANO_PORT": str(port), **env})
        assert result.exit_code == 0, result.output
        return list(calls)

    starting = (503, "5")  # the port answers 503 with Retry-After while serve starts
    assert serve() == [("bootstrap", True), starting, ("serve", True), starting]  # fresh: what serving needs, then the rest beside it
    built["serveable"] = True
    assert serve() == [("serve", True), starting]  # a serve stopped during the fine-tuning: the early models serve again
    assert serve(TUCANO_BOOTSTRAP_MODEL="tiny") == [("bootstrap", False), starting, ("serve", False), starting]
    assert serve(TUCANO_BASE_ENGINE_URLS='["http://127.0.0.1:9"]') == [("bootstrap", False), starting, ("serve", False), starting]
    built["built"] = True
    assert serve() == [("serve", False), starting]
    with pytest.raises(httpx.ConnectError):  # and lets go of the port when serve returns
        port_answers()


def test_serve_on_a_taken_port_says_so_before_building_anything(tmp_path, monkeypatch):
    import socket

    from typer.testing import CliRunner

    from cli import main as cli
    from cli import serve as serve_command

    monkeypatch.setattr(serve_command, "run_bootstrap", lambda *args, **kwargs: pytest.fail("built before checking the port"))
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        result = CliRunner().invoke(cli.app, ["serve"], env={"TUCANO_DATA_DIR": str(tmp_path), "TUCANO_HOST": "127.0.0.1",
                                                             "TUCANO_PORT": str(other.getsockname()[1])})
    assert result.exit_code == 2
    assert "cannot listen on 127.0.0.1" in result.output and "TUCANO_PORT" in result.output


def test_an_asked_restart_runs_in_the_supervisors_own_thread(tmp_path):
    """An engine dies with the thread that started it (the parent-death signal is per thread): a
    restart asked for by the short-lived fine-tuning thread must start it in the supervisor's."""
    started_in: list[str] = []

    class Tracked(Engine):
        def start(self) -> None:
            started_in.append(threading.current_thread().name)

    engine = Tracked("base")
    supervisor = Supervisor([engine], every_s=0.05).start()
    try:
        asker = threading.Thread(target=supervisor.restart, args=(engine,), name="bootstrap")
        asker.start()
        asker.join(timeout=10)
        assert not asker.is_alive() and started_in == ["engine-supervisor"]
    finally:
        supervisor.stop()


def test_a_restart_that_fails_in_the_supervisors_thread_raises_in_the_callers():
    supervisor = Supervisor([], every_s=0.05).start()
    try:
        with pytest.raises(RuntimeError, match="vLLM base not ready"):
            supervisor.restart(Engine("base", comes_up=False))
    finally:
        supervisor.stop()


def test_freed_heap_pages_go_back_to_the_system():
    """Training steps free activations of varying sizes in the middle of the heap; glibc keeps
    those pages resident until `malloc_trim` hands them back."""
    from common.processes import return_freed_memory

    def resident_bytes() -> int:
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 256 MB in 64 KB blocks: below the mmap threshold, from the heap
    for block in blocks:
        block[::4096] = b"\x01" * len(block[::4096])  # touched, so resident
    kept = blocks[::64]  # one block in 64 stays: the heap cannot simply shrink from its top
    del blocks
    before = resident_bytes()
    return_freed_memory()
    assert resident_bytes() < before - 150 * 2**20, (before, resident_bytes())
    assert len(kept) == 63


def test_bench_early_names_what_is_missing_without_the_pretrained_weights(tmp_path):
    from bench import early

    with pytest.raises(FileNotFoundError, match=r"no pretrained demo model at .*pretrained-smollm2: run `tucano bootstrap`"):
        early.run(load_settings(data_dir=tmp_path, bootstrap_model="smollm2"), 8)
    assert not list(tmp_path.glob("bench-early-*"))  # nothing left behind
