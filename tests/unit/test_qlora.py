"""QLoRA on a CPU (bitsandbytes 0.50 computes 4-bit NF4 there): with TUCANO_TRAIN_QUANTIZATION=nf4
the policy's base layers are 4-bit, a training step moves only the LoRA, the saved adapter holds
only LoRA weights in full precision (what vLLM loads), and a machine that cannot quantise says
which setting to change. The default follows the device."""
from __future__ import annotations

import builtins

import pytest

pytestmark = pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: torch and PEFT are imported in the tests


@pytest.fixture(scope="module")
def policy():
    from trainer import policy

    return policy


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen3 checkpoint with a tokenizer (the demo tokenizer's files are not needed: a
    byte-level one from the GPT-2 family is built from its vocab file here)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("tiny-qwen3")
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    vocab["<unk>"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<unk>").save_pretrained(path)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True))
    model.save_pretrained(path)
    return str(path)


def test_the_default_follows_the_device(policy, monkeypatch):
    monkeypatch.setattr(policy, "on_gpu", lambda: False)
    assert policy.quantization(None) == "none" and policy.quantization("nf4") == "nf4"
    monkeypatch.setattr(policy, "on_gpu", lambda: True)
    assert policy.quantization(None) == "nf4" and policy.quantization("none") == "none"


def test_nf4_trains_only_the_lora_on_4bit_base_layers_and_saves_a_full_precision_adapter(policy, checkpoint, tmp_path):
    import bitsandbytes as bnb
    import torch
    from safetensors.torch import load_file

    model, _ = policy.load_policy(checkpoint, None, rank=8, alpha=16, quantize="nf4", compute_bf16=False)
    four_bit = [name for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear4bit)]
    assert len(four_bit) == 2 * 7  # q, k, v, o, gate, up, down in each layer
    trainable = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    ids = torch.randint(0, 90, (2, 16), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    moved = [name for name, p in model.named_parameters() if p.requires_grad and not torch.equal(p, trainable[name])]
    assert moved and torch.isfinite(loss)
    model.save_pretrained(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved and all("lora_" in key for key in saved) and {t.dtype for t in saved.values()} == {torch.float32}


def test_a_4bit_model_checkpoints_exactly_when_the_round_will(policy, checkpoint):
    """peft decides as the 4-bit model loads: it follows `train_gradient_checkpointing` (through
    `methods.checkpointing`) rather than the machine alone."""
    from common.settings import load_settings
    from trainer import methods

    for setting in (True, False):
        model, _ = policy.load_policy(checkpoint, None, rank=8, alpha=16, quantize="nf4",
                                      checkpointing=methods.checkpointing(load_settings(train_gradient_checkpointing=setting)))
        assert model.base_model.model.is_gradient_checkpointing is setting


def test_without_bitsandbytes_nf4_names_the_setting(policy, checkpoint, monkeypatch):
    real_import = builtins.__import__

    def no_bitsandbytes(name, *args, **kwargs):
        if name == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    with pytest.raises(policy.QuantizationUnavailable, match=r"TUCANO_TRAIN_QUANTIZATION=nf4.*TUCANO_TRAIN_QUANTIZATION=none"):
        policy.load_policy(checkpoint, None, rank=8, alpha=16, quantize="nf4")


def test_bench_qlora_measures_both_quantizations_side_by_side(checkpoint):
    from bench import qlora

    results = qlora.run(checkpoint, None, batch=1, length=16, steps=2, warmup=1)
    none, nf4 = results["rows"]
    assert (none["quantization"], nf4["quantization"]) == ("none", "nf4")
    assert none["trainable_parameters"] == nf4["trainable_parameters"] > 0
    assert all(row["seconds_per_step"] > 0 and row["interval"][0] <= row["seconds_per_step"] <= row["interval"][1] for row in results["rows"])
    assert "| nf4 |" in qlora.table(results)


def test_a_new_lora_starts_from_its_seed_whatever_the_process_drew_before(policy, checkpoint):
    import torch

    def lora_weights(seed: int | None, drawn_before: int) -> dict:
        torch.rand(drawn_before)  # what earlier trainings in the process drew
        model = policy.lora_model(checkpoint, None, rank=8, alpha=16, seed=seed)
        return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_A" in name}

    first, second = lora_weights(7, 10), lora_weights(7, 1000)
    assert first and all(torch.equal(first[name], second[name]) for name in first)
    other = lora_weights(8, 10)
    assert not all(torch.equal(first[name], other[name]) for name in first)
    unseeded = lora_weights(None, 10), lora_weights(None, 10)
    assert not all(torch.equal(unseeded[0][name], unseeded[1][name]) for name in first)  # why the seed is passed
