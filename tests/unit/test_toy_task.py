"""A fifth task from one registry entry, and nothing else: `echo` (say the given word back) is
registered here, then served through the real gateway app (its route, its input model, its
sampling, a group of samples scored by its reward, the record), reached through the chat API and
`tucano-auto`, scored and its references checked by the same entry points as the four tasks,
and trained with GRPO on the groups the gateway recorded, with TRL's real trainer on a tiny
model and the real reward function. No file of the service names `echo`.

The stand-in engine answers with fixed completions of the tiny model's vocabulary and the tiny
model's own logprobs of them, as vLLM would report a policy's."""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from common.records import RewardContext, Sampling
from common.settings import load_settings
from common.tasks import EngineKind, TaskTraits
from rewards import references
from rewards.references import InvalidReference
from router.engine_client import EnginePool
from router.route_table import RouteTable
from server.app import create_app
from server.state import GatewayState
from tasks import TASKS, TaskDefinition, check_reference, definition, register, score, typed_input, unregister
from tests.unit.test_engine_client import MODELS, FixedPrompt, send
from tests.unit.test_served_groups import MemoryStore, NoExamples

pytestmark = pytest.mark.xdist_group("torch")  # the training test imports torch and TRL in its body
TEMPERATURE = 0.7
PROMPT = [3, 4, 5, 6]
GOOD, BAD = [7, 7, 1], [9, 9, 1]  # "t7 t7" says the word t7 back; "t9 t9" does not (t1 ends it)


class EchoInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    word: str = Field(min_length=1, max_length=20)


def echo_score(completion: str, reference, context: RewardContext, fields: dict):
    said = completion.split()
    word = context.input.word if context.input is not None else None
    share = sum(w == word for w in said) / len(said) if said else 0.0
    return {"echo": share}, {"echo": 1.0}, {"echo": f"{share:.0%} of the words are the word"}, completion.strip()


ECHO = TaskDefinition(
    name="echo",
    traits=TaskTraits(EngineKind.BASE, scored_with_reference=False, thinks=False, runs_sql=False, answer_field=None, chat_input_json=False),
    sampling=Sampling(TEMPERATURE, 1.0, 8),
    group_temperature=TEMPERATURE,
    input_model=EchoInput,
    output_model=None,
    input_field="word",
    system_prompt="Repita a palavra.",
    user_message=lambda task_input: f"Palavra: {task_input.word}",
    scorer=echo_score,
    valid=lambda components, details, output: bool(output),
    check_reference=lambda value: references.text("echo", value, max_chars=40),
    makers=lambda refs: {"empty": lambda _: ""},
    cues=((r"\becoe\b", 5.0),),
    serve_samples=4,
)


def tiny_policy():
    from peft import LoraConfig, get_peft_model

    from tests.unit.test_training_on_cpu import tiny_model

    return get_peft_model(tiny_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                   task_type="CAUSAL_LM"))


