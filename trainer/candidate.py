"""Training one task's candidate version in a round and registering it.

The methods of the task's plan (`methods.plan`) run one after the other on one LoRA, fresh or
continuing the task's active version or a rejected candidate (`methods.start`, `methods.continued`), each within its share of the task's
time budget. Files are written to a hidden `.partial` dir and renamed into place before the
version is registered (one atomic Redis step), so a round killed at any moment leaves either
nothing registered or a complete version; `clean_orphans` removes what a killed round left.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid

from safetensors import SafetensorError

from common.records import AdapterMeta, LogprobProbe
from common.rounds import TrainingData, TrainingRecord
from common.settings import Settings
from common.store import Store, content_sha256
from tasks import model_path_of, training_settings
from trainer import dpo, grpo, kto, methods, sft
from trainer.data import TaskData
from trainer.diagnostics import stop_conditions
from trainer.idle import engines_idle
from trainer.policy import load_policy, quantization, trainable_parameters
from trainer.probe import make_probe

# each method's share of the task's time budget (of what the plan's methods add up to)
BUDGET_SHARE = {"sft": 0.65, "dpo": 0.35, "kto": 0.35, "grpo": 0.5}


class AdapterWriteError(OSError):
    """A candidate's files could not be written (a full disk, a file-size limit); nothing was registered."""


def clean_orphans(settings: Settings) -> list[str]:
    """Remove the `.partial` dirs of rounds killed while writing. A complete dir that was never
    registered (killed between rename and registration) is left alone: it may be another
    deployment's, and deleting stored adapters is never a trainer's call."""
    if not settings.adapters_dir.is_dir():
        return []
    partial = [p for p in settings.adapters_dir.iterdir() if p.is_dir() and p.name.endswith(".partial")]
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in partial]


def _new_version(settings: Settings, store: Store, task: str) -> str:
    """The next version whose dir is free (a data dir reused with a fresh Redis keeps its old dirs)."""
    while True:
        version = store.next_adapter_version(task)
        if not (settings.adapters_dir / version).exists():
            return version


def run_plan(settings: Settings, model, tokenizer, data: TaskData, steps: list[tuple[str, str]], progress=None,
             engines: tuple[str, ...] = (), name_prefix: str = "rollout") -> list[methods.TrainingRun]:
    """The plan's methods in order. GRPO's rollouts: the served groups where traffic gave at least
    `grpo_min_groups` (completed to `grpo_num_generations` samples on the first of `engines`
    where they are smaller); else groups sampled on the first of `engines` (the task's, where a round
    runs beside them; reloads named from `name_prefix`); else the few served groups there are;
    else transformers' generate in the trainer. Each method's share of the time budget runs on
    while `engines` are idle, up to `train_idle_budget_factor` times it (`trainer.idle`)."""
    total_share = sum(BUDGET_SHARE[m] for m, _ in steps)
    outcomes = []
    idle = (lambda: engines_idle(list(engines))) if engines and settings.train_idle_budget_factor > 1 else None
    for method, why in steps:
        seconds = settings.train_time_budget_s * BUDGET_SHARE[method] / total_share
        budget = methods.Budget(seconds, idle, seconds * settings.train_idle_budget_factor)
        if method == "sft":
            outcomes.append(sft.train(settings, model, tokenizer, data.sft, data.validation, budget, why, progress))
        elif method == "dpo":
            outcomes.append(dpo.train(settings, model, tokenizer, data.pairs, budget, why, progress))
        elif method == "kto":
            outcomes.append(kto.train(settings, model, tokenizer, data.kto, budget, why, progress))
        elif len(data.groups) >= settings.grpo_min_groups or (data.groups and not (engines and data.prompts)):
            # the served groups are the rollouts: nothing is generated in the trainer
            outcomes.append(grpo.train_on_groups(settings, model, tokenizer, data.task, data.groups, budget, why, progress,
                                                 policy=data.policy, engine_url=engines[0] if engines else None,
                                                 name_prefix=name_prefix))
        elif engines and data.prompts:
            outcomes.append(grpo.train_on_engine(settings, model, tokenizer, data.task, data.prompts, engines[0], name_prefix, budget,
                                                 f"{why}; {len(data.groups)} served groups < {settings.grpo_min_groups}: "
                                                 f"its groups sampled on the engine {engines[0]}",
                                                 progress))
        else:  # no groups and no engine: the policy generates in the trainer (its report says so)
            outcomes.append(grpo.train(settings, model, tokenizer, data.task, data.prompts, budget,
                                       f"{why}; generated in the trainer: no engine to sample on", progress))
    return outcomes


def train_candidate(settings: Settings, store: Store, data: TaskData, steps: list[tuple[str, str]], round_id: str,
                    parent: AdapterMeta | None, progress=None, engines: tuple[str, ...] = ()) -> AdapterMeta:
    """Train and register a candidate, its LoRA fresh on the base model (`parent` None) or
    continuing `parent` (the task's active version, or the rejected candidate `methods.continued`
    chose); returns its metadata (status `candidate`). The task trains with its own
    `task_training` settings where it has any."""
    task = data.task
    settings = training_settings(settings, task)
    started = time.perf_counter()
    path = model_path_of(settings, task)
    quantize = quantization(settings.train_quantization)
    model, tokenizer = load_policy(path, parent.path if parent else None, settings.lora_rank, settings.lora_alpha, quantize,
                                   methods.bf16(settings), methods.checkpointing(settings), settings.seed)
    load_seconds = time.perf_counter() - started
    outcomes = run_plan(settings, model, tokenizer, data, steps, progress, engines, f"{task}-rollout-{round_id}-{uuid.uuid4().hex[:6]}")
    return register(settings, store, model, task, parent, round_id, outcomes, {"load": round(load_seconds, 2)}, quantize,
                    data.summary(), make_probe(model, tokenizer, data))


def register(settings: Settings, store: Store, model, task: str, parent: AdapterMeta | None, round_id: str,
             outcomes: list[methods.TrainingRun], seconds: dict[str, float], quantize: str = "none",
             data: TrainingData | None = None, probe: LogprobProbe | None = None) -> AdapterMeta:
    """Save a trained LoRA under a new version (written whole or not at all) and register it as a
    candidate with its hash, lineage (parent, round, base model), methods and steps: what a round
    and a benchmark that trains a version both register."""
    path = model_path_of(settings, task)
    version = _new_version(settings, store, task)
    final = settings.adapters_dir / version
    partial = settings.adapters_dir / f".{version}.partial"
    started = time.perf_counter()
    try:
        model.save_pretrained(partial)
    except (OSError, SafetensorError) as error:  # safetensors reports a full disk as its own error
        shutil.rmtree(partial, ignore_errors=True)  # leave nothing half-written behind
        raise AdapterWriteError(f"{version} could not be written to {settings.adapters_dir}: {error}") from None
    os.rename(partial, final)
    steps_by_method = {o.method: o.steps_log for o in outcomes}
    meta = AdapterMeta(
        version=version, task=task, path=str(final), parent=parent.version if parent else None, round=round_id,
        method="+".join(o.method for o in outcomes), base_model=path, sha256=content_sha256(final),
        trainable_parameters=trainable_parameters(model), data=data,
        training=TrainingRecord(quantization=quantize, methods=[o.summary() for o in outcomes], steps=steps_by_method,
                                seconds={**seconds, **{o.method: round(o.seconds, 2) for o in outcomes},
                                         "save": round(time.perf_counter() - started, 2)},
                                stop_conditions=stop_conditions(steps_by_method)),
        probe=probe,
    )
    store.put_adapter(meta)
    return meta
