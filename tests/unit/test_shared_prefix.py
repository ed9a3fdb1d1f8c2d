"""Shared-prefix training runs a batch's common prompt prefix once and gives the loss and the
gradients of the plain forward: for a LoRA model with TRL's fused head, and through the round's
SFT end to end (the same losses and the same trained weights with it and without it). The round's
SFT also validates only once its minimum steps are done, when an evaluation can stop it or keep its weights."""
from __future__ import annotations

import pytest

from common.settings import Settings
from trainer.data import SftExample

pytestmark = pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: torch and TRL are imported in the tests
VOCAB = 64


def lora_model(outputs: tuple[str, ...] = ("log_probs",)):
    import torch
    import trl.trainer.utils as trl_utils
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
    trl_utils.add_fused_lm_head(model, outputs=outputs)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    for name, param in model.named_parameters():  # LoRA B starts at zero: give the adapter a non-trivial value
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model


def batch() -> dict:
    """Three rows: a 20-token common prompt, then their own question, answer and right padding."""
    import torch

    generator = torch.Generator().manual_seed(3)
    common = torch.randint(2, VOCAB, (20,), generator=generator)
    rows, labels = [], []
    for question, answer in ((5, 6), (3, 9), (7, 2)):
        own = torch.randint(2, VOCAB, (question + answer,), generator=generator)
        ids = torch.cat([common, own])
        label = ids.clone()
        label[:20 + question] = -100
        rows.append(ids), labels.append(label)
    width = max(len(r) for r in rows)
    pad = lambda t, value: torch.cat([t, torch.full((width - len(t),), value)])
    return {"input_ids": torch.stack([pad(r, 0) for r in rows]), "labels": torch.stack([pad(label, -100) for label in labels]),
            "attention_mask": torch.stack([pad(torch.ones(len(r), dtype=torch.long), 0) for r in rows]),
            "position_ids": torch.stack([torch.arange(width)] * 3)}



def assert_same_gradients(plain_model, shared_model) -> None:
    """Every trainable parameter got the same gradient through both forwards (and there was one)."""
    import torch

    grads = 0
    for (name, p), (_, q) in zip(plain_model.named_parameters(), shared_model.named_parameters(), strict=True):
        if p.requires_grad:
            assert torch.allclose(p.grad, q.grad, atol=1e-5), name
            grads += 1
    assert grads > 0

def test_the_split_point_is_the_common_prefix_before_any_label():
    import torch

    from trainer.shared_prefix import split_point

    ids = torch.arange(40).repeat(2, 1)
    ids[1, 30:] += 1
    labels = torch.full_like(ids, -100)
    labels[:, 35:] = ids[:, 35:]
    assert split_point(ids, labels) == 30
    labels[0, 26:] = ids[0, 26:]  # a label inside the common part: cut before the state that predicts it
    assert split_point(ids, labels) == 25
    assert split_point(ids[:1], labels[:1]) == 0  # one row shares nothing
    ids[1, 10:] += 1
    assert split_point(ids, labels) == 0  # too short to be worth a second pass


def test_loss_and_gradients_are_the_plain_forwards():
    import torch

    from trainer.shared_prefix import with_shared_prefix

    inputs = batch()
    plain_model, shared_model = lora_model(), lora_model()
    plain = plain_model(**inputs, fused_lm_head=True)
    shared_inputs = with_shared_prefix(shared_model, inputs)
    assert shared_inputs["input_ids"].shape[1] == inputs["input_ids"].shape[1] - 20
    assert shared_inputs["attention_mask"].shape == inputs["attention_mask"].shape
    shared = shared_model(**shared_inputs, fused_lm_head=True)
    plain.loss.backward()
    shared.loss.backward()
    assert torch.allclose(plain.loss, shared.loss, atol=1e-5)
    assert int(plain.label_mask.sum()) == int(shared.label_mask.sum()) == 6 + 9 + 2
    assert_same_gradients(plain_model, shared_model)


def test_a_batch_that_shares_nothing_is_left_as_it_is():
    from trainer.shared_prefix import with_shared_prefix

    inputs = batch()
    inputs["input_ids"][1, 0] += 1
    assert with_shared_prefix(lora_model(), inputs) is inputs


def test_a_checkpointed_model_takes_the_plain_forward():
    """transformers drops the cache of a checkpointed layer, so a shared prefix would be lost."""
    from trainer.shared_prefix import with_shared_prefix

    model = lora_model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = batch()
    assert with_shared_prefix(model, inputs) is inputs


def grpo_batch() -> tuple:
    """Six rows as TRL's GRPO builds them, shuffled: two prompts of 22 and 30 tokens, left-padded,
    each with three completions of their own lengths, right-padded."""
    import torch

    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, VOCAB, (n,), generator=generator) for n in (22, 30)]
    rows = [(p, torch.randint(2, VOCAB, (c,), generator=generator)) for p in prompts for c in (4, 7, 2)]
    order = [3, 0, 5, 1, 4, 2]
    rows = [rows[i] for i in order]
    left, right = 30, 7
    ids = torch.stack([torch.cat([torch.zeros(left - len(p), dtype=torch.long), p, c, torch.zeros(right - len(c), dtype=torch.long)])
                       for p, c in rows])
    mask = torch.stack([torch.cat([torch.zeros(left - len(p)), torch.ones(len(p) + len(c)), torch.zeros(right - len(c))]).long()
                        for p, c in rows])
    return ids, mask, right


