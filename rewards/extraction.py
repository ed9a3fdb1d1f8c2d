"""Extraction reward: one JSON object with the 10 fields of PRODUCT §2.

Components: `format` (clean JSON vs wrapped vs repaired), `schema` (share of fields present
with a valid type and domain), then either `content` (field-by-field against a reference:
exact for enums and booleans, closeness for the score, overlap for phrases and summary) or,
without a reference, `grounding` (key phrases and product actually taken from the review).
"""
from __future__ import annotations

import math

from common.tasks import (
    COMPLAINT_CATEGORIES,
    EXTRACTION_FIELDS,
    MAX_KEY_PHRASES,
    MAX_SUMMARY_CHARS,
    SENTIMENT_SCORE_RANGE,
    SENTIMENTS,
    URGENCIES,
)
from rewards.parsing import format_score, parse_json_object
from rewards.text import fold, token_f1

SENTIMENT_ORDER = {"negative": 0, "neutral": 1, "positive": 2}
WEIGHTS_WITH_REFERENCE = {"format": 0.1, "schema": 0.2, "content": 0.7}
WEIGHTS_WITHOUT_REFERENCE = {"format": 0.2, "schema": 0.5, "grounding": 0.3}


def as_score(value) -> float | None:
    """A sentiment score as a float, PT-BR decimal comma understood ('4,5' is 4.5)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip().replace(",", "."))
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _valid_score(value) -> bool:
    number = as_score(value)
    return number is not None and SENTIMENT_SCORE_RANGE[0] <= number <= SENTIMENT_SCORE_RANGE[1]


def _short_text(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_SUMMARY_CHARS


def _valid_phrases(value) -> bool:
    return isinstance(value, list) and len(value) <= MAX_KEY_PHRASES and all(isinstance(p, str) and 0 < len(p) <= 120 for p in value)


# One check per field (a dispatch table: scoring runs tens of thousands of times per round).
FIELD_CHECKS = {
    "sentiment": lambda v: v in SENTIMENTS,
    "sentiment_score": _valid_score,
    "complaint_category": lambda v: v in COMPLAINT_CATEGORIES,
    "product_mentioned": lambda v: v is None or _short_text(v),
    "delivery_issue": lambda v: isinstance(v, bool),
    "would_recommend": lambda v: v is None or isinstance(v, bool),
    "requires_response": lambda v: isinstance(v, bool),
    "urgency": lambda v: v in URGENCIES,
    "key_phrases": _valid_phrases,
    "summary": _short_text,
}
assert set(FIELD_CHECKS) == set(EXTRACTION_FIELDS)


def _valid_fields(value: dict) -> list[str]:
    return [name for name, check in FIELD_CHECKS.items() if name in value and check(value[name])]


def _phrases(value) -> list[str]:
    return [p for p in value if isinstance(p, str)] if isinstance(value, list) else []


def _sentiment_credit(predicted, expected) -> float:
    if predicted == expected:
        return 1.0
    if isinstance(predicted, str) and predicted in SENTIMENT_ORDER and expected in SENTIMENT_ORDER:
        return 0.5 if abs(SENTIMENT_ORDER[predicted] - SENTIMENT_ORDER[expected]) == 1 else 0.0
    return 0.0


def _score_credit(predicted, expected) -> float:
    p, e = as_score(predicted), as_score(expected)
    return 0.0 if p is None or e is None else max(0.0, 1.0 - abs(p - e) / 4.0)


def _product_credit(predicted, expected) -> float:
    if expected is None or predicted is None:
        return 1.0 if predicted is expected else 0.0
    return 1.0 if fold(str(predicted)) == fold(str(expected)) else token_f1(str(predicted), str(expected))


def _phrases_credit(predicted, expected) -> float:
    p, e = _phrases(predicted), _phrases(expected)
    if not e:
        return 1.0 if not p else 0.5
    return token_f1(" ".join(p), " ".join(e))


def _summary_credit(predicted, expected) -> float:
    return token_f1(predicted, expected) if isinstance(predicted, str) and isinstance(expected, str) else 0.0


def _exact_credit(predicted, expected) -> float:
    return 1.0 if predicted == expected and type(predicted) is type(expected) else 0.0


FIELD_CREDITS = {
    "sentiment": _sentiment_credit, "sentiment_score": _score_credit, "product_mentioned": _product_credit,
    "key_phrases": _phrases_credit, "summary": _summary_credit,
}
CREDIT_PLAN = tuple((name, FIELD_CREDITS.get(name, _exact_credit)) for name in EXTRACTION_FIELDS)


def _grounding(value: dict, review: str | None) -> tuple[float, str]:
    if not review:
        return 1.0, "no review in context to ground against"
    text = fold(review)
    checks = [fold(p) in text for p in _phrases(value.get("key_phrases"))]
    product = value.get("product_mentioned")
    if isinstance(product, str):
        checks.append(fold(product) in text)
    if not checks:
        return 1.0, "nothing to ground"
    return sum(checks) / len(checks), f"{sum(checks)}/{len(checks)} phrases found in the review"


def score(completion: str, reference: dict | None, context: dict, fields: dict | None = None) -> tuple[dict, dict, dict, object]:
    """`fields`, when given, receives each field's credit against the reference (0 for an answer
    that cannot be read), so the gate can compare fields one by one."""
    parsed = parse_json_object(completion)
    fmt, fmt_reason = format_score(parsed)
    value = parsed.value
    if value is None:
        if reference and fields is not None:
            fields.update(dict.fromkeys(EXTRACTION_FIELDS, 0.0))
        components = {"format": 0.0, "schema": 0.0}
        components["content" if reference else "grounding"] = 0.0
        weights = WEIGHTS_WITH_REFERENCE if reference else WEIGHTS_WITHOUT_REFERENCE
        return components, weights, {"format": fmt_reason}, None
    valid = _valid_fields(value)
    extra = [k for k in value if k not in EXTRACTION_FIELDS]
    schema = max(0.0, len(valid) / len(EXTRACTION_FIELDS) - 0.05 * len(extra))
    details = {"format": fmt_reason,
               "schema": f"{len(valid)}/10 fields valid" + (f", unknown keys {extra[:3]}" if extra else "")}
    if reference:
        credits = {name: credit(value.get(name), reference.get(name)) for name, credit in CREDIT_PLAN}
        if fields is not None:
            fields.update(credits)
        components = {"format": fmt, "schema": schema, "content": sum(credits.values()) / len(credits)}
        misses = [f"{k}={v:.2f}" for k, v in credits.items() if v < 1.0]
        details["content"] = "all fields match" if not misses else "partial: " + ", ".join(misses)
        return components, WEIGHTS_WITH_REFERENCE, details, value
    grounding, why = _grounding(value, context.get("review"))
    details["grounding"] = why
    return {"format": fmt, "schema": schema, "grounding": grounding}, WEIGHTS_WITHOUT_REFERENCE, details, value
