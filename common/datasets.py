"""The task dataset format: JSONL files of rows `{"id", "task", "input", "reference", "target"}`
(`datasets/{task}/{split}.jsonl` under the data dir, and any eval file a team loads).
`input` is what a client sends to `/v1/tasks/{task}`, `reference` what rewards score against,
`target` a demonstration completion. The splits: `bootstrap` (what the demo model's bootstrap
SFT reads, and nothing else does), `train` (the demo team's traffic), `eval` (the gate's
bootstrap eval split), `test` (what `tucano bench learn` measures on; never sent as traffic),
`holdout` (general rows the bootstrap never reads: what the demo model does on rows like its own).

`input_key` is the one identity of an input: eval rows are held out by it, and labels are
assigned to the team's eval set by a stable hash of it.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

SPLITS = ("bootstrap", "train", "eval", "test", "holdout")


def load_split(datasets_dir: Path, task: str, split: str) -> list[dict]:
    path = Path(datasets_dir) / task / f"{split}.jsonl"
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def stored_input(task_input: BaseModel) -> dict:
    """A task input (its model) as records, labels and datasets store it: its fields, without the
    optional ones left unset (`tasks.typed_input` reads it back as the model)."""
    return task_input.model_dump(exclude_none=True)


def input_key(task_input: Mapping | BaseModel) -> str:
    """A canonical text of an input, stored or its model: equal inputs, whatever their key order, have equal keys."""
    stored = stored_input(task_input) if isinstance(task_input, BaseModel) else task_input
    return json.dumps(stored, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def input_hash(task: str, task_input: Mapping | BaseModel) -> str:
    """A stable hash of a task's input (the same on every machine and in every run)."""
    return hashlib.sha256(f"{task}\n{input_key(task_input)}".encode()).hexdigest()


def split_of(input_hash: str, eval_share: float) -> str:
    """`eval` for a fixed share of inputs, chosen by their hash: the same input always lands in the
    same split, on every machine, whenever it arrives."""
    return "eval" if int(input_hash[:12], 16) / 16**12 < eval_share else "train"