def test_grpos_prompts_run_once_give_the_plain_forwards_logprobs_entropies_and_gradients():
    """The plain forward is TRL's: every row whole, the completion's labels only."""
    import torch

    from trainer.shared_prefix import with_shared_prompts

    ids, mask, keep = grpo_batch()
    plain_model, shared_model = lora_model(("log_probs", "entropy")), lora_model(("log_probs", "entropy"))
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    plain = plain_model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    inputs = with_shared_prompts(shared_model, ids, mask, keep)
    assert inputs["input_ids"].shape == (6, keep + 1) and inputs["past_key_values"].get_seq_length() == ids.size(1) - keep - 1
    shared = shared_model(**inputs, fused_lm_head=True)
    completion = mask[:, -keep:].bool()
    assert torch.allclose(plain.log_probs[:, -keep:][completion], shared.log_probs[:, -keep:][completion], atol=1e-5)
    assert torch.allclose(plain.entropy[:, -keep:][completion], shared.entropy[:, -keep:][completion], atol=1e-5)
    (plain.log_probs[:, -keep:] * completion).sum().backward()
    (shared.log_probs[:, -keep:] * completion).sum().backward()
    assert_same_gradients(plain_model, shared_model)


def test_grpo_rows_whose_prompts_do_not_repeat_or_a_checkpointed_model_take_the_plain_forward():
    from trainer.shared_prefix import with_shared_prompts

    ids, mask, keep = grpo_batch()
    model = lora_model()
    assert with_shared_prompts(model, ids[[0, 1]], mask[[0, 1]], keep) is None  # one row of each prompt
    assert with_shared_prompts(model, ids, mask, ids.size(1) - 1) is None  # a one-token prompt: nothing before its last token
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert with_shared_prompts(model, ids, mask, keep) is None


@pytest.fixture
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w1"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="w2", pad_token="w0", unk_token="w1")


def test_the_rounds_sft_trains_the_same_weights_with_it_and_without_it(tokenizer, monkeypatch):
    import torch

    from trainer import sft, shared_prefix
    from trainer.shared_prefix import with_shared_prefix

    system = " ".join(f"w{3 + i % 50}" for i in range(24))
    examples = [SftExample(f"{system} w{10 + i} w{20 + i}", f"w{30 + i} w{40 + i} w{50 + i % 5}", f"r{i}") for i in range(8)]
    # fp32: the claim is exact arithmetic; bf16 autocast (auto on a CPU that has it) rounds the two orders differently
    settings = Settings(
        sft_batch_size=4, sft_min_steps=4, sft_max_epochs=1.0, train_learning_rate=1e-2, train_cpu_precision="fp32"
    )

    def trained(share: bool):
        calls = []

        def spy(model, inputs):
            shared = with_shared_prefix(model, inputs) if share else inputs
            calls.append(shared is not inputs)
            return shared

        monkeypatch.setattr(sft, "with_shared_prefix", spy)
        model = lora_model()
        outcome = sft.train(settings, model, tokenizer, examples, [], 600.0, "test")
        return outcome, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, calls

    shared_outcome, shared_weights, shared_calls = trained(True)
    plain_outcome, plain_weights, plain_calls = trained(False)
    assert shared_outcome.steps == plain_outcome.steps == 4
    assert all(shared_calls) and len(shared_calls) == 4 and not any(plain_calls)
    losses = lambda outcome: [s["loss"] for s in outcome.steps_log if "loss" in s]
    assert losses(shared_outcome) == pytest.approx(losses(plain_outcome), abs=1e-4)
    for name, value in plain_weights.items():
        assert torch.allclose(value, shared_weights[name], atol=1e-4), name
    assert shared_prefix.MIN_SHARED_TOKENS <= 24

    checkpointed = settings.model_copy(update={"train_gradient_checkpointing": True})
    model = lora_model()
    outcome = sft.train(checkpointed, model, tokenizer, examples, [], 600.0, "test")
    assert model.is_gradient_checkpointing and outcome.steps == 4
    assert losses(outcome) == pytest.approx(losses(plain_outcome), abs=1e-4)
    for name, value in model.named_parameters():
        if value.requires_grad:
            assert torch.allclose(value.detach(), plain_weights[name], atol=1e-4), name


def test_the_rounds_sft_validates_only_from_the_first_epoch_that_has_its_minimum_steps(tokenizer):
    """Before `sft_min_steps` an evaluation can neither stop training nor keep weights, so none runs."""
    from trainer import sft

    system = " ".join(f"w{3 + i % 50}" for i in range(24))
    examples = [SftExample(f"{system} w{10 + i}", f"w{30 + i} w{40 + i}", f"r{i}") for i in range(10)]
    validation = [SftExample(f"{system} w{20 + i}", f"w{35 + i} w{45 + i}", f"v{i}") for i in range(4)]
    settings = Settings(sft_batch_size=4, sft_min_steps=7, sft_max_epochs=5.0, train_learning_rate=1e-2, train_cpu_precision="fp32")
    assert sft.first_useful_evaluation(7, 4, 10) == 3  # 3 steps per epoch: epoch 2 ends at step 6, epoch 3 at step 9
    outcome = sft.train(settings, lora_model(), tokenizer, examples, validation, 600.0, "test")
    evaluated_at = [s["step"] for s in outcome.steps_log if "eval_loss" in s]
    assert outcome.steps == 15
    assert evaluated_at == [9, 12, 15]
