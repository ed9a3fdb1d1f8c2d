"""The bootstrap's brief supervised phase for a pretrained demo model: a LoRA on every linear
projection, trained on the `bootstrap` split of the four tasks (general rows only: never the
demo store's own), then merged into the weights. The model learns the tasks' output shapes and
the general cases; the store's own catalogue, categories, questions and campaigns are left for
the learning loop to learn from the team's labels.

Each step takes one task's examples (similar lengths, little padding), and the loss reads only
the answer's tokens, whose logits alone are computed (the LM head over the prompt is wasted work
on a CPU), in bf16 autocast over fp32 weights where `bf16` says so (a CPU with bf16 arithmetic:
about 0.6 of an fp32 step's time). Insights examples are rendered with the Think model's template (it opens `<think>`).
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from common.processes import peak_rss_gb
from router.prompts import build_messages

LORA_RANK, LORA_ALPHA = 32, 64
BATCH_SIZE = 8
MAX_TOKENS = 1024
CHECKPOINTING = True  # `tucano bench finetune`: 4.4 GB peak instead of 9.7, at 1.2x the seconds per step


def example_ids(tokenizer, template: str, task: str, row: dict, think: bool) -> tuple[list[int], int]:
    """A row as token ids (prompt, then answer and end of turn, cut at `MAX_TOKENS`) and its prompt's length."""
    prompt = tokenizer.apply_chat_template(build_messages(task, row["input"]), tokenize=False, add_generation_prompt=True,
                                           chat_template=template)
    completion = row["target"].removeprefix("<think>\n") if think else row["target"]
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return (prompt_ids + completion_ids)[:MAX_TOKENS], len(prompt_ids)


def _batch(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(examples):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention[row, :len(ids)] = 1
        labels[row, prompt_len:len(ids)] = torch.tensor(ids[prompt_len:])
    return input_ids, attention, labels


def finetune(model_dir: Path, out_dir: Path | None, rows: dict[str, list[dict]], templates: dict[str, str], think_tasks: set[str],
             steps: int, lr: float, seed: int, bf16: bool, on_step: Callable[[int, float], None],
             checkpointing: bool = CHECKPOINTING) -> dict:
    """LoRA SFT of the checkpoint at model_dir on `rows` (per task), merged and saved at out_dir
    with the `base` template (None: not saved, as a benchmark runs it); returns what the manifest
    records. `checkpointing`: each layer's activations are recomputed in the backward pass instead
    of kept, so a step holds one layer's, not thirty's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules="all-linear", lora_dropout=0.0,
                                             task_type="CAUSAL_LM"))
    examples = {task: [example_ids(tokenizer, templates["think" if task in think_tasks else "base"], task, row, task in think_tasks)
                       for row in task_rows] for task, task_rows in rows.items() if task_rows}
    tasks = sorted(examples)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    inner = model.base_model.model
    if checkpointing:
        inner.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    losses, started = [], time.perf_counter()
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        task = tasks[step % len(tasks)]
        input_ids, attention, labels = _batch(rng.sample(examples[task], k=min(BATCH_SIZE, len(examples[task]))), pad_id)
        answer = labels[:, 1:] != -100
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = inner.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
            logits = inner.lm_head(hidden[:, :-1][answer])
        loss = torch.nn.functional.cross_entropy(logits.float(), labels[:, 1:][answer])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        on_step(step, losses[-1])
    if out_dir is not None:
        merged = model.merge_and_unload()
        merged.eval()
        out_dir.mkdir(parents=True, exist_ok=True)
        merged.save_pretrained(out_dir)
        tokenizer.chat_template = templates["base"]
        tokenizer.save_pretrained(out_dir)
    return {"sft_steps": steps, "sft_examples": sum(len(e) for e in examples.values()), "sft_seconds": round(time.perf_counter() - started, 1),
            "final_sft_loss": round(sum(losses[-len(tasks):]) / max(1, len(losses[-len(tasks):])), 4) if losses else None,
            "lora_rank_merged": LORA_RANK, "bf16": bf16, "checkpointing": checkpointing, "peak_rss_gb": peak_rss_gb()}
