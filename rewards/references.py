"""What a reference (or a user's correction) must be before anything stores it: the task's output
shape, exactly. A correction becomes training data (a supervised target, a chosen answer), so one
that is not a valid answer would teach the model to be wrong.

Each task's registry entry checks its references with one of these (`structured` against its
output model, `query`, `text`); `tasks.check_reference(task, value)` returns the reference in
its stored form or raises `InvalidReference` with a message that names the problem.
"""
from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from rewards.extraction import as_score
from rewards.sql_sandbox import check_readonly

MAX_INSIGHTS_ANSWER_CHARS = 8_000


class InvalidReference(ValueError):
    """The reference is not a valid answer of its task; the message says why."""


def _problems(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in error.errors()[:5])


def structured(task: str, model: type[BaseModel], value) -> dict:
    """A JSON answer, checked against the task's output model (a sentiment score "4,5" is understood)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidReference(f"a {task} reference is a JSON object, not text") from None
    if not isinstance(value, dict):
        raise InvalidReference(f"a {task} reference is a JSON object")
    if isinstance(value.get("sentiment_score"), str):
        value = {**value, "sentiment_score": as_score(value["sentiment_score"])}
    try:
        return model.model_validate(value, strict=False).model_dump()
    except ValidationError as error:
        raise InvalidReference(f"not a valid {task} answer: {_problems(error)}") from None


def query(task: str, field: str, value) -> dict:
    """One read-only SELECT, as text or under the task's answer field."""
    sql = value.get(field) if isinstance(value, dict) and set(value) == {field} else value
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidReference(f'a {task} reference is one SELECT, as text or {{"{field}": "..."}}')
    checked = check_readonly(sql.strip().rstrip(";"))
    if not checked.ok:
        raise InvalidReference(f"not a read-only SELECT: {checked.reason}")
    return {field: sql.strip().rstrip(";").strip()}


def text(task: str, value, max_chars: int = MAX_INSIGHTS_ANSWER_CHARS) -> str:
    """A written answer (insights): its text, within the answer limit."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidReference(f"an {task} reference is the answer's text")
    if len(value) > max_chars:
        raise InvalidReference(f"an {task} answer is at most {max_chars} characters")
    return value
