"""The policy a round trains for one task: the task's model (the Base model, or the Think model
for insights) with the task's LoRA: the active version continued when the round says so
(`methods.start`; `PeftModel.from_pretrained(..., is_trainable=True)`), else a fresh LoRA (r=16, alpha=32 on every
linear projection, contract §8).

With `TUCANO_TRAIN_QUANTIZATION=nf4` (the default on a GPU) the base model is loaded in 4-bit NF4
(bitsandbytes, double quantisation: QLoRA, as the seed project trained on one 24 GB L4) and made
trainable with PEFT's k-bit preparation; its compute dtype is bf16 on a GPU, and on a CPU the
precision the methods train in (`methods.bf16`). With `none` (the default on a CPU) it is loaded
in fp32 on a CPU, bf16 on a GPU.
"""
from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, AutoTokenizer


def on_gpu() -> bool:
    """Whether training runs on a GPU (torch sees one), the one place the trainer asks."""
    return torch.cuda.is_available()


class QuantizationUnavailable(RuntimeError):
    pass


def quantization(setting: str | None) -> str:
    """What TUCANO_TRAIN_QUANTIZATION means on this machine: nf4 or none."""
    return setting or ("nf4" if on_gpu() else "none")


def _base(model_path: str, quantize: str, compute_bf16: bool, checkpointing: bool):
    if quantize == "none":
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if on_gpu() else torch.float32)
    try:
        import bitsandbytes  # noqa: F401 - transformers' 4-bit loading needs it; say so here, by the setting's name
        from transformers import BitsAndBytesConfig
    except (ImportError, RuntimeError) as error:
        raise QuantizationUnavailable(f"TUCANO_TRAIN_QUANTIZATION=nf4 needs bitsandbytes, which cannot load here ({error}); "
                                      "set TUCANO_TRAIN_QUANTIZATION=none") from None
    compute = torch.bfloat16 if on_gpu() or compute_bf16 else torch.float32
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=compute)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, quantization_config=config, dtype=compute,
                                                     device_map={"": 0} if on_gpu() else {"": "cpu"})
    except (ImportError, RuntimeError, ValueError) as error:
        raise QuantizationUnavailable(f"TUCANO_TRAIN_QUANTIZATION=nf4: bitsandbytes could not load {model_path} in 4-bit "
                                      f"({error}); set TUCANO_TRAIN_QUANTIZATION=none") from None
    # peft turns checkpointing on here or never: the same choice as the trainer's arguments (`methods.checkpointing`)
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)


def lora_model(model_path: str, parent_adapter: str | None, rank: int, alpha: int, quantize: str = "none",
               compute_bf16: bool = False, checkpointing: bool | None = None, seed: int | None = None):
    """The base model (quantised or not) with the LoRA a round trains; `checkpointing` (None: on a
    GPU) is whether its training recomputes activations, which a 4-bit model must know as it loads.
    A new LoRA's initial weights are drawn from `seed`: unseeded, they came from whatever the
    process had drawn before, so the same labels and seed trained a different adapter depending on
    the trainings that ran before it in the process."""
    model = _base(model_path, quantize, compute_bf16, on_gpu() if checkpointing is None else checkpointing)
    if parent_adapter:
        return PeftModel.from_pretrained(model, parent_adapter, is_trainable=True)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    if seed is not None:
        torch.manual_seed(seed)
    return get_peft_model(model, config)


def load_policy(model_path: str, parent_adapter: str | None, rank: int, alpha: int, quantize: str = "none",
                compute_bf16: bool = False, checkpointing: bool | None = None, seed: int | None = None):
    model = lora_model(model_path, parent_adapter, rank, alpha, quantize, compute_bf16, checkpointing, seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"  # generation batches
    return model, tokenizer


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
