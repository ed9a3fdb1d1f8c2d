"""Trained is served: a version's probe (the trainer's logprobs of a text it trained on) is
checked on every engine that loads it, against real HTTP servers that speak vLLM's runtime LoRA
and prompt-logprobs API; an engine whose logprobs are off by more than the tolerance gets the
version unloaded from every engine, and nothing flips."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.records import LogprobProbe, TrainedNotServed
from deploy.hotswap import load_everywhere
from tests.unit.test_engine_client import send

PROBE = LogprobProbe(token_ids=[5, 6, 7, 8, 9], scored_from=2, logprobs=[-1.0, -0.5, -2.0])


class Engine:
    """A fake vLLM engine whose prompt logprobs of the probe's scored tokens are the trainer's plus `shift`."""

    def __init__(self, shift: float):
        self.shift, self.calls, engine = shift, [], self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, body):
                send(self, json.dumps(body).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.calls.append((self.path, body))
                if self.path != "/v1/completions" or "prompt_logprobs" not in body:
                    return self._send({"choices": [{"text": "ok"}]})
                positions = [None] + [{str(t): {"logprob": -3.0}} for t in body["prompt"][1:PROBE.scored_from]]
                positions += [{str(t): {"logprob": x + engine.shift}} for t, x in zip(body["prompt"][PROBE.scored_from:], PROBE.logprobs)]
                self._send({"choices": [{"text": "x", "prompt_logprobs": positions}]})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


@pytest.fixture
def engines():
    made = []

    def make(shift: float) -> Engine:
        made.append(Engine(shift))
        return made[-1]
    yield make
    for engine in made:
        engine.server.shutdown()


def test_a_version_every_engine_serves_as_trained_loads(engines):
    first, second = engines(0.02), engines(-0.05)
    asyncio.run(load_everywhere([first.url, second.url], "sql-v4", "/a/sql-v4", PROBE, tolerance=0.1))
    for engine in (first, second):
        asked = [body for path, body in engine.calls if "prompt_logprobs" in body]
        assert asked == [{"model": "sql-v4", "prompt": PROBE.token_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}]
        assert "/v1/unload_lora_adapter" not in engine.paths()


def test_an_engine_that_serves_other_logprobs_gets_the_version_unloaded_everywhere(engines):
    good, off = engines(0.0), engines(0.5)
    with pytest.raises(TrainedNotServed) as refused:
        asyncio.run(load_everywhere([good.url, off.url], "sql-v5", "/a/sql-v5", PROBE, tolerance=0.1))
    message = str(refused.value)
    assert off.url in message and "0.500 nats" in message and "tolerance of 0.1" in message
    assert isinstance(refused.value, ConnectionError)  # the gateway's 503, as any version an engine cannot serve
    for engine in (good, off):
        assert engine.paths()[-1] == "/v1/unload_lora_adapter"


def test_a_version_without_a_probe_is_loaded_as_before(engines):
    engine = engines(9.0)
    asyncio.run(load_everywhere([engine.url], "push-v1", "/a/push-v1"))
    assert all("prompt_logprobs" not in body for _, body in engine.calls)


def test_the_gap_is_the_mean_absolute_difference_and_refuses_a_probe_it_does_not_cover():
    assert PROBE.served_gap([-1.1, -0.4, -2.0]) == pytest.approx(0.2 / 3)
    with pytest.raises(ValueError, match="2 served logprobs for 3"):
        PROBE.served_gap([-1.0, -0.5])


@pytest.mark.xdist_group("torch")
def test_the_probe_is_what_the_trainers_weights_give_its_tokens():
    import torch

    from tests.unit.test_grpo_served_groups import TEMPERATURE, logprobs_of, policy, tokenizer
    from trainer.data import RolloutGroup, TaskData
    from trainer.probe import make_probe

    model = policy()
    group = RolloutGroup(key="g", source="r1", version="base", temperature=TEMPERATURE, prompt_token_ids=[3, 4, 5],
                         completion_ids=[[7, 8, 1], [9, 1]], logprobs=[[-1.0] * 3, [-1.0] * 2], reference="", context="{}")
    probe = make_probe(model, tokenizer(), TaskData("push", groups=[group]))
    assert probe.token_ids == [3, 4, 5, 7, 8, 1] and probe.scored_from == 1
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([probe.token_ids])).logits[0, :-1]
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(probe.token_ids[1:]).unsqueeze(1)).squeeze(1).tolist()
    assert probe.logprobs == pytest.approx(expected, abs=1e-4)
    assert probe.logprobs != pytest.approx(logprobs_of(model, [3], [4, 5, 7, 8, 1]), abs=1e-3)  # temperature 1, not the sampling one
    assert make_probe(model, tokenizer(), TaskData("push")) is None  # nothing trained on: nothing to probe


def test_a_groups_logprobs_with_its_prompt_run_once_are_each_samples_own():
    """GRPO's KL reads a group's samples through one run of their prompt; each sample's logprobs
    are what the sample's own forward gives, whatever its length."""
    import torch

    from tests.unit.test_grpo_served_groups import policy
    from trainer.probe import group_logprobs, token_logprobs

    model = policy()
    prompt, completions = [3, 4, 5, 6], [[7, 8, 1], [9, 1], [10, 11, 12, 13, 1]]
    together = group_logprobs(model, prompt, completions, 0.7)
    for completion, logprobs in zip(completions, together, strict=True):
        alone = token_logprobs(model, prompt + completion, len(prompt), 0.7)
        assert logprobs.shape == alone.shape and torch.allclose(logprobs, alone, atol=1e-5)
    assert model.training  # its mode is put back


def test_a_round_rejects_a_candidate_its_engines_do_not_serve_as_trained():
    from common.records import AdapterMeta
    from common.rounds import Outcome, TaskOutcome
    from common.settings import load_settings
    from trainer import round as round_module

    class Fleet:

        async def load(self, version, path, kind):
            raise TrainedNotServed(f"http://e serves {version} 0.700 nats from the trainer's logprobs")

    class Updates:
        def __init__(self):
            self.changes = []

        def update_adapter(self, version, status=None, reason=None, **changes):
            self.changes.append((version, status, reason))

    store, entry, said = Updates(), TaskOutcome(outcome=Outcome.NOT_TRAINED, why="test"), []
    candidate = AdapterMeta(version="sql-v7", task="sql", path="/a/sql-v7")
    asyncio.run(round_module._judge(load_settings(), store, Fleet(), candidate, 1, said.append, entry, lambda *a: None))
    assert entry.outcome == Outcome.REJECTED and "trained is not served" in entry.reason and "0.700 nats" in entry.reason
    assert store.changes == [("sql-v7", "rejected", entry.reason)] and entry.gate is None
    assert any("rejected sql-v7" in line for line in said)