class TinyEngine(BaseHTTPRequestHandler):
    """Answers a completion request with `n` choices, alternately the good and the bad completion,
    with token ids and the tiny policy's logprob of each token at the sampling temperature."""
    logprobs: ClassVar[dict[tuple, list[float]]] = {}
    bodies: ClassVar[list[dict]] = []

    def do_GET(self):
        send(self, MODELS)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        choices = []
        for i in range(body.get("n", 1)):
            ids = GOOD if i % 2 == 0 else BAD
            choice = {"index": i, "text": " ".join(f"t{t}" for t in ids[:-1]), "finish_reason": "stop"}
            if body.get("return_token_ids"):
                choice.update(token_ids=ids, prompt_token_ids=PROMPT)
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"token_logprobs": type(self).logprobs[tuple(ids)], "tokens": [f"t{t}" for t in ids], "top_logprobs": []}
            choices.append(choice)
        send(self, json.dumps({"choices": choices, "usage": {"prompt_tokens": 4, "completion_tokens": 3 * len(choices)}}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def echo():
    register(ECHO)
    try:
        yield ECHO
    finally:
        unregister("echo")


@pytest.fixture
def gateway(echo):
    server = ThreadingHTTPServer(("127.0.0.1", 0), TinyEngine)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings = load_settings(rate_limit_per_minute=0, feedback_rate_limit_per_minute=0, examples_tasks=[])
    store = MemoryStore()
    pools = {kind: EnginePool(kind, [url], template=FixedPrompt()) for kind in EngineKind}
    app = create_app(GatewayState(settings, store, RouteTable(store, poll_s=30), pools, adapter_action=None, examples=NoExamples()))
    TinyEngine.logprobs = {tuple(GOOD): [-1.0] * 3, tuple(BAD): [-1.0] * 3}
    with TestClient(app) as client:
        yield client, store, settings
    server.shutdown()
    TinyEngine.bodies.clear()


def test_the_registry_refuses_a_second_entry_of_a_name_and_names_an_unknown_task(echo):
    with pytest.raises(ValueError, match="registered already"):
        register(ECHO)
    for bad in ("Echo", "echo_2", "auto", ""):
        with pytest.raises(ValueError, match="is not a task name"):
            register(replace(ECHO, name=bad))
    with pytest.raises(KeyError, match="unknown task 'poem'; tasks are extraction, sql, push, insights, echo"):
        definition("poem")
    assert "echo" in TASKS and TASKS[-1] == "echo"


def test_a_toy_task_is_served_from_its_entry_alone(gateway):
    client, store, _ = gateway
    response = client.post("/v1/tasks/echo", json={"input": {"word": "t7"}})
    assert response.status_code == 200, response.text
    body, = TinyEngine.bodies
    assert body["n"] == 4 and body["temperature"] == TEMPERATURE and body["max_tokens"] == 8  # its sampling, its serve_samples
    answer = response.json()
    assert answer["task"] == "echo" and answer["raw"] == "t7 t7" and answer["scores"]["total"] == 1.0  # the best by its reward
    assert answer["sample"]["of"] == 4 and answer["sample"]["totals"] == [1.0, 0.0, 1.0, 0.0]
    record, = store.records
    assert record.task == "echo" and record.group.rewards == [1.0, 0.0, 1.0, 0.0] and record.reward.components == {"echo": 1.0}
    # its input model refuses what it does not take, naming the field
    refused = client.post("/v1/tasks/echo", json={"input": {"palavra": "t7"}})
    assert refused.status_code == 422 and "input.word" in refused.json()["error"]["message"]
    # the chat API serves it by its public name, and tucano-auto finds it by its cues
    assert "tucano-echo" in [m["id"] for m in client.get("/v1/models").json()["data"]]
    chat = client.post("/v1/chat/completions", json={"model": "tucano-echo", "messages": [{"role": "user", "content": "t7"}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "t7 t7"
    auto = client.post("/v1/chat/completions", json={"model": "tucano-auto", "messages": [{"role": "user", "content": "ecoe t7"}]})
    assert auto.status_code == 200 and auto.headers.get("X-Tucano-Task", auto.json()["tucano"]["task"]) == "echo"
    assert store.records[-1].task == "echo" and store.records[-1].input == {"word": "ecoe t7"}


def test_a_toy_task_is_scored_and_its_references_checked_by_the_same_entry_points(echo):
    assert score("echo", "t7 t7", None, RewardContext(typed_input("echo", {"word": "t7"}))).total == 1.0
    scored = score("echo", "t7 t9", "t7", RewardContext(typed_input("echo", {"word": "t7"})))
    assert scored.total == 0.5 and not scored.reference_used  # its traits say no reference scores it
    assert score("echo", "", None, RewardContext(typed_input("echo", {"word": "t7"}))).valid is False
    assert check_reference("echo", "t7") == "t7"
    with pytest.raises(InvalidReference, match="at most 40 characters"):
        check_reference("echo", "t7 " * 20)
    with pytest.raises(InvalidReference, match="echo reference is the answer's text"):
        check_reference("echo", {"word": "t7"})
    assert definition("echo").makers([])["empty"]({"word": "t7"}) == ""


def test_a_toy_task_trains_with_grpo_on_the_groups_the_gateway_recorded(gateway, monkeypatch):
    """The round's data (`trainer.data.build`) turns the toy's recorded groups into rollouts, and
    `train_on_groups` scores them with the real reward function over `tasks.score`, the toy's
    scorer: the policy moves toward the completion that says the word."""
    import torch

    from tests.unit.test_grpo_served_groups import logprobs_of, tokenizer
    from trainer import data, grpo

    client, store, settings = gateway
    model, tok = tiny_policy(), tokenizer()
    TinyEngine.logprobs = {tuple(ids): logprobs_of(model, PROMPT, ids) for ids in (GOOD, BAD)}
    for _ in range(4):
        assert client.post("/v1/tasks/echo", json={"input": {"word": "t7"}}).status_code == 200
    records = [(str(i), record) for i, record in enumerate(store.records)]
    built = data.build("echo", [], records, FixedPrompt().render, settings.reward_context, frozenset(), seed=0,
                       unlabelled_limit=0, liked_as_supervised=False, groups_limit=10)
    assert len(built.groups) == 4 and all(g.completion_ids[0] == GOOD for g in built.groups)
    assert RewardContext.from_json(built.groups[0].context, definition("echo").input_model).input.word == "t7"
    before = sum(logprobs_of(model, PROMPT, GOOD)) - sum(logprobs_of(model, PROMPT, BAD))
    trained = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=1, grpo_max_epochs=3,
                            train_cpu_precision="fp32")
    torch.manual_seed(0)
    outcome = grpo.train_on_groups(trained, model, tok, "echo", built.groups, 600.0, "test", policy="base")
    after = sum(logprobs_of(model, PROMPT, GOOD)) - sum(logprobs_of(model, PROMPT, BAD))
    assert outcome.steps == 6 and outcome.grpo.groups_dropped == 0 and outcome.grpo.reward_mean == pytest.approx(0.5)
    assert after > before + 1.0, (before, after)
