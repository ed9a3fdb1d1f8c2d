"""`tucano bench grpo`: what a GRPO step of a round costs, with each group's prompt run once
(`trainer/shared_prefix.py`, `with_shared_prompts`) and with TRL's own forward (every sample's
prompt run again), side by side on the same groups.

One vLLM engine (the task's model, as `serve` starts it) samples `--groups` groups of the task's
train rows as the gateway samples a served group (`n` completions in one request, with their
logprobs, at the task's group temperature); then a round's GRPO on served groups
(`trainer.grpo.train_on_groups`, the task's training settings, a fresh LoRA from the same seed)
trains on them for `--steps` steps in each arm, the arms taking turns `--repeats` times in this
one process (the engine idle meanwhile). Reported per arm: seconds per optimisation step (TRL's
own step time) with a 95% interval over steps, the trainer's tokens per second of optimisation,
and the ratio of the mean step times with a 95% interval (steps resampled on each side).
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

from common.datasets import load_split
from common.settings import Settings
from common.stats import mean_interval, ratio_interval
from tasks import TASK_ENGINE, model_path_of, training_settings
from trainer.data import RolloutGroup

ARMS = ("shared prompts", "TRL forward")


def group_rows(settings: Settings, task: str, count: int) -> list[dict]:
    """The train rows the groups are sampled from: the task's first `count`. One owner, so that
    whatever is compared with the groups (a base model's answers to their rows) reads the same rows."""
    return load_split(settings.datasets_dir, task, "train")[:count]


class Decoded(NamedTuple):
    """A sampled group as text: the rendered prompt and each sample as the engine decoded it."""
    prompt: str
    samples: list[str]


async def sample_groups(settings: Settings, task: str, url: str, count: int, temperature: float | None = None,
                        decoded: dict[str, Decoded] | None = None) -> list[RolloutGroup]:
    """One group for each of the task's first `count` train rows, sampled as the gateway samples a
    served group (at `temperature` where given, else the task's group temperature), scored later
    without a reference (traffic carries none). `decoded`, when given, receives each group as text
    under its key."""
    from router.engine_client import EnginePool
    from router.prompts import build_messages
    from tasks import definition, typed_input

    spec = definition(task)
    sampling = spec.sampling_for(settings.grpo_num_generations, {} if temperature is None else {"temperature": temperature})
    pool = EnginePool.for_task(settings, task, [url])
    try:
        if not await pool.check():
            raise RuntimeError(f"the engine at {url} is not healthy")
        gate = asyncio.Semaphore(4)

        async def one(i: int, row: dict) -> RolloutGroup:
            task_input = typed_input(task, row["input"])
            async with gate:
                prompt = pool.template.render(build_messages(task, task_input))
                samples = await pool.complete_group(prompt, None, sampling.override(seed=settings.seed + i), spec.json_schema)
            key = f"group:{row['id']}"
            if decoded is not None:
                decoded[key] = Decoded(prompt, [s.text for s in samples])
            return RolloutGroup(key=key, source=row["id"], version="base", temperature=sampling.temperature,
                                prompt_token_ids=list(samples[0].prompt_token_ids), completion_ids=[list(s.token_ids) for s in samples],
                                logprobs=[list(s.logprobs) for s in samples], reference="",
                                context=settings.reward_context(task_input).to_json())
        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(group_rows(settings, task, count)))))
    finally:
        await pool.close()


def _arm(settings: Settings, task: str, groups: list[RolloutGroup], share: bool) -> dict:
    """One arm's GRPO from a fresh LoRA: its step times and tokens per second."""
    from trainer import grpo, methods, trl_internals
    from trainer.policy import load_policy
    from trainer.shared_prefix import with_shared_prompts

    trl_internals.with_shared_prompts = with_shared_prompts if share else (lambda *args: None)
    try:
        model, tokenizer = load_policy(model_path_of(settings, task), None, settings.lora_rank, settings.lora_alpha, "none",
                                       methods.bf16(settings), methods.checkpointing(settings), settings.seed)
        outcome = grpo.train_on_groups(settings, model, tokenizer, task, groups, float("inf"), "bench grpo", policy="base")
    finally:
        trl_internals.with_shared_prompts = with_shared_prompts
    return {"steps": [round(entry["step_time"], 3) for entry in outcome.steps_log if "step_time" in entry],
            "tokens_per_s": outcome.grpo.optimisation_tokens_per_s, "loss": [entry["loss"] for entry in outcome.steps_log if "loss" in entry]}


