"""GRPO's rollouts on a vLLM engine where traffic is thin, against a real HTTP server that speaks
vLLM's runtime LoRA and completions API: the policy is loaded under a fresh name every few steps
(never one used before), the name before is unloaded, each batch's groups are sampled there in
one request (every prompt of the batch, `n` each), and an engine that fails or returns part of a
group stops the run."""
from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.records import Sampling
from tests.unit.test_engine_client import send
from tests.unit.test_grpo_served_groups import EOS, GOOD, counting_reward, policy, tokenizer
from trainer.data import GrpoPrompt
from trainer.rollouts import EngineRollouts, RolloutFailed

SAMPLING = Sampling(0.7, 1.0, 8, n=4)


class FakeEngine:
    """Loads and unloads names, and samples `n` completions (half with GOOD tokens) per prompt of
    a request, numbered prompt by prompt as vLLM numbers them (`index` = prompt * n + sample)."""

    def __init__(self):
        self.loaded: list[str] = []
        self.unloaded: list[str] = []
        self.asked: list[dict] = []
        self.short = 0
        self.fail = False
        self.users = None  # with gauges on /metrics: the team's requests in the engine, a function of the time since it started
        self.holds: list[float] = []  # seconds each next sampling request decodes before it answers
        self.in_flight = 0  # the requests (n per prompt) of the sampling request decoding now
        self.cancelled = 0
        self.started = self.hold_started = time.monotonic()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status, body):
                send(self, json.dumps(body).encode(), status=status)

            def do_GET(self):
                if self.path != "/metrics" or engine.users is None:
                    return self._send(404, "no gauges")
                running = engine.in_flight + engine.users(time.monotonic() - engine.started)
                send(self, f'vllm:num_requests_running{{model_name="m"}} {running}\nvllm:num_requests_waiting{{model_name="m"}} 0\n'.encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/load_lora_adapter":
                    assert Path(body["lora_path"], "adapter_config.json").is_file()  # the policy was saved there first
                    engine.loaded.append(body["lora_name"])
                    return self._send(200, "ok")
                if self.path == "/v1/unload_lora_adapter":
                    engine.unloaded.append(body["lora_name"])
                    return self._send(200, "ok")
                if engine.fail:
                    return self._send(500, {"error": {"message": "engine core died"}})
                engine.asked.append(body)
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                if engine.holds:
                    engine.in_flight, engine.hold_started = len(prompts) * body["n"], time.monotonic()
                    try:  # decodes until its time is up, or aborts once its client has gone, as vLLM does
                        until = time.monotonic() + engine.holds.pop(0)
                        while time.monotonic() < until:
                            readable, _, _ = select.select([self.connection], [], [], 0.02)
                            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                                engine.cancelled += 1
                                return
                        return self._send(200, {"choices": []})
                    finally:
                        engine.in_flight = 0
                choices = [{"index": p * body["n"] + i, "text": "", "prompt_token_ids": [3, 4, 5, 6 + p],
                            "token_ids": [GOOD, GOOD, 9, EOS] if i % 2 == 0 else [10, 11, 12, EOS],
                            "logprobs": {"token_logprobs": [-1.0, -1.0, -1.0, -1.0]}}
                           for p in range(len(prompts)) for i in range(body["n"] - (engine.short if p == 0 else 0))]
                self._send(200, {"choices": choices[::-1]})  # in any order: `index` says whose it is

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def engine():
    made = FakeEngine()
    yield made
    made.server.shutdown()


pytestmark = pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: torch and TRL are imported in the tests


def test_the_policy_is_reloaded_under_fresh_names_and_the_one_before_unloaded(engine, tmp_path):
    step = {"now": 0}
    rollouts = EngineRollouts(engine.url, policy(), "sql-rollout-r1", SAMPLING, {"type": "object"}, reload_every=2, seed=5,
                              directory=tmp_path, step=lambda: step["now"])
    for now in range(5):
        step["now"] = now
        rollouts.sync_weights()
    assert engine.loaded == ["sql-rollout-r1-1", "sql-rollout-r1-2", "sql-rollout-r1-3"]  # at steps 0, 2 and 4
    assert engine.unloaded == ["sql-rollout-r1-1", "sql-rollout-r1-2"] and len(set(rollouts.names)) == 3
    out = rollouts.generate(["p"] * 4 + ["q"] * 4, 4)
    assert [b["model"] for b in engine.asked] == ["sql-rollout-r1-3"] and engine.asked[0]["prompt"] == ["p", "q"]
    assert all(b["n"] == 4 and b["logprobs"] == 0 and b["return_token_ids"] and b["structured_outputs"] == {"json": {"type": "object"}}
               for b in engine.asked)
    assert len(out["completion_ids"]) == 8 and out["logprobs"][0] == [-1.0] * 4
    assert out["prompt_ids"] == [[3, 4, 5, 6]] * 4 + [[3, 4, 5, 7]] * 4  # each group's samples under its own prompt, in order
    assert out["completion_ids"][:4] == [[GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]] * 2
    rollouts.close()
    assert engine.unloaded[-1] == "sql-rollout-r1-3" and not (tmp_path / ".sql-rollout-r1").exists()


def test_an_engine_that_fails_or_returns_part_of_a_group_stops_the_run(engine, tmp_path):
    rollouts = EngineRollouts(engine.url, policy(), "push-rollout-r2", SAMPLING, None, reload_every=4, seed=1, directory=tmp_path)
    engine.short = 1
    with pytest.raises(RolloutFailed, match="3 whole completions of the 4 asked"):
        rollouts.generate(["p"] * 4 + ["q"] * 4, 4)  # the first prompt's group is short, the second's whole
    engine.short, engine.fail = 0, True
    with pytest.raises(RolloutFailed, match="HTTP 500"):
        rollouts.generate(["p"] * 4, 4)
    rollouts.close()
    gone = EngineRollouts("http://127.0.0.1:9", policy(), "push-rollout-r3", SAMPLING, None, reload_every=4, seed=1, directory=tmp_path)
    with pytest.raises(RolloutFailed, match="failed: ConnectError"):
        gone.generate(["p"] * 4, 4)
    gone.close()


def test_grpo_on_the_engine_trains_from_its_groups_and_reports_it(engine, tmp_path, monkeypatch):
    from common.settings import load_settings
    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    model = policy()
    monkeypatch.setattr(model, "generate", lambda *a, **k: pytest.fail("the trainer generated"))
    settings = load_settings(data_dir=tmp_path, grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=2, grpo_max_epochs=2,
                             train_cpu_precision="fp32", grpo_reload_every=3, grpo_num_generations=6)
    prompts = [GrpoPrompt(f"t3 t4 t{i}", "sql", f"r{i}") for i in range(4)]
    outcome = grpo.train_on_engine(settings, model, tokenizer(), "sql", prompts, engine.url, "sql-rollout-r4", 600.0, "test")
    report = outcome.grpo
    assert outcome.steps == 8  # 4 prompts x 2 epochs, 2 a batch, each batch optimised twice
    assert report.rollouts.startswith(grpo.ENGINE) and report.generation_tokens_per_s > 0
    # generation batches start at steps 0, 2, 4 and 6; with a reload every 3 steps, at 0 and 4
    assert len(engine.asked) == 4 and engine.loaded == ["sql-rollout-r4-1", "sql-rollout-r4-2"]  # one request a batch
    assert [b["model"] for b in engine.asked] == ["sql-rollout-r4-1"] * 2 + ["sql-rollout-r4-2"] * 2
    assert {b["n"] for b in engine.asked} == {6} == {report.group_size}  # the group size set, not the default 4
    assert engine.unloaded == engine.loaded  # each replaced one, and the last at the end
    assert report.groups == 8 and report.groups_dropped == 0 and report.kl_to_parent is not None and report.kl_to_parent > 0
    assert outcome.seconds_by_phase["reloads"] == 2
    assert outcome.seconds_by_phase["rollouts_unwatched"] >= 1 and outcome.seconds_by_phase["rollouts_yielded_to_serving"] == 0  # the fake engine has no gauges


def short_group(key: str, samples: int, temperature: float = 0.7):
    from trainer.data import RolloutGroup

    return RolloutGroup(key=key, source=key, version="base", temperature=temperature, prompt_token_ids=[3, 4, 5, len(key)],
                        completion_ids=[[GOOD, EOS]] * samples, logprobs=[[-0.5, -0.5]] * samples, reference="", context="{}")


def test_served_groups_smaller_than_the_group_size_are_completed_on_the_engine_after_their_served_samples(engine, tmp_path):
    rollouts = EngineRollouts(engine.url, policy(), "extraction-complete-r5", SAMPLING, {"type": "object"}, reload_every=4, seed=3,
                              directory=tmp_path)
    groups = [short_group("a", 2), short_group("bb", 2), short_group("ccc", 4), short_group("dddd", 2, temperature=1.0)]
    completed, added = rollouts.complete(groups, 4)
    assert added == 6 and [g.size for g in completed] == [4, 4, 4, 4] and [g.key for g in completed] == ["a", "bb", "ccc", "dddd"]
    assert completed[2] is groups[2]  # already whole: as served
    assert completed[0].completion_ids[:2] == [[GOOD, EOS]] * 2 and completed[0].logprobs[:2] == [[-0.5, -0.5]] * 2  # served first
    assert completed[0].completion_ids[2:] == [[GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]] and completed[0].logprobs[3] == [-1.0] * 4
    assert completed[0].prompt_token_ids == [3, 4, 5, 1] and completed[0].version == "base"  # its prompt and version kept
    # one request per temperature: each group's prompt as the token ids it was served with, the samples it lacks each
    assert [(b["prompt"], b["n"], b["temperature"]) for b in engine.asked] == [([[3, 4, 5, 1], [3, 4, 5, 2]], 2, 0.7),
                                                                              ([[3, 4, 5, 4]], 2, 1.0)]
    assert all(b["model"] == "extraction-complete-r5-1" and b["logprobs"] == 0 and b["return_token_ids"]
               and b["structured_outputs"] == {"json": {"type": "object"}} for b in engine.asked)
    assert rollouts.tokens == 6 * 4 and rollouts.seconds > 0
    engine.short = 1
    with pytest.raises(RolloutFailed, match="1 whole completions of the 2 asked"):  # never a group trained as if whole
        rollouts.complete([short_group("a", 2)], 4)
    rollouts.close()
    assert engine.unloaded == ["extraction-complete-r5-1"]


def test_grpo_on_served_groups_completes_smaller_ones_on_an_engine_and_says_so(engine, tmp_path, monkeypatch):
    from common.settings import load_settings
    from tests.unit.test_grpo_served_groups import served_group
    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    settings = load_settings(data_dir=tmp_path, grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=1,
                             train_cpu_precision="fp32", grpo_num_generations=4)
    good, bad = [GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]
    runs = {}
    for engine_url in (engine.url, None):
        model = policy()
        monkeypatch.setattr(model, "generate", lambda *a, **k: pytest.fail("the trainer generated"))
        groups = [served_group(model, f"g{i}", [good, bad]) for i in range(4)]
        runs[engine_url] = grpo.train_on_groups(settings, model, tokenizer(), "push", groups, 600.0, "test", policy="base",
                                                engine_url=engine_url, name_prefix="push-complete-r6")
    completed, as_served = runs[engine.url], runs[None]
    assert completed.grpo.group_size == 4 and as_served.grpo.group_size == 2
    assert completed.grpo.rollouts.startswith(grpo.SERVED_GROUPS) and grpo.ENGINE in completed.grpo.rollouts
    assert as_served.grpo.rollouts == grpo.SERVED_GROUPS and as_served.grpo.generation_tokens_per_s is None
    assert completed.seconds_by_phase["samples_completed_on_engine"] == 8 and completed.grpo.generation_tokens_per_s > 0
    assert "samples_completed_on_engine" not in as_served.seconds_by_phase
    assert "groups of 2 completed to 4 on the engine" in completed.why and "trained as served (no engine" in as_served.why
    assert completed.steps == as_served.steps == 2 and completed.grpo.groups == 4
    assert [b["n"] for b in engine.asked] == [2] and engine.loaded == engine.unloaded == ["push-complete-r6-1"]


def test_a_rounds_grpo_takes_served_groups_then_an_engine_then_the_trainers_generate(monkeypatch):
    from common.settings import load_settings
    from trainer import candidate, grpo
    from trainer.data import RolloutGroup, TaskData

    used = []
    monkeypatch.setattr(grpo, "train_on_groups", lambda *a, **k: used.append("served groups"))
    monkeypatch.setattr(grpo, "train_on_engine", lambda *a, **k: used.append(f"engine {a[5]}"))
    monkeypatch.setattr(grpo, "train", lambda *a, **k: used.append("generate"))
    group = RolloutGroup(key="g", source="r", version="base", temperature=0.7, prompt_token_ids=[1], completion_ids=[[2], [3]],
                         logprobs=[[-1.0], [-1.0]], reference="", context="{}")
    settings = load_settings(grpo_min_groups=3)
    prompts = [GrpoPrompt("p", "sql", "r0")]
    plan = [("grpo", "test")]
    for groups, engines, expected in (([group] * 3, ("http://e1", "http://e2"), "served groups"),
                                      ([group] * 2, ("http://e1", "http://e2"), "engine http://e1"),
                                      ([group] * 2, (), "served groups"), ([], (), "generate")):
        used.clear()
        candidate.run_plan(settings, None, None, TaskData("sql", prompts=prompts, groups=groups), plan, None, engines)
        assert used == [expected], (len(groups), engines)


def train_sql_task(monkeypatch, train_candidate):
    """`_train_task` on SQL's 40 unlabelled records, its trainer replaced by `train_candidate`, with
    a stub chat template, no held-out inputs and a fleet of one engine: call it with the settings
    and the store."""
    from tests.unit.test_round_data import render
    from trainer import round as round_module

    class Template:
        pass
    Template.render = staticmethod(render)

    class Fleet:
        def urls(self, kind):
            return ["http://e1"]

    monkeypatch.setattr(round_module.ChatTemplate, "load", staticmethod(lambda path: Template()))
    monkeypatch.setattr(round_module, "train_candidate", train_candidate)
    monkeypatch.setattr(round_module.gate, "held_out_inputs", lambda *a: frozenset())
    records = [(f"{i}-0", make(i)) for i in range(40)]
    return lambda settings, store: round_module._train_task(settings, store, Fleet(), "sql", records, "r1", print, lambda *a: None)


def test_a_round_whose_engine_fails_while_grpo_samples_fails_the_task_and_registers_nothing(monkeypatch):
    from common.rounds import Outcome
    from common.settings import load_settings
    from tests.unit.test_round_data import NoLabels

    def failing(*args, **kwargs):
        raise RolloutFailed("the engine at http://e1 returned 3 whole completions of the 4 asked")

    entry = train_sql_task(monkeypatch, failing)(load_settings(), NoLabels())
    assert entry.outcome == Outcome.FAILED and "3 whole completions of the 4 asked" in entry.reason and entry.version is None


def test_a_grpo_round_trains_from_the_rejected_candidate_that_methods_continued_chose(monkeypatch, tmp_path):
    """The round hands the rejected candidate to the trainer as the LoRA to continue, and says so in its entry."""
    from common.records import AdapterMeta, Route
    from common.settings import load_settings
    from tasks import model_path_of
    from tests.unit.test_round_data import NoLabels, rejected_candidate

    settings = load_settings()
    model = model_path_of(settings, "sql")
    active = AdapterMeta(version="sql-v1", task="sql", path=str(tmp_path), status="active", base_model=model, created=1.0)
    rejected = rejected_candidate("sql-v2", "sql-v1", tmp_path, incumbent="sql-v1", created=2.0)
    rejected.base_model, rejected.task = model, "sql"

    class Store(NoLabels):
        def route(self, task):
            return Route(active="sql-v1")

        def adapter(self, version):
            return {"sql-v1": active, "sql-v2": rejected}[version]

        def adapters(self, *tasks):
            return [active, rejected]

    parents = []

    def capture(settings, store, data, steps, round_id, parent, *args):
        parents.append(parent)
        raise RolloutFailed("stop after the start is chosen")

    train = train_sql_task(monkeypatch, capture)
    entry = train(settings, Store())
    assert parents == [rejected] and entry.start.weights == "sql-v2" and "continues sql-v2" in entry.start.why
    parents.clear()
    entry = train(settings.model_copy(update={"grpo_continue_rejected": 0}), Store())
    assert parents == [active] and entry.start.weights == "active"


def make(i: int):
    from tests.unit.test_shapes_and_routing import make_record

    return make_record(id=f"r{i}", input={"question": f"Quantos pedidos no lote {i}?"})


@pytest.fixture
def quick(monkeypatch):
    """Serving-first waits shortened, so a test takes a fraction of a second."""
    from trainer import rollouts
    monkeypatch.setattr(rollouts, "SERVING_POLL_S", 0.02)
    monkeypatch.setattr(rollouts, "SERVING_QUIET_S", 0.1)


def test_a_rollout_waits_until_serving_has_left_the_engine_quiet(engine, tmp_path, quick):
    engine.users = lambda t: 1 if t < 0.3 else 0  # a team's request decoding for 0.3 s
    rollouts = EngineRollouts(engine.url, policy(), "sql-rollout-r4", SAMPLING, None, reload_every=4, seed=1, directory=tmp_path)
    engine.started = time.monotonic()
    out = rollouts.generate(["p"] * 4 + ["q"] * 4, 4)
    assert len(out["completion_ids"]) == 8 and len(engine.asked) == 1
    assert rollouts.yield_seconds >= 0.3 + 0.1 and rollouts.yielded == 0 and rollouts.unwatched == 0
    rollouts.close()


def test_a_rollout_is_cancelled_when_a_users_request_reaches_the_engine_and_sent_again_once_it_is_quiet(engine, tmp_path, quick):
    """Its own eight requests (two prompts, n=4) are in the gauges; a ninth is someone else's."""
    arrived = []

    def users(_t):  # a user's request reaches the engine 0.2 s into the rollout, and is answered 0.3 s later
        since = time.monotonic() - engine.hold_started
        if engine.in_flight and since > 0.2 and not arrived:
            arrived.append(time.monotonic())
        return 1 if arrived and time.monotonic() - arrived[0] < 0.3 else 0
    engine.users = users
    engine.holds = [5.0]  # the first sampling request would decode for 5 s
    rollouts = EngineRollouts(engine.url, policy(), "sql-rollout-r5", SAMPLING, None, reload_every=4, seed=1, directory=tmp_path)
    rollouts.sync_weights()
    started = time.monotonic()
    out = rollouts.generate(["p"] * 4 + ["q"] * 4, 4)
    assert time.monotonic() - started < 4.0  # it did not wait out the first request
    assert len(engine.asked) == 2 and rollouts.yielded == 1 and engine.cancelled == 1  # aborted once, then sent again and answered whole
    assert len(out["completion_ids"]) == 8 and out["prompt_ids"][0] == [3, 4, 5, 6]
    rollouts.close()


def test_serving_that_never_leaves_the_engine_stops_the_run_like_a_failed_engine(engine, tmp_path, quick, monkeypatch):
    from trainer import rollouts as module
    monkeypatch.setattr(module, "SERVING_YIELD_LIMIT_S", 0.2)
    engine.users = lambda t: 2
    rollouts = EngineRollouts(engine.url, policy(), "push-rollout-r6", SAMPLING, None, reload_every=4, seed=1, directory=tmp_path)
    with pytest.raises(RolloutFailed, match=r"serving kept the engine .* busy"):
        rollouts.generate(["p"] * 4, 4)
    assert engine.asked == [] and rollouts.yield_seconds >= 0.2  # nothing was sampled: no partial group
    rollouts.close()


def test_an_engine_without_gauges_is_sampled_at_once_and_counted_as_unwatched(engine, tmp_path):
    rollouts = EngineRollouts(engine.url, policy(), "push-rollout-r7", SAMPLING, None, reload_every=4, seed=1, directory=tmp_path)
    rollouts.generate(["p"] * 4, 4)
    assert rollouts.unwatched == 1 and rollouts.yielded == 0 and len(engine.asked) == 1
    rollouts.close()
