"""Insights reward, reference-free: PT-BR prose, structure (paragraphs, a list, a
recommendation), numbers grounded in the given data (no credit when no data was given) rows rather than invented, a sensible
length, and thinking efficiency (an unclosed `<think>` or reasoning that eats most of the
output costs reward). The answer is scored without its think block.
"""
from __future__ import annotations

import contextlib
import re

from rewards.parsing import split_think
from rewards.text import fold, ptbr_score

WEIGHTS = {"ptbr": 0.15, "structure": 0.2, "grounding": 0.3, "length": 0.1, "thinking": 0.25}
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.M)
CONCLUSION = ("recomend", "sugest", "conclus", "proximo passo", "acao", "portanto", "priorizar")


def read_number(token: str) -> set[float]:
    """Every reading of a number written in PT-BR or English style ("1.234,5", "17,60", "3.5")."""
    readings = set()
    for decimal, thousands in ((",", "."), (".", ",")):
        parts = token.split(decimal)
        if len(parts) > 2:
            continue
        whole = parts[0].replace(thousands, "")
        text = whole + ("." + parts[1] if len(parts) == 2 else "")
        with contextlib.suppress(ValueError):
            readings.add(float(text))
    return readings


def _data_values(context: dict) -> list[float]:
    values = []
    for row in context.get("rows") or []:
        for cell in row if isinstance(row, (list, tuple)) else (row.values() if isinstance(row, dict) else [row]):
            if isinstance(cell, (int, float)) and not isinstance(cell, bool):
                values.append(float(cell))
            elif isinstance(cell, str):
                values += [v for token in NUMBER.findall(cell) for v in read_number(token)]
    values += [v for token in NUMBER.findall(str(context.get("question", ""))) for v in read_number(token)]
    return values


def _grounded(reading: set[float], values: list[float]) -> bool:
    return any(abs(r - v) <= max(0.006 * abs(v), 0.011) for r in reading for v in values)


def grounding(answer: str, context: dict) -> tuple[float, str]:
    if not context.get("rows"):
        return 0.0, "no data rows given: nothing to ground in"
    values = _data_values(context)
    cited = [read_number(t) for t in NUMBER.findall(answer)]
    cited = [r for r in cited if r and not all(float(x).is_integer() and 0 <= x <= 12 for x in r)]  # counts, ordinals
    if not cited:
        return 0.3, "no figures from the data are cited"
    good = sum(_grounded(r, values) for r in cited)
    return good / len(cited), f"{good}/{len(cited)} figures found in the data"


def structure(answer: str) -> tuple[float, str]:
    lines = [line for line in answer.splitlines() if line.strip()]
    checks = {
        "paragraphs": len(lines) >= 2,
        "list": bool(LIST_ITEM.search(answer)),
        "recommendation": any(k in fold(answer) for k in CONCLUSION),
    }
    return sum(checks.values()) / len(checks), ", ".join(k for k, ok in checks.items() if ok) or "flat text"


def length(answer: str) -> float:
    n = len(answer)
    if n < 80:
        return n / 80
    if n <= 1500:
        return 1.0
    return max(0.0, 1.0 - (n - 1500) / 2500)


def thinking(think: str | None, closed: bool, answer: str) -> tuple[float, str]:
    if think is None:
        return 0.7, "no think block"
    if not closed:
        return 0.0, "think block never closed"
    share = len(think) / max(1, len(think) + len(answer))
    if share <= 0.6:
        return 1.0, f"thinking is {share:.0%} of the output"
    return max(0.0, 1.0 - (share - 0.6) / 0.35), f"thinking eats {share:.0%} of the output"


def score(completion: str, reference: dict | None, context: dict) -> tuple[dict, dict, dict, object]:
    thought = split_think(completion)
    answer = thought.answer
    components, details = {}, {}
    components["thinking"], details["thinking"] = thinking(thought.think, thought.closed, answer)
    if not answer:
        details["answer"] = "empty answer"
        return {"ptbr": 0.0, "structure": 0.0, "grounding": 0.0, "length": 0.0, **components}, WEIGHTS, details, answer
    components["ptbr"] = ptbr_score(answer)
    components["structure"], details["structure"] = structure(answer)
    components["grounding"], details["grounding"] = grounding(answer, context)
    components["length"] = length(answer)
    details["length"] = f"{len(answer)} characters"
    return components, WEIGHTS, details, answer
