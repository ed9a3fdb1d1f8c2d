"""Build the two tiny local models of the Qwen3 architecture (`tucano bootstrap --tiny`): the
fastest stand-ins for the production Tucano2 Base and Think models, for tests that need a model
but not one that reads (the default demo model is a pretrained one: `demo.pretrained`).

Steps, each small enough for two CPU cores:
1. a byte-level BPE tokenizer trained with `tokenizers` on the rendered task corpus, with the
   ChatML specials and `<think>`/`</think>`, and a ChatML chat template (the Think model's
   template opens `<think>` for the assistant, as Qwen3 thinking models do);
2. a randomly initialised Qwen3ForCausalLM (hidden 128, 2 layers, vocab 4096);
3. a short language-model phase on the packed corpus, then a short supervised phase on the
   task train splits (loss on the assistant tokens only), so the models emit task-shaped text;
4. `save_pretrained` of model, tokenizer and an explicit generation config, so `transformers`
   and vLLM load them from the path.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from demo.templates import CHATML, CHATML_THINK
from router.prompts import build_messages
from tasks import typed_input

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]


def train_tokenizer(corpus: list[str], chat_template: str) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS + THINK_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2, show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], chat_template=chat_template,
    )
    fast.add_tokens(THINK_TOKENS)  # already in the vocab; registered as added, non-special tokens
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        rope_theta=1_000_000.0, tie_word_embeddings=True, torch_dtype="float32",
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3ForCausalLM(config)


def render_example(tokenizer: PreTrainedTokenizerFast, task: str, task_input: BaseModel, target: str,
                   think: bool) -> tuple[list[int], int]:
    """Token ids of prompt + completion and the prompt length; prompt and completion are
    tokenized apart, as vLLM sees them (the prompt alone, then generated tokens)."""
    prompt = tokenizer.apply_chat_template(build_messages(task, task_input), tokenize=False, add_generation_prompt=True)
    completion = target.removeprefix("<think>\n") if think else target
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return prompt_ids + completion_ids, len(prompt_ids)


def _batches(examples: list[tuple[list[int], int]], batch_size: int, max_len: int, rng: random.Random,
             pad_id: int, lm: bool):
    while True:
        batch = rng.sample(examples, k=min(batch_size, len(examples)))
        width = min(max_len, max(len(ids) for ids, _ in batch))
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (ids, prompt_len) in enumerate(batch):
            ids = ids[:width]
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(ids)] = torch.tensor(ids)
            if not lm:
                labels[row, :prompt_len] = -100
        yield input_ids, labels


def train(model: Qwen3ForCausalLM, examples: list[tuple[list[int], int]], steps: int, lr: float, seed: int,
          pad_id: int, lm: bool, on_step: Callable[[int, float], None]) -> float:
    """A plain AdamW loop with warm-up and cosine decay; returns the last loss."""
    if steps == 0:
        return float("nan")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    # SQL prompts carry the schema (~480 tokens): smaller supervised batches keep a step short.
    batches = _batches(examples, batch_size=16 if lm else 8, max_len=256 if lm else 768, rng=rng, pad_id=pad_id, lm=lm)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        for group in optimizer.param_groups:
            group["lr"] = lr * max(scale, 0.05)
        input_ids, labels = next(batches)
        loss = model(input_ids=input_ids, attention_mask=(input_ids != pad_id) | (labels != -100), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        on_step(step, loss_value)
    model.eval()
    return loss_value


def pack_corpus(tokenizer: PreTrainedTokenizerFast, texts: list[str], window: int = 256) -> list[tuple[list[int], int]]:
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.pad_token_id]
    return [(stream[i : i + window], 0) for i in range(0, max(1, len(stream) - window), window)]


def build_tiny_model(out_dir: Path, rows: list[dict], corpus: list[str], think: bool, seed: int,
                     lm_steps: int, sft_steps: int, on_step: Callable[[str, int, float], None]) -> dict:
    """Build, train and save one tiny model at out_dir; return what the manifest records."""
    timings = {}
    started = time.perf_counter()
    tokenizer = train_tokenizer(corpus, CHATML_THINK if think else CHATML)
    timings["tokenizer_s"] = round(time.perf_counter() - started, 2)

    model = build_model(tokenizer, seed)
    started = time.perf_counter()
    lm_loss = train(model, pack_corpus(tokenizer, corpus), lm_steps, lr=3e-3, seed=seed,
                    pad_id=tokenizer.pad_token_id, lm=True, on_step=lambda step, loss: on_step("lm", step, loss))
    timings["lm_s"] = round(time.perf_counter() - started, 2)

    started = time.perf_counter()
    examples = [render_example(tokenizer, r["task"], typed_input(r["task"], r["input"]), r["target"], think) for r in rows]
    sft_loss = train(model, examples, sft_steps, lr=2e-3, seed=seed + 1,
                     pad_id=tokenizer.pad_token_id, lm=False, on_step=lambda step, loss: on_step("sft", step, loss))
    timings["sft_s"] = round(time.perf_counter() - started, 2)

    model.generation_config = GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=256,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "lm_steps": lm_steps, "sft_steps": sft_steps, "sft_examples": len(examples),
        "final_lm_loss": round(lm_loss, 4), "final_sft_loss": round(sft_loss, 4),
        "bytes": sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file()),
        **timings,
    }
