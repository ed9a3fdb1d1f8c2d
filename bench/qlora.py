"""`tucano bench qlora`: what 4-bit NF4 (QLoRA) saves and costs while a round trains, side by side
with the full-precision base in one run: peak accelerator memory and seconds per optimisation
step for `TUCANO_TRAIN_QUANTIZATION=none` and `nf4`, through the trainer's own `policy.lora_model`.

The steps are the SFT step a round takes on a GPU (bf16 autocast, gradient checkpointing, AdamW on
the LoRA) on random token ids of a fixed length: memory and time depend on shapes, not on what
the weights or tokens are, so the model may be a real checkpoint or a shape built with random
weights (`--shape`), which lets a GPU machine with no copy of the weights measure it. It imports
only torch, transformers, peft and `trainer.policy`, so it also runs as
`python -m bench.qlora` where the rest of the project is not installed.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainer.policy import lora_model, on_gpu

SHAPES = {  # architectures measured without their weights (random initialisation)
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)),
    "qwen3-1.7b": ("qwen3", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)),
    "qwen3-8b": ("qwen3", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)),
}


def build_shape(name: str, directory: Path) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, values = SHAPES[name]
    config = AutoConfig.for_model(kind, **values)
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    del model
    return str(directory)


def measure(model_path: str, quantize: str, batch: int, length: int, steps: int, warmup: int) -> dict:
    device = "cuda" if on_gpu() else "cpu"
    if on_gpu():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    model = lora_model(model_path, None, rank=16, alpha=32, quantize=quantize, compute_bf16=True)
    if on_gpu():
        if quantize == "none":  # a 4-bit model is placed on the GPU as it loads
            model.to(device)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    loaded_s = time.perf_counter() - started
    loaded_bytes = torch.cuda.memory_allocated() if on_gpu() else 0
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    times, losses = [], []
    for step in range(warmup + steps):
        ids = torch.randint(0, vocab, (batch, length), generator=generator).to(device)
        began = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if on_gpu():
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - began)
            losses.append(float(loss))
    mean = statistics.fmean(times)
    half = 1.96 * statistics.stdev(times) / math.sqrt(len(times)) if len(times) > 1 else 0.0
    result = {"quantization": quantize, "seconds_per_step": round(mean, 4), "interval": [round(mean - half, 4), round(mean + half, 4)],
              "steps": steps, "load_seconds": round(loaded_s, 2), "loss_first": round(losses[0], 3), "loss_last": round(losses[-1], 3),
              "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    if on_gpu():
        result.update(loaded_gib=round(loaded_bytes / 2**30, 3), peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3),
                      peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 3))
    del model, optimizer
    return result


def run(model_path: str | None, shape: str | None, batch: int, length: int, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tucano-qlora-") as scratch:
        path = model_path or build_shape(shape, Path(scratch) / shape)
        rows = [measure(path, quantize, batch, length, steps, warmup) for quantize in ("none", "nf4")]
    device = torch.cuda.get_device_name(0) if on_gpu() else "cpu"
    return {"model": model_path or f"{shape} (random weights)", "device": device, "batch": batch, "length": length, "rows": rows}


def table(results: dict) -> str:
    lines = [f"{results['model']} on {results['device']}, batch {results['batch']} x {results['length']} tokens, LoRA r=16 on every "
             "linear layer, bf16 autocast, gradient checkpointing on a GPU", "",
             "| quantization | s/step [95%] | peak allocated GiB | weights loaded GiB | load s |", "|---|---|---|---|---|"]
    for row in results["rows"]:
        lines.append(f"| {row['quantization']} | {row['seconds_per_step']:.3f} [{row['interval'][0]:.3f}, {row['interval'][1]:.3f}] | "
                     f"{row.get('peak_allocated_gib', '-')} | {row.get('loaded_gib', '-')} | {row['load_seconds']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint directory (default: a shape with random weights)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="folder for qlora.json and qlora.md")
    args = parser.parse_args()
    results = run(args.model, args.shape, args.batch, args.length, args.steps, args.warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "qlora.json").write_text(json.dumps(results, indent=2))
    (args.out / "qlora.md").write_text(table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
