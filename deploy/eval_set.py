"""Reading a team's eval file (`tucano eval-set add FILE`): JSONL rows in the dataset format,
`{"task", "input", "reference"}` (an `id` is optional), every row checked before any is added.
The input must be what `/v1/tasks/{task}` accepts and the reference a valid answer of its task
(insights rows need none); a row that is not gets an error naming its line and the problem.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from common.datasets import input_hash
from rewards.references import InvalidReference
from tasks import INPUT_MODELS, TASKS, TRAITS, check_reference

MAX_ROWS = 10_000


class EvalFileError(ValueError):
    """The file cannot be added; the message names the line and what is wrong."""


def _row(number: int, line: str) -> tuple[str, str, dict]:
    try:
        row = json.loads(line)
    except ValueError as error:
        raise EvalFileError(f"line {number}: not JSON ({error})") from None
    if not isinstance(row, dict):
        raise EvalFileError(f"line {number}: a row is a JSON object")
    unknown = set(row) - {"id", "task", "input", "reference", "target", "pattern"}
    if unknown:
        raise EvalFileError(f"line {number}: unknown fields {sorted(unknown)}")
    task = row.get("task")
    if task not in TASKS:
        raise EvalFileError(f"line {number}: task must be one of {', '.join(TASKS)}, not {task!r}")
    try:
        task_input = INPUT_MODELS[task].model_validate(row.get("input")).model_dump(exclude_none=True)
    except ValidationError as error:
        problems = "; ".join(f"input.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()[:3])
        raise EvalFileError(f"line {number}: {problems}") from None
    reference = row.get("reference")
    if reference is None and TRAITS[task].scored_with_reference:
        raise EvalFileError(f"line {number}: a {task} eval row needs a reference")
    try:
        reference = check_reference(task, reference) if reference is not None else None
    except InvalidReference as error:
        raise EvalFileError(f"line {number}: reference: {error}") from None
    digest = input_hash(task, task_input)
    return task, digest, {"id": str(row.get("id") or f"file-{digest[:12]}"), "task": task, "input": task_input, "reference": reference}


def read_eval_file(path: str | Path) -> dict[str, dict[str, dict]]:
    """task -> input hash -> row, or EvalFileError for the first bad row (nothing is half-read)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise EvalFileError(f"cannot read it ({error})") from None
    rows: dict[str, dict[str, dict]] = {}
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise EvalFileError("no rows")
    if len(numbered) > MAX_ROWS:
        raise EvalFileError(f"{len(numbered)} rows, more than the {MAX_ROWS} one file may add")
    for number, line in numbered:
        task, digest, row = _row(number, line)
        rows.setdefault(task, {})[digest] = row
    return rows
