"""The policy a round trains: the base model with the task's LoRA, continued from the active
version when there is one (`PeftModel.from_pretrained(..., is_trainable=True)`), else a fresh
LoRA (r=16, alpha=32 on every linear projection, PRODUCT §8). fp32 on CPU; bf16 on a GPU.
"""
from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer


def on_gpu() -> bool:
    """Whether training runs on a GPU (torch sees one), the one place the trainer asks."""
    return torch.cuda.is_available()


def load_policy(base_model: str, parent_adapter: str | None, rank: int, alpha: int):
    dtype = torch.bfloat16 if on_gpu() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
    if parent_adapter:
        model = PeftModel.from_pretrained(model, parent_adapter, is_trainable=True)
    else:
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    tokenizer.padding_side = "left"  # generation batches
    return model, tokenizer


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
