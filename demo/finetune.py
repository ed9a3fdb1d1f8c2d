"""The bootstrap's brief supervised phase for a pretrained demo model: a LoRA on every linear
projection, trained with TRL's `SFTTrainer` (as every round's SFT is) on the `bootstrap` split of
the four tasks (general rows only: never the demo store's own), then merged into the weights. The
model learns the tasks' output shapes and the general cases; the store's own catalogue,
categories, questions and campaigns are left for the learning loop to learn from the team's labels.

Each task gets an equal share of the examples the steps read (`equal_shares`), whatever its row
count: drawn in proportion (1,194 extraction rows, 884 push, 219 SQL, 76 insights) insights got
a thirtieth of the steps, and the demo model's insights fell below an answer that echoes the
question (`tucano bench trivial`, docs/results.md, 2026-11-28).

The loss reads only the answer's tokens, and only their logits are computed (the LM head over the
prompt is wasted work on a CPU: `trainer.trl_internals.project_labelled_positions_only`, as in
the rounds), in bf16 autocast over fp32 weights where `bf16` says so (a CPU with bf16
arithmetic: about 0.6 of an fp32 step's time). Insights examples are rendered with the Think
model's template (it opens `<think>`). Gradient checkpointing keeps one layer's activations, not
thirty's. This file had a training loop of its own until `tucano bench finetune` found TRL no
slower and no larger on the same rows and settings (docs/results.md, 2026-11-28).
"""
from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common.processes import peak_rss_gb
from router.prompts import build_messages
from tasks import typed_input

LORA_RANK, LORA_ALPHA = 32, 64
BATCH_SIZE = 8
MAX_TOKENS = 1024
MIN_LR_RATE = 0.1  # the cosine decay ends at a tenth of the peak rate, not at zero
CHECKPOINTING = True  # `tucano bench finetune`: 4.5 GB peak instead of 9.1, at 1.2-1.4x the seconds per step


def example_ids(tokenizer, template: str, task: str, row: dict, think: bool) -> tuple[list[int], int]:
    """A row as token ids (prompt, then answer and end of turn, cut at `MAX_TOKENS`) and its prompt's length."""
    prompt = tokenizer.apply_chat_template(build_messages(task, typed_input(task, row["input"])), tokenize=False, add_generation_prompt=True,
                                           chat_template=template)
    completion = row["target"].removeprefix("<think>\n") if think else row["target"]
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return (prompt_ids + completion_ids)[:MAX_TOKENS], len(prompt_ids)


def equal_shares(rows: dict[str, list[dict]], total: int, seed: int) -> list[tuple[str, dict]]:
    """`total` (task, row) pairs, each task with an equal share: its rows in a seeded random order,
    from the start again when a share is larger than the task's rows (the fewer its rows, the more
    epochs over them)."""
    rng = random.Random(seed)
    tasks = sorted(task for task, task_rows in rows.items() if task_rows)
    share = math.ceil(total / len(tasks))
    picked = []
    for task in tasks:
        order: list[dict] = []
        while len(order) < share:
            epoch = list(rows[task])
            rng.shuffle(epoch)
            order += epoch
        picked += [(task, row) for row in order[:share]]
    return picked


def _save(model, tokenizer, out_dir: Path | None, templates: dict[str, str]) -> None:
    """The model and its tokenizer at out_dir with the `base` template (None: not saved)."""
    if out_dir is None:
        return
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.chat_template = templates["base"]
    tokenizer.save_pretrained(out_dir)


def finetune(model_dir: Path, out_dir: Path | None, rows: dict[str, list[dict]], templates: dict[str, str], think_tasks: set[str],
             steps: int, lr: float, seed: int, bf16: bool, on_step: Callable[[int, float], None],
             checkpointing: bool = CHECKPOINTING) -> dict:
    """LoRA SFT of the checkpoint at model_dir on `rows` (per task, in equal shares, shuffled together), merged and
    saved at out_dir with the `base` template (None: not saved, as a benchmark runs it); calls
    `on_step(step, loss)` after each optimizer step; returns what the manifest records."""
    import datasets
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from trainer import trl_internals
    from trainer.methods import ReturnFreedMemory

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if steps == 0:  # TUCANO_BOOTSTRAP_SFT_STEPS=0: the pretrained weights as they are, saved as serving loads them
        _save(AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32"), tokenizer, out_dir, templates)
        return {"sft_steps": 0, "sft_examples": 0, "sft_seconds": 0.0, "final_sft_loss": None, "trainer": None,
                "lora_rank_merged": None, "bf16": bf16, "checkpointing": checkpointing, "peak_rss_gb": peak_rss_gb()}
    examples = []
    for task, row in equal_shares(rows, steps * BATCH_SIZE, seed):  # one epoch of these: every example read once
        ids, prompt = example_ids(tokenizer, templates["think" if task in think_tasks else "base"], task, row, task in think_tasks)
        examples.append({"input_ids": ids, "completion_mask": [0] * prompt + [1] * (len(ids) - prompt)})
    losses: list[float] = []

    class Report(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                on_step(state.global_step - 1, losses[-1])

    started = time.perf_counter()
    config = SFTConfig(output_dir=tempfile.mkdtemp(prefix="tucano-bootstrap-sft-"), max_steps=steps, per_device_train_batch_size=BATCH_SIZE,
                       learning_rate=lr, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": MIN_LR_RATE},
                       warmup_steps=max(1, math.ceil(steps / 20)), weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                       save_strategy="no", report_to="none", seed=seed, bf16=bf16, use_cpu=True, disable_tqdm=True,
                       dataloader_num_workers=0, gradient_checkpointing=checkpointing,
                       gradient_checkpointing_kwargs={"use_reentrant": False}, completion_only_loss=True, max_length=MAX_TOKENS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    lora = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    trl_internals.project_labelled_positions_only()
    datasets.disable_progress_bars()  # the bootstrap prints its own progress, one line a stage and every 10%
    trainer = SFTTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(examples), processing_class=tokenizer,
                         peft_config=lora, callbacks=[Report(), ReturnFreedMemory()])
    trainer.remove_callback(PrinterCallback)  # a dict per step on stdout otherwise
    trainer.train()
    _save(trainer.model.merge_and_unload(), tokenizer, out_dir, templates)
    last = losses[-len(rows):]
    return {"sft_steps": steps, "sft_examples": len(examples), "sft_seconds": round(time.perf_counter() - started, 1),
            "final_sft_loss": round(sum(last) / len(last), 4) if last else None, "trainer": "trl.SFTTrainer",
            "lora_rank_merged": LORA_RANK, "bf16": bf16, "checkpointing": checkpointing, "peak_rss_gb": peak_rss_gb()}
