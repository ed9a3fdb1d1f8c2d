"""Training one task's candidate version in a round and registering it.

The method is the setting (`grpo`, `dpo`, or `auto`: DPO where at least `min_dpo_pairs` pairs
exist, else GRPO). The policy continues from the task's active version, else starts from the
base model. Files are written to a hidden `.partial` dir and renamed into place before the
version is registered (one atomic Redis step), so a round killed at any moment leaves either
nothing registered or a complete version; `clean_orphans` removes what a killed round left.
"""
from __future__ import annotations

import os
import shutil
import time

from common.records import AdapterMeta
from common.store import Store, content_sha256
from trainer import methods
from trainer.data import TaskData
from trainer.policy import load_policy, trainable_parameters


def choose_method(setting: str, pairs: int, min_pairs: int) -> str:
    if setting == "auto":
        return "dpo" if pairs >= min_pairs else "grpo"
    return setting


def clean_orphans(settings) -> list[str]:
    """Remove the `.partial` dirs of rounds killed while writing. A complete dir that was never
    registered (killed between rename and registration) is left alone: it may be another
    deployment's, and deleting stored adapters is never a trainer's call."""
    if not settings.adapters_dir.is_dir():
        return []
    partial = [p for p in settings.adapters_dir.iterdir() if p.is_dir() and p.name.endswith(".partial")]
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in partial]


def _new_version(settings, store: Store, task: str) -> str:
    """The next version whose dir is free (a data dir reused with a fresh Redis keeps its old dirs)."""
    while True:
        version = store.next_adapter_version(task)
        if not (settings.adapters_dir / version).exists():
            return version


def train_candidate(settings, store: Store, task_data: TaskData, round_id: str, progress=None) -> AdapterMeta:
    """Train and register a candidate; returns its metadata (status `candidate`)."""
    task = task_data.task
    method = choose_method(settings.train_method, len(task_data.pairs), settings.min_dpo_pairs)
    if method == "dpo" and not task_data.pairs:
        raise ValueError(f"{task}: method dpo, but the round has no preference pairs")
    active = store.routes()[1].get(task, {}).get("active")
    parent = store.adapter(active) if active else None
    started = time.perf_counter()
    model, tokenizer = load_policy(settings.base_model_path, parent.path if parent else None,
                                   settings.lora_rank, settings.lora_alpha)
    load_seconds = time.perf_counter() - started
    if method == "grpo":
        result = methods.grpo(settings, model, tokenizer, task, task_data.prompts, progress)
    else:
        result = methods.dpo(settings, model, tokenizer, task, task_data.pairs, progress)
    version = _new_version(settings, store, task)
    final = settings.adapters_dir / version
    partial = settings.adapters_dir / f".{version}.partial"
    model.save_pretrained(partial)
    os.rename(partial, final)
    meta = AdapterMeta(
        version=version, task=task, path=str(final), parent=active, round=round_id, method=method,
        base_model=settings.base_model_path, sha256=content_sha256(final), trainable_parameters=trainable_parameters(model),
        data={"records": task_data.records, "first_entry": task_data.entry_ids[0] if task_data.entry_ids else None,
              "last_entry": task_data.entry_ids[-1] if task_data.entry_ids else None,
              "prompts": len(task_data.prompts), "pairs": len(task_data.pairs), "skipped": dict(task_data.skipped)},
        training={"steps": result.steps, "metrics": result.metrics, "seconds": {
            "load": round(load_seconds, 2), "generation": result.generation_seconds, "scoring": result.scoring_seconds,
            "optimisation": round(result.seconds - result.generation_seconds - result.scoring_seconds, 2),
            "train_total": round(result.seconds, 2)}, "completion_tokens": result.completion_tokens},
    )
    store.put_adapter(meta)
    return meta
