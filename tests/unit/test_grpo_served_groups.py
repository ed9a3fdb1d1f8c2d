"""GRPO on served groups, with TRL's real trainer on a tiny model: the recorded samples are the
rollouts (nothing is generated), a group whose rewards do not vary is dropped and counted, each
token is weighed by its importance ratio to the version that sampled it (a token above the cap
is counted as clipped), and the policy moves toward the samples its group rewarded. The reward
is a stand-in that counts one token, so that which sample is better is known exactly."""
from __future__ import annotations

import json

import pytest

from common.settings import load_settings
from tests.unit.test_training_on_cpu import VOCAB, tiny_model
from trainer.data import RolloutGroup

pytestmark = pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: torch and TRL are imported in the tests
GOOD, PAD, EOS = 7, 0, 1
TEMPERATURE = 0.7


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="t0", eos_token="t1", unk_token="t2")


def policy():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(tiny_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                   task_type="CAUSAL_LM"))


def logprobs_of(model, prompt: list[int], completion: list[int]) -> list[float]:
    """The model's logprob of each completion token at the sampling temperature, as an engine's
    processed logprobs are."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1] / TEMPERATURE
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


def counting_reward(aggregation, num_generations, std_floor, log=None, credit=None):
    """One point per GOOD token in the decoded completion."""
    def reward(prompts=None, completions=(), **kwargs):
        return [float(c.split().count(f"t{GOOD}")) for c in completions]
    reward.__name__ = "count_good"
    return reward


def served_group(model, key: str, completions: list[list[int]], version: str = "base", logprob_shift: float = 0.0) -> RolloutGroup:
    prompt = [3, 4, 5, 6]
    return RolloutGroup(key=key, source=key, version=version, temperature=TEMPERATURE, prompt_token_ids=prompt,
                        completion_ids=completions,
                        logprobs=[[x + logprob_shift for x in logprobs_of(model, prompt, c)] for c in completions],
                        reference="", context=json.dumps({}))


def test_served_groups_train_without_generating_and_move_the_policy_toward_what_they_rewarded(monkeypatch):
    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    model, tok = policy(), tokenizer()
    generated = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: generated.append(1))
    good, bad = [GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]
    groups = [served_group(model, f"g{i}", [good, bad, bad, good]) for i in range(6)]
    groups.append(served_group(model, "flat", [bad, bad, bad, bad]))  # no spread: dropped
    groups.append(served_group(model, "older", [good, bad, good, bad], version="push-v1", logprob_shift=-3.0))  # ratio e^3 > cap
    before = sum(logprobs_of(model, [3, 4, 5, 6], good)) - sum(logprobs_of(model, [3, 4, 5, 6], bad))
    settings = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=2, grpo_max_epochs=3,
                             train_cpu_precision="fp32", grpo_importance_cap=2.0)
    outcome = grpo.train_on_groups(settings, model, tok, "push", groups, 600.0, "test", policy="base")
    after = sum(logprobs_of(model, [3, 4, 5, 6], good)) - sum(logprobs_of(model, [3, 4, 5, 6], bad))
    report = outcome.grpo
    assert generated == []  # the served samples were the rollouts
    assert report.rollouts == grpo.SERVED_GROUPS and report.generation_tokens_per_s is None
    # 8 groups x 3 epochs, 2 a generation batch, each batch optimised twice (grpo_iterations)
    assert outcome.steps == report.steps == 24 and report.groups_per_batch == 2
    assert report.groups == 24 and report.groups_dropped == 3  # the flat group, in each epoch
    assert report.older_groups == 1
    assert report.importance_tokens == 24 * 4 * 4 - 3 * 4 * 4  # every token of the groups not dropped
    # the older group's 16 tokens are above the cap in every epoch (its recorded logprobs are 3 nats
    # low), and the served groups' tokens drift above it as the policy moves away from what sampled them
    assert 3 * 16 <= report.importance_clipped < report.importance_tokens
    assert report.kl_to_parent > 0  # it moved from what sampled its groups...
    same = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    sampled = [(g.prompt_token_ids, g.completion_ids) for g in groups[:2]]
    assert grpo.kl_to_parent(model, same, sampled, TEMPERATURE) == pytest.approx(0.0, abs=1e-6)  # ...and from itself, not at all
    assert report.reward_mean > 0 and report.reward_std > 0 and report.optimisation_tokens_per_s > 0
    assert after > before + 1.0, (before, after)  # the rewarded sample became likelier than the other


def test_more_groups_than_the_batches_allow_make_larger_batches_not_more_steps(monkeypatch):
    """`grpo_max_batches` caps the generation batches of a pass: 8 groups in at most 2 batches are
    2 batches of 4, each optimised twice, so 4 steps where batches of 2 would make 8."""
    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    settings = load_settings(grpo_prompts_per_step=2, grpo_max_batches=30)
    assert [grpo.groups_per_batch(settings, n) for n in (1, 8, 60, 61, 180)] == [2, 2, 2, 3, 6]
    assert grpo.groups_per_batch(settings.model_copy(update={"grpo_max_batches": 0}), 180) == 2  # off: the fixed batch
    model, tok = policy(), tokenizer()
    good, bad = [GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]
    groups = [served_group(model, f"g{i}", [good, bad, bad, good]) for i in range(8)]
    capped = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_max_batches=2, grpo_iterations=2,
                           grpo_max_epochs=1, train_cpu_precision="fp32")
    outcome = grpo.train_on_groups(capped, model, tok, "push", groups, 600.0, "test", policy="base")
    assert outcome.steps == 4 and outcome.grpo.groups_per_batch == 4 and outcome.grpo.groups == 8


def test_a_large_generation_batch_is_accumulated_in_passes_of_a_few_groups_to_the_same_weights(monkeypatch):
    """`grpo_groups_per_forward` bounds the groups of one forward pass, so memory follows it, not the
    generation batch: a batch of 4 groups run as 2 passes of 2 (or 4 of 1) ends at the weights of
    one pass of 4, at the same steps."""
    import torch

    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    settings = load_settings(grpo_groups_per_forward=2)
    assert [grpo.groups_per_forward(settings, n) for n in (1, 2, 3, 4, 6, 7)] == [1, 2, 1, 2, 2, 1]
    good, bad = [GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]
    trained = {}
    for per_forward in (4, 2, 1):
        torch.manual_seed(0)
        model = policy()
        groups = [served_group(model, f"g{i}", [good, bad, bad, good] if i % 2 else [bad, good, good, bad]) for i in range(8)]
        capped = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=4, grpo_iterations=2, grpo_max_epochs=1,
                               train_cpu_precision="fp32", grpo_groups_per_forward=per_forward)
        outcome = grpo.train_on_groups(capped, model, tokenizer(), "push", groups, 600.0, "test", policy="base")
        assert outcome.steps == 4 and outcome.grpo.groups_per_batch == 4
        trained[per_forward] = torch.cat([p.detach().flatten() for n, p in model.named_parameters() if p.requires_grad])
    moved = (trained[4] - trained[2]).abs().max().item(), (trained[4] - trained[1]).abs().max().item()
    assert max(moved) < 1e-4, moved


def test_a_kl_penalty_is_to_the_base_model_not_to_the_weights_the_run_starts_from(monkeypatch, tmp_path):
    """A round continues the active version, so TRL's own reference for a PEFT model that has
    weights (a copy of them) would let a lineage drift without bound. The reference is the base
    model: a policy whose LoRA already moved it reports a KL to the base from its first step, while
    it barely moves from its own start, and no reference adapter is saved beside the trained one."""
    import torch

    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    model = policy()
    with torch.no_grad():  # a version that already moved away from the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(3))
    good, bad = [GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]
    groups = [served_group(model, f"g{i}", [good, bad, bad, good], version="push-v1") for i in range(4)]
    settings = load_settings(grpo_learning_rate=1e-6, grpo_prompts_per_step=2, grpo_iterations=1, grpo_max_epochs=1,
                             train_cpu_precision="fp32", grpo_beta=0.5)
    report = grpo.train_on_groups(settings, model, tokenizer(), "push", groups, 600.0, "test", policy="push-v1").grpo
    assert report.beta == 0.5
    assert report.kl_to_parent < 1e-4 < 0.01 < report.kl_to_base, report
    assert "ref" not in model.peft_config
    model.save_pretrained(tmp_path)
    assert not (tmp_path / "ref").exists()


def test_a_kl_penalty_keeps_the_policy_nearer_the_base_model(monkeypatch):
    """The same groups from the same start: with `grpo_beta` the trained policy ends nearer the
    base model than without; without it no reference is computed (no KL reported)."""
    from trainer import grpo

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    good, bad = [GOOD, GOOD, 9, EOS], [10, 11, 12, EOS]
    reports = {}
    for beta in (0.0, 2.0):
        model = policy()  # a fresh LoRA: its start is the base model, so its KL to the parent is its KL to the base
        groups = [served_group(model, f"g{i}", [good, bad, bad, good]) for i in range(6)]
        settings = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=2, grpo_max_epochs=2,
                                 train_cpu_precision="fp32", grpo_beta=beta)
        reports[beta] = grpo.train_on_groups(settings, model, tokenizer(), "push", groups, 600.0, "test", policy="base").grpo
    assert reports[0.0].kl_to_base is None and reports[0.0].beta == 0.0
    assert reports[2.0].kl_to_base is not None
    assert 0 < reports[2.0].kl_to_parent < 0.8 * reports[0.0].kl_to_parent, (reports[0.0], reports[2.0])  # held back, still trained


def test_groups_of_another_size_or_temperature_are_left_out_and_counted():
    from trainer import grpo

    def group(key, n, temperature):
        return RolloutGroup(key=key, source=key, version="base", temperature=temperature, prompt_token_ids=[1],
                            completion_ids=[[2]] * n, logprobs=[[-1.0]] * n, reference="", context="{}")

    kept, left_out = grpo.usable_groups([group("a", 4, 0.7), group("b", 4, 0.7), group("c", 2, 0.7), group("d", 4, 1.0)])
    assert [g.key for g in kept] == ["a", "b"]
    assert sum(left_out.values()) == 2 and any("2 samples" in k for k in left_out) and any("temperature 1" in k for k in left_out)
    with pytest.raises(ValueError, match="no served group"):
        grpo.train_on_groups(load_settings(), None, None, "push", [], 10.0, "test")


def test_grpo_runs_each_prompt_once_and_trains_the_weights_trls_own_forward_trains(monkeypatch):
    """The trainer's forward runs a batch's distinct prompts once (`trainer.shared_prefix`); the
    same groups trained with TRL's forward (every sample's prompt again) end at the same weights."""
    import torch

    from trainer import grpo, shared_prefix, trl_internals

    monkeypatch.setattr(grpo, "reward_function", counting_reward)
    settings = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=2, grpo_max_epochs=1,
                             train_cpu_precision="fp32")

    def trained(share: bool):
        calls = []

        def spy(*args):
            inputs = shared_prefix.with_shared_prompts(*args) if share else None
            calls.append(inputs is not None)
            return inputs

        monkeypatch.setattr(trl_internals, "with_shared_prompts", spy)
        model = policy()
        good, bad = [GOOD, GOOD, 9, EOS], [10, EOS]
        groups = [served_group(model, f"g{i}", [good, bad, bad, good][i % 2:] + [good, bad][:i % 2]) for i in range(4)]
        for i, group in enumerate(groups):  # prompts of their own lengths: left padding in the batch
            group.prompt_token_ids = [3 + i] * (3 + i) + [4, 5, 6]
            group.logprobs = [logprobs_of(model, group.prompt_token_ids, c) for c in group.completion_ids]
        outcome = grpo.train_on_groups(settings, model, tokenizer(), "push", groups, 600.0, "test", policy="base")
        return outcome, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, calls

    shared_outcome, shared_weights, shared_calls = trained(True)
    plain_outcome, plain_weights, plain_calls = trained(False)
    assert shared_outcome.steps == plain_outcome.steps == 4
    assert shared_calls and all(shared_calls) and not any(plain_calls)
    for name, value in plain_weights.items():
        assert torch.allclose(value, shared_weights[name], atol=1e-5), name
    assert any(not torch.allclose(value, torch.zeros_like(value)) for name, value in shared_weights.items() if "lora_B" in name)


def test_bench_grpos_report_says_whether_the_arms_losses_are_the_same():
    """fp32 (a CPU without bf16) gives both arms the same losses; bf16 autocast rounds them apart."""
    from bench.grpo import table

    arm = {"seconds_per_step": 12.57, "ci95": [11.62, 13.54], "steps": 16, "optimisation_tokens_per_s": 145.4}
    results = {"task": "push", "groups": 8, "group_size": 4, "repeats": 2, "prompts_per_step": 2,
               "arms": {"shared prompts": arm, "TRL forward": {**arm, "seconds_per_step": 19.8}},
               "speedup": {"ratio": 1.575, "ci95": [1.41, 1.77]}, "same_losses": 0.0}
    assert "Steps 1.57 times as fast with each prompt run once [1.41, 1.77]; the two arms' losses are the same." in table(results)
    assert "differ by at most 0.003 (bf16 autocast" in table({**results, "same_losses": 0.003})


def test_bench_grpo_gains_report_flags_a_reference_free_gain_running_ahead_of_the_references():
    """Issue 64: a policy that pleases the scorer gains more without references than with them; the
    table says by how much where the lead passes 0.05, and only there."""
    from bench.grpo_gain import table

    def arm(temperature: float, rate: float, gain: float, free: float) -> dict:
        return {"method": "grpo", "temperature": temperature, "learning_rate": rate, "reward_mean": 0.46, "reward_std": 0.155,
                "steps": 24, "seconds": 400.0, "groups_seen": 48, "groups_dropped": 5, "kl_to_parent": 0.21,
                "clip_ratio": 0.004, "held_out": {"mean": 0.5 + gain}, "gain": {"mean": gain, "ci95": [gain - 0.03, gain + 0.03], "n": 40},
                "reference_free_gain": {"mean": free, "ci95": [free - 0.02, free + 0.02], "n": 40},
                "scorer": {"rank_correlation": 0.81}, "same_answer_as_base": 7}

    results = {"task": "extraction", "groups": 48, "group_sizes": [4], "epochs": [1.0, 2.0], "measure_rows": 40, "minutes": 41.5,
               "greedy_served_on_group_rows": 0.52,
               "base": {"held_out": {"mean": 0.5}, "scorer": {"rank_correlation": 0.77, "served_mean": 0.6}},
               "groups_check": [{"temperature": 0.7, "within_group_rank_correlation": {"mean": 0.597, "ci95": [0.45, 0.72], "n": 48},
                                 "groups_ranked": 48, "samples": 0.511, "served_pick": 0.618, "best_sample": 0.645, "greedy": 0.503},
                                {"temperature": 0.3, "within_group_rank_correlation": None, "groups_ranked": 1, "samples": 0.5,
                                 "served_pick": 0.5, "best_sample": 0.5, "greedy": 0.503}],
               "arms": [{**arm(0.7, 1e-4, 0.06, 0.13), "groups_per_batch": 2}, arm(0.3, 3e-5, 0.02, 0.06), {**arm(0.3, 3e-5, 0.02, 0.06), "epochs": 2.0},
                        {**arm(0.7, 1e-3, 0.03, 0.03), "method": "sft on picks", "clip_ratio": None, "epochs": None}]}
    text = table(results)
    assert "(4 samples each, passes over them: 1, 2)" in text
    assert "the base model: 0.500, its served score there 0.6, their rank correlation 0.77" in text
    assert "Its answers as served to the groups' own rows: served score 0.52." in text
    assert ("| grpo | 0.7 | 4 | 0.0001 | 1 | 24 (400) | 2 | 5 / 48 | 0.460 (0.155) | 0.21 | 0.004 | 0.560 | +0.060 [+0.030, +0.090] | +0.130 (ahead by 0.070) "
            "| 0.81 | 7 of 40 |") in text
    assert ("| grpo | 0.3 | 4 | 3e-05 | 1 | 24 (400) | - | 5 / 48 | 0.460 (0.155) | 0.21 | 0.004 | 0.520 | +0.020 [-0.010, +0.050] | +0.060 "
            "| 0.81 | 7 of 40 |") in text
    assert "| grpo | 0.3 | 4 | 3e-05 | 2 | 24 (400) |" in text
    assert "| sft on picks | 0.7 | 4 | 0.001 | - | 24 (400) | - | 5 / 48 | 0.460 (0.155) | 0.21 | - | 0.530 |" in text
    assert "| 0.7 | 4 | 0.60 [0.45, 0.72] (48) | 0.511 | 0.618 | 0.645 | 0.503 |" in text
    assert "| 0.3 | 4 | - (1) | 0.500 | 0.500 | 0.500 | 0.503 |" in text
    assert "gate's eval split" not in text  # measured on the test rows alone
    older = table({**{k: v for k, v in results.items() if k != "group_sizes"}, "group_size": 4, "epochs": 2.0,
                   "arms": results["arms"][:1]})  # results from before passes, then group sizes, were arms
    assert "(4 samples each, passes over them: 2)" in older and "| grpo | 0.7 | 4 | 0.0001 | 2 | 24 (400) |" in older
    sized = table({**results, "group_sizes": [4, 8], "arms": [results["arms"][0], {**results["arms"][0], "group_size": 8}],
                   "groups_check": [{**results["groups_check"][0], "group_size": size} for size in (4, 8)]})
    assert "(4 or 8 samples each, passes over them: 1, 2)" in sized
    assert "| grpo | 0.7 | 8 | 0.0001 | 1 | 24 (400) | 2 |" in sized and "| 0.7 | 8 | 0.60 [0.45, 0.72] (48) |" in sized
    credited = table({**results, "arms": [{**results["arms"][0], "advantage": "sum"}, {**results["arms"][0], "advantage": "fields"}]})
    assert "| grpo | 0.7 | 4 | 0.0001 | 1 | 24 (400) |" in credited and "| grpo (fields) | 0.7 | 4 | 0.0001 | 1 | 24 (400) |" in credited
    bonus = table({**results, "arms": [{**results["arms"][0], "entropy_coef": 0.0}, {**results["arms"][0], "entropy_coef": 0.02},
                                       {**results["arms"][0], "advantage": "gdpo", "entropy_coef": 0.005},
                                       {**results["arms"][0], "beta": 0.1}, {**results["arms"][0], "beta": 0.0}]})
    assert "| grpo | 0.7 | 4 | 0.0001 | 1 | 24 (400) |" in bonus and "| grpo (entropy 0.02) | 0.7 | 4 | 0.0001 | 1 | 24 (400) |" in bonus
    assert "| grpo (gdpo, entropy 0.005) | 0.7 |" in bonus
    assert "| grpo (KL to base 0.1) | 0.7 |" in bonus and bonus.count("| grpo | 0.7 | 4 | 0.0001 | 1 | 24 (400) |") == 2

    gated = {"mean": -0.01, "ci95": [-0.05, 0.03], "n": 32}
    text = table({**results, "gate_rows": 32, "base_on_gate_rows": {"mean": 0.28},
                  "arms": [{**a, "gain_on_gate_rows": gated} for a in results["arms"]]})
    assert "On the first 32 rows of the gate's eval split (the base model: 0.280), beside the test rows:" in text
    assert "| grpo | 0.7 | 4 | 0.0001 | 1 | +0.060 [+0.030, +0.090] | -0.010 [-0.050, +0.030] |" in text
    assert "| sft on picks | 0.7 | 4 | 0.001 | - | +0.030 [+0.000, +0.060] | -0.010 [-0.050, +0.030] |" in text


def test_bench_grpo_gains_group_check_scores_each_groups_samples_with_its_rows_reference():
    """The served score's pick is the sample it ranks first, scored with the reference; a group
    whose samples are all alike ranks nothing and is left out of the rank correlation."""
    from bench.grpo import Decoded
    from bench.grpo_gain import group_check, served_totals
    from common.records import RewardContext
    from tasks import score, typed_input

    reference = {"sentiment": "negative", "sentiment_score": 1.0, "complaint_category": "delivery_delay",
                 "product_mentioned": "mochila escolar", "delivery_issue": True, "would_recommend": False, "urgency": "high",
                 "key_phrases": ["ainda não chegou"], "summary": "Pedido atrasado.", "requires_response": True}
    review = {"review": "A mochila escolar ainda não chegou. Não recomendo."}
    context = RewardContext(typed_input("extraction", review))
    texts = [json.dumps(answer, ensure_ascii=False) for answer in (
        {**reference, "sentiment": "positive", "sentiment_score": 5.0, "would_recommend": True, "complaint_category": "none"},
        reference, "não sei", {**reference, "product_mentioned": None, "key_phrases": []})]
    rows = [{"id": "r1", "input": review, "reference": reference}, {"id": "r2", "input": review, "reference": reference}]
    groups = [RolloutGroup(key=f"group:{row['id']}", source=row["id"], version="base", temperature=0.7, prompt_token_ids=[3],
                           completion_ids=[[4]] * 4, logprobs=[[-1.0]] * 4, reference="", context=context.to_json()) for row in rows]
    alike = [texts[1]] * 4
    greedy = [score("extraction", texts[2], reference, context), score("extraction", texts[1], reference, context)]
    decoded = {"group:r1": Decoded("prompt", texts), "group:r2": Decoded("prompt", alike)}
    out = group_check("extraction", rows, groups, decoded, {g.key: served_totals("extraction", g, decoded[g.key].samples) for g in groups}, greedy)

    with_reference = [score("extraction", text, reference, context).total for text in texts]
    served = [score("extraction", text, None, context).total for text in texts]
    first = served.index(max(served))
    assert with_reference[1] == pytest.approx(1.0)  # the reference itself
    assert out["best_sample"] == pytest.approx((1.0 + 1.0) / 2, abs=1e-4)
    assert out["served_pick"] == pytest.approx((with_reference[first] + 1.0) / 2, abs=1e-4)
    assert out["samples"] == pytest.approx((sum(with_reference) + 4 * 1.0) / 8, abs=1e-4)
    assert out["greedy"] == pytest.approx((greedy[0].total + 1.0) / 2, abs=1e-4)
    assert out["groups_ranked"] == 1 and out["within_group_rank_correlation"] is None  # one group is no interval
    with pytest.raises(ValueError):  # a row without its group is never paired with another's
        group_check("extraction", rows, groups[:1], decoded, {"group:r1": served_totals("extraction", groups[0], texts)}, greedy)


def test_the_picks_arms_spread_is_a_generation_batchs_std_as_trl_logs_it():
    """Two groups a batch: the std is over both groups' samples together (between-group spread
    included), averaged over batches; a last batch of one group is its own std."""
    import statistics

    from bench.grpo_gain import _batch_spread

    groups = [[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.2, 0.4, 0.2, 0.4]]
    first = statistics.stdev([0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert _batch_spread(groups, 2) == pytest.approx((first + statistics.stdev([0.2, 0.4, 0.2, 0.4])) / 2)
    assert _batch_spread(groups[1:2], 2) == 0.0


@pytest.mark.parametrize("args, option", [(["--gate-rows", "2"], "--gate-rows"), (["--gate-rows", "-1"], "--gate-rows"),
                                          (["--task", "insights"], "--task"), (["--epochs", "0"], "--epochs"),
                                          (["--temperature", "0"], "--temperature"), (["--group-size", "1"], "--group-size"),
                                          (["--group-size", "17"], "--group-size"), (["--advantage", "mean"], "--advantage"),
                                          (["--entropy-coef", "-0.01"], "--entropy-coef"), (["--entropy-coef", "2"], "--entropy-coef")])
def test_bench_grpo_gain_refuses_what_gives_no_measurement_before_anything_runs(tmp_path, args, option):
    """Too few gate rows for an interval, a task without references, no passes, greedy groups, a
    group of one or of more than 16, an advantage GRPO does not have, an entropy bonus below 0 or above
    1: a usage error naming the
    option, and nothing written."""
    from typer.testing import CliRunner

    from cli import main as cli

    result = CliRunner().invoke(cli.app, ["bench", "grpo-gain", *args], env={"TUCANO_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_group_of_eight_equal_rewards_is_flat_though_float32_centring_leaves_it_a_trace():
    """TRL centres rewards in float32: eight 0.15s minus their mean leave 1.5e-8, which an exact
    test took for signal (run 58 dropped none of SQL's 30 groups, every one at 0.15). A group that
    varies by the least a rounded total can (1e-4) is kept."""
    import torch

    from trainer.trl_internals import flat_groups

    rewards = torch.tensor([0.15] * 8 + [0.65] * 8 + [0.15] * 7 + [0.1501] + [0.0] * 8, dtype=torch.float32)
    centred = rewards - torch.nanmean(rewards.view(-1, 8), dim=1).repeat_interleave(8)  # as TRL 1.16 computes advantages
    assert centred[:8].abs().max() > 1e-8  # the trace the old test kept
    assert flat_groups(centred, 8).tolist() == [True, True, False, True]


def test_grpo_on_the_policys_own_samples_stops_after_batches_in_a_row_with_every_group_flat(monkeypatch):
    """Each generation batch counts towards the stop only when every group in it is flat, and a
    batch with any signal starts the count again; at `grpo_flat_batches_stop` in a row the run
    stops and says why, and 0 never stops it."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch
    from trl import GRPOTrainer

    from trainer import methods
    from trainer.grpo import NoSignalLeft
    from trainer.trl_internals import group_dropping_grpo_trainer

    flat, varied, half = [0.0] * 4, [0.1, -0.1, 0.0, 0.0], [0.0, 0.0, 0.2, -0.2]  # two groups of 2 a batch
    batches = iter([varied, flat, half, flat, flat, flat])
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions",
                        lambda self, inputs: {"advantages": torch.tensor(next(batches)), "completion_mask": torch.ones(4, 3)})
    cls = group_dropping_grpo_trainer()
    trainer = cls.__new__(cls)  # the counting alone: no model is needed
    trainer.num_generations, trainer.field_credit = 2, None
    trainer._metrics, trainer.accelerator = {"train": defaultdict(list)}, SimpleNamespace(gather=lambda t: t)
    stop, never = NoSignalLeft(trainer, 2), NoSignalLeft(trainer, 0)
    stopped = []
    for _ in range(5):
        trainer._generate_and_score_completions({})
        control = SimpleNamespace(should_training_stop=False)
        stop.on_step_end(None, None, control)
        never.on_step_end(None, None, SimpleNamespace(should_training_stop=False))
        stopped.append(control.should_training_stop)
    assert stopped == [False, False, False, False, True]  # the half-flat third batch started the count again
    assert (trainer.seen_groups, trainer.dropped_groups) == (10, 8) and not never.hit
    outcome = methods.TrainingRun("grpo", "why", 8, stopped_by="time budget")
    stop.said(outcome)
    assert outcome.stopped_by == "no signal: every group flat in 2 generation batches in a row"
    left = methods.TrainingRun("grpo", "why", 8)
    never.said(left)
    assert left.stopped_by == "epochs"
