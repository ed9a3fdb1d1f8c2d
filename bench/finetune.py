"""`tucano bench finetune`: the bootstrap's fine-tuning of the pretrained demo model
(`demo/finetune.py`, TRL's `SFTTrainer`) with and without gradient checkpointing, on its rows and
settings (LoRA r=32 on every linear layer, batch 8, at most 1024 tokens, the loss on the answer's
tokens only, learning rate 1e-3 with warm-up and cosine decay, bf16 autocast where the CPU
computes bf16), for a few steps each. (Until 2026-11-28 the bootstrap had a loop of its own; this
bench measured it against TRL, found TRL no slower and no larger, and the loop went.)

With `--task`, the arms are a round's SFT of that task instead (`trainer/sft.py` on the task's
model with a fresh LoRA, the task's own training settings, its `train` rows as the team's
labels, the shared prompt prefix where checkpointing allows it), which is what a round's process
holds at its peak.

Each arm runs in a fresh interpreter, so its peak resident memory (`ru_maxrss`) is its own; the
arms run one after the other on the same cores. Reported per arm: seconds per step after the
first (which pays for warm-up) with its interval over the steps, the peak memory, and the last
steps' loss.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tasks import model_path_of, training_settings

ARMS = ("plain", "checkpointing")


class StepClock:
    """Each step's seconds, taken at the end of every step (call it from the trainer's report)."""

    def __init__(self):
        self.times: list[float] = []
        self.last = time.perf_counter()

    def tick(self, *_) -> None:
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now

    def figures(self, losses: list[float]) -> dict:
        """What every arm reports: its steps, the first step's seconds, the seconds per step after it
        with their interval, the peak memory, and the loss of the last 4 steps."""
        from common.processes import peak_rss_gb
        from common.stats import mean_interval

        per_step, low, high = mean_interval(self.times[1:] or self.times)
        return {"steps": len(self.times), "first_step_s": round(self.times[0], 2), "seconds_per_step": round(per_step, 2),
                "seconds_per_step_interval": [round(low, 2), round(high, 2)], "peak_rss_gb": peak_rss_gb(),
                "last_loss": round(sum(losses[-4:]) / len(losses[-4:]), 4) if losses else None}


def measure(arm: str, steps: str, out_path: str) -> None:
    """One arm, in this interpreter: its figures as JSON in `out_path`."""
    import torch

    from common.processes import bf16_on_cpu
    from common.settings import load_settings
    from demo import finetune, pretrained
    from demo.bootstrap import FINETUNE_LR, training_rows
    from demo.templates import TEMPLATES
    from tasks import TASK_ENGINE, TASKS

    settings = load_settings()
    source = pretrained.SOURCES[settings.bootstrap_model]
    model_dir = settings.models_dir / f"pretrained-{source.name}"
    rows, templates = training_rows(settings, TASKS), TEMPLATES[source.chat]
    think_tasks = {t for t in TASKS if TASK_ENGINE[t] == "think"}
    bf16, n, checkpointing = bf16_on_cpu(settings.train_cpu_precision), int(steps), arm == "checkpointing"
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    clock, losses = StepClock(), []

    def on_step(step: int, loss: float) -> None:
        clock.tick()
        losses.append(loss)
    finetune.finetune(model_dir, None, rows, templates, think_tasks, n, FINETUNE_LR, settings.seed, bf16, on_step, checkpointing)
    Path(out_path).write_text(json.dumps({"arm": arm, **clock.figures(losses)}))


def measure_round(task: str, arm: str, steps: str, out_path: str) -> None:
    """One arm of a round's SFT of `task`, in this interpreter: its figures as JSON in `out_path`."""
    import torch

    from bench.learn import reference_examples
    from common.datasets import load_split
    from common.settings import load_settings
    from trainer import methods, sft
    from trainer.policy import load_policy

    n = int(steps)
    settings = training_settings(load_settings(), task).model_copy(update={
        "train_gradient_checkpointing": arm == "checkpointing", "sft_min_steps": n, "sft_max_epochs": 1e-6})
    rows = load_split(settings.datasets_dir, task, "train")[:n * settings.sft_batch_size]  # one epoch of n steps
    examples = reference_examples(settings, task, rows)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    model, tokenizer = load_policy(model_path_of(settings, task), None, settings.lora_rank, settings.lora_alpha, "none",
                                   methods.bf16(settings), seed=settings.seed)
    clock = StepClock()
    outcome = sft.train(settings, model, tokenizer, examples, [], float("inf"), "bench finetune", clock.tick)
    losses = [entry["loss"] for entry in outcome.steps_log if "loss" in entry]
    lengths = sorted(len(tokenizer(e.prompt + e.completion)["input_ids"]) for e in examples)
    Path(out_path).write_text(json.dumps({"arm": arm, "batch": settings.sft_batch_size, "tokens_median": lengths[len(lengths) // 2],
                                          "tokens_max": lengths[-1], **clock.figures(losses)}))


def run(settings, steps: int, arms: tuple[str, ...] = ARMS, say=print, task: str | None = None) -> dict:
    results = {"steps": steps, "bootstrap_model": settings.bootstrap_model, "task": task, "arms": []}
    measured = f"measure_round({task!r}, *sys.argv[1:])" if task else "measure(*sys.argv[1:])"
    for arm in arms:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            say(f"{arm}: {steps} steps")
            done = subprocess.run([sys.executable, "-c", f"import sys; from bench.finetune import measure, measure_round; {measured}",
                                   arm, str(steps), out.name], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"the {arm} arm failed (exit code {done.returncode}):\n{done.stderr[-2000:]}")
            results["arms"].append(json.loads(Path(out.name).read_text()))
            say(f"{arm}: {results['arms'][-1]}")
    return results


def _interval(arm: dict) -> str:
    low, high = arm.get("seconds_per_step_interval", (None, None))
    return f"[{low}, {high}]" if low is not None else ""


def table(results: dict) -> str:
    what = (f"a round's SFT of {results['task']} (batch {results['arms'][0]['batch']}, median {results['arms'][0]['tokens_median']} "
            f"tokens, longest {results['arms'][0]['tokens_max']})") if results.get("task") and results["arms"] else "the bootstrap's fine-tuning"
    lines = [f"{results['steps']} steps of {what} of {results['bootstrap_model']}, each arm in its own process:", "",
             "| arm | first step s | s per step after it [95%] | peak resident memory GB | loss of the last 4 steps |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {a['arm']} | {a['first_step_s']} | {a['seconds_per_step']} {_interval(a)} | {a['peak_rss_gb']} | {a['last_loss']} |"
              for a in results["arms"]]
    return "\n".join(lines)
