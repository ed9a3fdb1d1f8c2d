"""The policy a round trains for one task: the task's model (the Base model, or the Think model
for insights) with the task's LoRA: the active version continued when the round says so
(`methods.start`; `PeftModel.from_pretrained(..., is_trainable=True)`), else a fresh LoRA (r=16, alpha=32 on every
linear projection, PRODUCT §8).

On a GPU the model is loaded in 4-bit NF4 (bitsandbytes, QLoRA) with bf16 compute, as the seed
project trained on one 24 GB L4; on a CPU in fp32 (the methods compute in bf16 autocast where the
CPU has bf16 arithmetic: `methods.bf16`).
"""
from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, AutoTokenizer


def on_gpu() -> bool:
    """Whether training runs on a GPU (torch sees one), the one place the trainer asks."""
    return torch.cuda.is_available()


def _base(model_path: str):
    if not on_gpu():
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(model_path, quantization_config=quantization, dtype=torch.bfloat16)
    return prepare_model_for_kbit_training(model)


def load_policy(model_path: str, parent_adapter: str | None, rank: int, alpha: int):
    model = _base(model_path)
    if parent_adapter:
        model = PeftModel.from_pretrained(model, parent_adapter, is_trainable=True)
    else:
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"  # generation batches
    return model, tokenizer


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
