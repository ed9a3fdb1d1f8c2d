"""The budget follows the machine: a method's training runs past its time budget only while every
engine of its model reports no request running or waiting (vLLM's /metrics gauges, read from a
real HTTP server here), a look every few seconds, and never past its ceiling."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from trainer.idle import engines_idle, requests_in_engine

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="base"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="base"}} {waiting}
vllm:num_requests_waiting_by_reason{{engine="0",reason="capacity"}} 7.0
"""


@pytest.fixture
def engine():
    state = {"running": 0.0, "waiting": 0.0, "status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = PAGE.format(**state).encode() if state["status"] == 200 else b"down"
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_the_gauges_are_read_and_anything_unreadable_is_busy(engine):
    url, state = engine
    assert requests_in_engine(PAGE.format(running=1.0, waiting=2.0)) == 3.0  # not the by-reason breakdown
    assert engines_idle([url])
    state["waiting"] = 1.0
    assert not engines_idle([url])
    state["waiting"], state["status"] = 0.0, 503
    assert not engines_idle([url])
    assert not engines_idle([]) and not engines_idle(["http://127.0.0.1:9"])


@pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: trainer.methods imports the training libraries
def test_training_runs_past_its_budget_only_while_serving_is_idle_and_never_past_the_ceiling(monkeypatch):
    from trainer import methods

    clock = {"now": 100.0}
    monkeypatch.setattr(methods.time, "monotonic", lambda: clock["now"])
    idle = {"now": True}
    budget = methods.TimeBudget(methods.Budget(45.0, lambda: idle["now"], 90.0))
    control = SimpleNamespace(should_training_stop=False)

    def step(at: float) -> bool:
        clock["now"] = 100.0 + at
        budget.on_step_end(None, None, control)
        return control.should_training_stop

    assert not step(30) and not step(46) and budget.extended_s == 46 + methods.IDLE_LOOK_S - 45  # idle at 46 s: on to 56
    assert not step(60) and not step(80)  # still idle: looks again at 70, then 90, the ceiling
    assert step(90) and budget.hit and budget.extended_s == 45.0
    clock["now"] = 100.0
    busy = methods.TimeBudget(methods.Budget(45.0, lambda: False, 90.0))
    clock["now"] = 100.0 + 46
    control.should_training_stop = False
    busy.on_step_end(None, None, control)
    assert control.should_training_stop and busy.extended_s == 0.0
    plain = methods.TimeBudget(20.0)  # a number alone: the budget as before
    assert plain.ceiling == plain.deadline
