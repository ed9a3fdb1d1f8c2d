"""Served answers as rollouts, against the real gateway, Redis and vLLM (tiny models): a request
is sampled as a group in one engine request, the record holds every sample's tokens and
logprobs, the trainer's logprobs of those tokens agree with the engine's (the importance ratio
GRPO weighs them by starts near 1), and a round's GRPO trains on the recorded groups with TRL
without generating anything."""
from __future__ import annotations

import json
import math
import statistics
import time

import httpx
import pytest

from common.tasks import ExtractionInput
from tasks import definition
from trainer.data import GrpoPrompt

REVIEWS = ["Produto chegou quebrado e a entrega atrasou duas semanas.", "Adorei o fone, som ótimo e chegou antes do prazo.",
           "A camiseta veio com o tamanho errado, quero trocar.", "Bom produto, mas a caixa veio amassada.",
           "Não recomendo, parou de funcionar em três dias.", "Entrega rápida e o vendedor respondeu tudo."]


SAMPLES = 4  # extraction is served once by default; a team (or a request) may sample it as a group


def ask(gateway, review: str, **options) -> dict:
    response = httpx.post(f"{gateway.url}/v1/tasks/extraction", json={"input": {"review": review}, "options": options}, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def served(gateway):
    """Records of the extraction requests above, each a group of the task's default size."""
    store = gateway.state.store
    return [store.get_record(ask(gateway, review, seed=i, samples=SAMPLES)["id"]).record for i, review in enumerate(REVIEWS)]


def test_a_request_is_one_group_and_its_record_holds_every_sample(gateway, served):
    n = SAMPLES
    for record in served:
        group = record.group
        assert record.sampling.n == n == len(group.samples) and record.sampling.temperature == definition("extraction").group_temperature
        assert record.raw == group.samples[group.chosen].text and record.reward.total == max(group.rewards)
        assert group.prompt_token_ids and all(len(s.token_ids) == len(s.logprobs) > 0 for s in group.samples)
        assert all(math.isfinite(x) and x <= 0.0 for s in group.samples for x in s.logprobs)
    tokenizer = gateway.state.pools["base"].template.tokenizer
    assert served[0].group.prompt_token_ids == tokenizer(served[0].prompt, add_special_tokens=True)["input_ids"]
    alone = ask(gateway, REVIEWS[0], samples=1)
    assert alone["sample"] is None and gateway.state.store.get_record(alone["id"]).record.group is None
    too_many = httpx.post(f"{gateway.url}/v1/tasks/extraction", json={"input": {"review": REVIEWS[0]}, "options": {"samples": 99}})
    assert too_many.status_code == 422 and "cap" in too_many.json()["error"]["message"]


def test_a_group_answered_from_its_first_finished_samples_is_streamed_whole_and_the_rest_cut(gateway, engines):
    """The first 2 of 4 samples to finish, reassembled from vLLM's stream: each is the text its
    token ids decode to, with a logprob per token; the record counts the 2 cut; the engine is left
    with no request running (the cut samples were aborted, not left decoding)."""
    from trainer.idle import requests_in_engine

    tokenizer = gateway.state.pools["base"].template.tokenizer
    for i, review in enumerate(REVIEWS[:3]):
        answer = ask(gateway, review, seed=100 + i, samples=4, first_finished=2)
        assert answer["sample"]["of"] == 2 and answer["sample"]["cut"] == 2
        record = gateway.state.store.get_record(answer["id"]).record
        assert record.sampling.n == 4 and record.sampling.first_finished == 2 and record.group.cut == 2
        assert record.raw == record.group.samples[record.group.chosen].text
        for sample in record.group.samples:
            assert sample.finish_reason in ("stop", "length") and len(sample.token_ids) == len(sample.logprobs) > 0
            assert tokenizer.decode(sample.token_ids, skip_special_tokens=True) == sample.text
        assert record.group.prompt_token_ids == tokenizer(record.prompt, add_special_tokens=True)["input_ids"]
    deadline = time.monotonic() + 10
    while requests_in_engine(httpx.get(f"{engines['base'].url}/metrics", timeout=10).text) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert requests_in_engine(httpx.get(f"{engines['base'].url}/metrics", timeout=10).text) == 0


def test_the_trainers_logprobs_of_a_served_group_are_the_engines(built, engines, served):
    """The sampled tokens are the ones the trainer scores, at the group's temperature: the engine's
    prompt logprobs of a sample (no grammar, temperature 1) are the trainer's, and the logprobs it
    sampled with (processed: at the group's temperature, renormalised over what the JSON schema's
    grammar allows) are the trainer's or above them, never below. A token off by one place, or
    logprobs of another temperature, breaks both; the grammar alone only raises the engine's."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.probe import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(built.base_model_path, dtype=torch.float32)
    url = engines["base"].url
    name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    unmasked, below, sampled = [], [], 0
    for record in served[:3]:
        group, temperature = record.group, record.sampling.temperature
        prompt = group.prompt_token_ids
        for sample in group.samples:
            ours = token_logprobs(model, prompt + sample.token_ids, len(prompt), temperature)
            below += (torch.tensor(sample.logprobs) - ours < -0.1).tolist()
            sampled += len(sample.token_ids)
            reply = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": prompt + sample.token_ids, "max_tokens": 1,
                                                               "temperature": 0.0, "prompt_logprobs": 0}, timeout=120)
            positions = reply.json()["choices"][0]["prompt_logprobs"]
            engine = [positions[len(prompt) + i][str(token)]["logprob"] for i, token in enumerate(sample.token_ids)]
            plain = token_logprobs(model, prompt + sample.token_ids, len(prompt))
            unmasked += (plain - torch.tensor(engine)).abs().tolist()
    assert statistics.median(unmasked) < 0.05, statistics.median(unmasked)
    assert sum(below) <= 0.05 * sampled, (sum(below), sampled)


def test_a_rounds_grpo_trains_on_the_served_groups(built, served):
    from router.engine_client import ChatTemplate
    from trainer import data as round_data
    from trainer import grpo
    from trainer.policy import load_policy

    settings = built.model_copy(update={"grpo_max_epochs": 1.0, "grpo_prompts_per_step": 2, "train_cpu_precision": "fp32"})
    template = ChatTemplate.load(settings.base_model_path)
    records = [(f"{i}-0", record) for i, record in enumerate(served)]
    data = round_data.build("extraction", [], records, template.render, settings.reward_context, frozenset(), 1, 64, False,
                            groups_limit=64)
    assert len(data.groups) + sum(v for k, v in data.skipped.items() if k.startswith("group")) == len(served)
    assert data.groups, data.skipped
    model, tokenizer = load_policy(settings.base_model_path, None, 8, 16, None, False, False, 1)
    outcome = grpo.train_on_groups(settings, model, tokenizer, "extraction", data.groups, 300.0, "test", policy="base")
    report = outcome.grpo
    assert report.rollouts == grpo.SERVED_GROUPS and report.generation_tokens_per_s is None and outcome.steps > 0
    assert 0 < report.groups <= len(data.groups) + 1 and report.groups_dropped <= report.groups
    assert report.importance_tokens > 0 and report.kl_to_parent is not None
    print(json.dumps({"steps": outcome.steps, "report": {k: getattr(report, k) for k in report.__dataclass_fields__}}, default=str))


def test_served_groups_smaller_than_grpos_group_are_completed_on_the_engine_and_trained(built, engines, served):
    """Served groups of 4 completed to 8 on the real base engine: each prompt's served token ids
    sampled 4 more times from the policy (loaded under a fresh name, unloaded after), with
    logprobs the trainer's agree with (few tokens above the importance cap), then trained."""
    from router.engine_client import ChatTemplate
    from trainer import data as round_data
    from trainer import grpo
    from trainer.policy import load_policy

    settings = built.model_copy(update={"grpo_max_epochs": 1.0, "grpo_prompts_per_step": 2, "train_cpu_precision": "fp32",
                                        "grpo_num_generations": 2 * SAMPLES})
    template = ChatTemplate.load(settings.base_model_path)
    data = round_data.build("extraction", [], [(f"{i}-0", r) for i, r in enumerate(served)], template.render, settings.reward_context,
                            frozenset(), 1, 64, False, groups_limit=64)
    assert data.groups and {g.size for g in data.groups} == {SAMPLES}
    model, tokenizer = load_policy(settings.base_model_path, None, 8, 16, None, False, False, 1)
    url = engines["base"].url
    outcome = grpo.train_on_groups(settings, model, tokenizer, "extraction", data.groups, 300.0, "test", policy="base",
                                   engine_url=url, name_prefix=f"extraction-complete-test-{time.time_ns()}")
    report = outcome.grpo
    assert report.group_size == 2 * SAMPLES and f"completed to {2 * SAMPLES} on the engine" in outcome.why
    assert outcome.seconds_by_phase["samples_completed_on_engine"] == SAMPLES * len(data.groups)
    assert report.rollouts.startswith(grpo.SERVED_GROUPS) and report.generation_tokens_per_s > 0 and outcome.steps > 0
    assert report.importance_tokens > 0 and report.importance_clipped <= 0.05 * report.importance_tokens, report
    assert not any("complete" in card["id"] for card in httpx.get(f"{url}/v1/models").json()["data"])  # unloaded
    print(json.dumps({"steps": outcome.steps, "report": {k: getattr(report, k) for k in report.__dataclass_fields__}}, default=str))


def test_a_round_reads_again_the_groups_its_policy_served_in_earlier_rounds(built, gateway, served):
    """The groups no version was made from come back from the real records stream, newest first,
    whether or not a round already read and acknowledged them; never this round's own records
    twice, never another version's groups."""
    from trainer.round import kept_groups

    store, policy = gateway.state.store, served[0].version  # the base model, unless another test promoted a version
    assert {record.version for record in served} == {policy}
    ids = [record.id for record in served]
    kept = [record.id for record in kept_groups(store, built, "extraction", policy, [])]
    assert [i for i in kept if i in ids] == ids[::-1]  # the newest first
    newest = [("1-0", served[-1])]  # the round's own new record is not read again as an earlier one
    assert served[-1].id not in {record.id for record in kept_groups(store, built, "extraction", policy, newest)}
    assert kept_groups(store, built, "extraction", "extraction-v9", []) == []  # another version served none of them
    assert kept_groups(store, built.model_copy(update={"grpo_kept_scan": 0}), "extraction", policy, []) == []
    few = kept_groups(store, built.model_copy(update={"grpo_max_groups": 2}), "extraction", policy, [])
    assert len(few) == 2 and all(record.group is not None for record in few)


def test_grpo_samples_its_groups_on_the_engine_where_traffic_is_thin(built, engines):
    """The policy loaded into the real base engine under fresh names, its groups sampled there with
    their logprobs, trained with TRL; every name it loaded is unloaded by the end."""
    from router.engine_client import ChatTemplate
    from router.prompts import build_messages
    from trainer import grpo
    from trainer.policy import load_policy

    settings = built.model_copy(update={"grpo_max_epochs": 1.0, "grpo_prompts_per_step": 2, "train_cpu_precision": "fp32",
                                        "grpo_reload_every": 2})
    template = ChatTemplate.load(settings.base_model_path)
    prompts = [GrpoPrompt(template.render(build_messages("extraction", ExtractionInput(review=review))), "extraction", f"r{i}",
                          context=settings.reward_context(ExtractionInput(review=review)).to_json()) for i, review in enumerate(REVIEWS[:4])]
    model, tokenizer = load_policy(settings.base_model_path, None, 8, 16, None, False, False, 1)
    url = engines["base"].url
    outcome = grpo.train_on_engine(settings, model, tokenizer, "extraction", prompts, url, f"extraction-rollout-test-{time.time_ns()}",
                                   300.0, "test")
    report = outcome.grpo
    assert outcome.steps == 4 and report.rollouts.startswith(grpo.ENGINE) and report.generation_tokens_per_s > 0
    assert outcome.seconds_by_phase["reloads"] == 2 and report.importance_tokens > 0
    served = httpx.get(f"{url}/v1/models").json()["data"]
    assert not any("rollout" in card["id"] for card in served)  # every reload unloaded
    print(json.dumps({"steps": outcome.steps, "report": {k: getattr(report, k) for k in report.__dataclass_fields__}}, default=str))


def test_the_idle_probe_reads_the_real_engines_metrics(engines):
    """vLLM's own /metrics page carries the gauges `trainer.idle` reads: an engine between requests is idle."""
    from trainer.idle import GAUGES, engines_idle, requests_in_engine

    page = httpx.get(f"{engines['base'].url}/metrics", timeout=10).text
    assert all(any(line.startswith(gauge) for line in page.splitlines()) for gauge in GAUGES)
    assert requests_in_engine(page) == 0 and engines_idle([engines["base"].url, engines["think"].url])