def run(settings: Settings, task: str, groups: int, steps: int, repeats: int, say=print) -> dict:
    from deploy.vllm_server import local_engine, run_engines

    own = training_settings(settings, task)
    # a generation batch is `grpo_prompts_per_step` groups, optimised `grpo_iterations` times: `steps` steps need this many groups
    needed = -(-steps // own.grpo_iterations) * own.grpo_prompts_per_step
    own = own.model_copy(update={"grpo_max_epochs": 1.0, "grpo_max_batches": 0})  # batches of a fixed size: seconds per step compare
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-grpo-")))
        server = local_engine(TASK_ENGINE[task], model_path_of(own, task), "cpu", scratch,
                              settings.engine_cpu_precision)
        run_engines(stack, [server], say)
        sampled = asyncio.run(sample_groups(own, task, server.url, max(groups, needed)))
    sampled = [g for g in sampled if len({tuple(c) for c in g.completion_ids}) > 1][:needed]
    arms: dict[str, dict] = {arm: {"steps": [], "tokens_per_s": []} for arm in ARMS}
    losses: dict[str, list] = {}
    for repeat in range(repeats):
        for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
            measured = _arm(own, task, sampled, arm == ARMS[0])
            arms[arm]["steps"] += measured["steps"]
            arms[arm]["tokens_per_s"].append(measured["tokens_per_s"])
            losses.setdefault(arm, measured["loss"])
            say(f"{task} {arm}, repeat {repeat + 1}: {statistics.fmean(measured['steps']):.2f} s a step over {len(measured['steps'])} steps")
    out: dict = {"task": task, "groups": len(sampled), "group_size": own.grpo_num_generations, "repeats": repeats,
                 "prompts_per_step": own.grpo_prompts_per_step, "arms": {}}
    for arm, entry in arms.items():
        mean, low, high = mean_interval(entry["steps"])
        out["arms"][arm] = {"seconds_per_step": round(mean, 3), "ci95": [round(low, 3), round(high, 3)], "steps": len(entry["steps"]),
                            "optimisation_tokens_per_s": round(statistics.fmean(entry["tokens_per_s"]), 1)}
    ratio, low, high = ratio_interval(arms[ARMS[1]]["steps"], arms[ARMS[0]]["steps"])
    out["speedup"] = {"ratio": round(ratio, 3), "ci95": [round(low, 3), round(high, 3)]}
    out["same_losses"] = max(abs(a - b) for a, b in zip(losses[ARMS[0]], losses[ARMS[1]], strict=True)) if losses else None
    return out


def table(results: dict) -> str:
    lines = [f"GRPO on {results['groups']} served groups of {results['task']} ({results['group_size']} samples each, "
             f"{results['prompts_per_step']} a step), each arm {results['repeats']} times from a fresh LoRA:", "",
             "| arm | seconds per step [95%] | steps | optimisation tokens/s |", "|---|---|---:|---:|"]
    for arm, e in results["arms"].items():
        lines.append(f"| {arm} | {e['seconds_per_step']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}] | {e['steps']} | "
                     f"{e['optimisation_tokens_per_s']} |")
    s = results["speedup"]
    same = results["same_losses"]
    losses = ("the two arms' losses are the same" if same == 0 else
              f"the two arms' losses differ by at most {same:.2g} (bf16 autocast rounds the two orders apart)")
    lines.append(f"\nSteps {s['ratio']:.2f} times as fast with each prompt run once [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]; {losses}.")
    return "\n".join(lines)
