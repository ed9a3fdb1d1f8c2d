"""Extraction reward: one JSON object with the 10 fields of PRODUCT §2.

What is paid is the work of reading the review. Form (`format`: clean JSON vs wrapped vs
repaired; `schema`: share of fields present with a valid type and domain) is small and paid only
in proportion to the content, so a well-formed answer that says nothing of the review earns
almost nothing.

With a reference, `content` is field by field, weighted towards the fields that need the review
(product, key phrases, summary, category): exact for enums and booleans, a half-credit for an
adjacent sentiment, closeness within two points for the score, content-word overlap for the
phrases and the summary (function words earn nothing). A constant answer (each field's most
common value) scores well below a model that reads.

Without a reference, every component needs evidence from the review: `phrases` (short key
phrases found verbatim in it; none found is no credit), `summary` (a summary in its own words
that names what the review is about, not a copy of it), `product` (a product that the review
names), `sentiment_cue` (the sentiment agrees with the review's clear polarity words), and
`consistency` (sentiment, score, category, urgency and the booleans agree with each other; paid in
proportion to the evidence, like form).
"""
from __future__ import annotations

import math
import re

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
from rewards.text import META_WORDS, content_f1, content_words, fold, words

SENTIMENT_ORDER = {"negative": 0, "neutral": 1, "positive": 2}
WEIGHTS_WITH_REFERENCE = {"format": 0.05, "schema": 0.1, "content": 0.85}
WEIGHTS_WITHOUT_REFERENCE = {"format": 0.05, "schema": 0.1, "phrases": 0.3, "summary": 0.2, "product": 0.1,
                             "sentiment_cue": 0.15, "consistency": 0.1}
# How much each field weighs in `content`: the fields only a reader of the review gets right
# weigh most; the booleans, which a constant guesses right most of the time, least.
FIELD_WEIGHTS = {
    "sentiment": 1.0, "sentiment_score": 1.0, "complaint_category": 1.5, "product_mentioned": 1.5, "delivery_issue": 0.5,
    "would_recommend": 0.5, "urgency": 0.5, "key_phrases": 1.5, "summary": 1.5, "requires_response": 0.5,
}
assert set(FIELD_WEIGHTS) == set(EXTRACTION_FIELDS)
STEM = 5  # letters of a word compared when a summary's words are looked for in the review ("atraso", "atrasou")
MAX_PHRASE_WORDS = 8  # a key phrase is a short excerpt, not the review cut in pieces
# Polarity words of PT-BR reviews (folded): a review that has words of one side only has a clear
# polarity, which a reference-free answer's sentiment must agree with.
POSITIVE_CUES = frozenset("otimo otima excelente amei adorei perfeito perfeita recomendo indico superou rapida rapido "
                          "maravilhoso maravilhosa lindo linda gostei satisfeito satisfeita".split())
NEGATIVE_CUES = frozenset("defeito quebrado quebrada atraso atrasou atrasado errado errada faltou pessimo pessima ruim "
                          "horrivel nunca frageil fragil grosseiro estourado incompleto amassada rasgada".split())
NEGATED = re.compile(r"\bnao (recomendo|indico|chegou|funciona|liga|veio|gostei)\b")


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


def valid_fields(value: dict) -> list[str]:
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
    return 0.0 if p is None or e is None else max(0.0, 1.0 - abs(p - e) / 2.0)


def _product_credit(predicted, expected) -> float:
    if expected is None or predicted is None:
        return 1.0 if predicted is expected else 0.0
    return 1.0 if fold(str(predicted)) == fold(str(expected)) else content_f1(str(predicted), str(expected))


def _short(phrases: list[str]) -> list[str]:
    return [p for p in phrases if len(words(p)) <= MAX_PHRASE_WORDS]


def _phrases_credit(predicted, expected) -> float:
    """Content-word F1 of the short phrases (a whole sentence is no key phrase)."""
    p, e = _short(_phrases(predicted)), _phrases(expected)
    if not e:
        return 1.0 if not _phrases(predicted) else 0.5
    return content_f1(" ".join(p), " ".join(e))


def _summary_credit(predicted, expected) -> float:
    return content_f1(predicted, expected) if isinstance(predicted, str) and isinstance(expected, str) else 0.0


def _exact_credit(predicted, expected) -> float:
    return 1.0 if predicted == expected and type(predicted) is type(expected) else 0.0


FIELD_CREDITS = {
    "sentiment": _sentiment_credit, "sentiment_score": _score_credit, "product_mentioned": _product_credit,
    "key_phrases": _phrases_credit, "summary": _summary_credit,
}
CREDIT_PLAN = tuple((name, FIELD_CREDITS.get(name, _exact_credit), FIELD_WEIGHTS[name]) for name in EXTRACTION_FIELDS)
TOTAL_FIELD_WEIGHT = sum(FIELD_WEIGHTS.values())


# --- without a reference: evidence from the review ---------------------------------------

def _phrases_evidence(value: dict, review: str) -> tuple[float, str]:
    """Short phrases found verbatim in the review, chosen from it: phrases that cover most of the
    review's words are the review cut in pieces, not its key phrases."""
    phrases = _phrases(value.get("key_phrases"))
    if not phrases:
        return 0.0, "no key phrases"
    text = fold(review)
    found = [p for p in _short(phrases) if fold(p).strip() and fold(p) in text]
    coverage = sum(len(words(p)) for p in found) / max(1, len(words(review)))
    selective = 1.0 if coverage <= 0.7 else max(0.0, (1.0 - coverage) / 0.3)
    return len(found) / len(phrases) * selective, f"{len(found)}/{len(phrases)} short phrases found in the review, covering {coverage:.0%} of it"


def _copied_share(summary: str, review: str) -> float:
    """The share of the summary's word 4-grams that appear in the review: 1.0 is a copy."""
    s, r = words(summary), words(review)
    grams = {s[i:i + 4] for i in range(len(s) - 3)}
    if not grams:
        return 0.0
    review_grams = {r[i:i + 4] for i in range(len(r) - 3)}
    return len(grams & review_grams) / len(grams)


def _not_copied(summary: str, review: str) -> float:
    copied = _copied_share(summary, review)
    return 1.0 if copied <= 0.5 else max(0.0, (1.0 - copied) * 2.0)


def _summary_evidence(value: dict, review: str) -> tuple[float, str]:
    summary = value.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        return 0.0, "no summary"
    said = {w[:STEM] for w in content_words(summary) - META_WORDS}
    if not said:
        return 0.0, "the summary names nothing of the review"
    about = len(said & {w[:STEM] for w in content_words(review)}) / len(said)
    credit = min(1.0, 2.0 * about) * _not_copied(summary, review)
    return credit, f"{about:.0%} of its content words from the review, {_copied_share(summary, review):.0%} copied verbatim"


def _product_evidence(value: dict, review: str) -> tuple[float, str]:
    product = value.get("product_mentioned")
    if product is None:
        return 0.5, "no product named (cannot tell without a reference)"
    if isinstance(product, str) and product.strip() and fold(product) in fold(review):
        return 1.0, "the product is named in the review"
    return 0.0, "the product is not in the review"


def review_polarity(review: str) -> str | None:
    """'positive' or 'negative' when the review's polarity words are all of one side, else None."""
    folded = fold(review)
    cues = set(words(folded))
    negative = bool(cues & NEGATIVE_CUES) or bool(NEGATED.search(folded))
    positive = bool(cues & POSITIVE_CUES) and not NEGATED.search(folded)
    if positive == negative:
        return None
    return "positive" if positive else "negative"


def _sentiment_evidence(value: dict, review: str) -> tuple[float, str]:
    polarity = review_polarity(review)
    sentiment = value.get("sentiment")
    if sentiment not in SENTIMENTS:
        return 0.0, "no valid sentiment"
    if polarity is None:
        return 0.5, "the review's polarity is not clear"
    if sentiment == polarity:
        return 1.0, f"{sentiment}, as the review's words say"
    return (0.25, f"neutral for a {polarity} review") if sentiment == "neutral" else (0.0, f"{sentiment} for a {polarity} review")


def _consistency(value: dict) -> tuple[float, str]:
    sentiment, number, category = value.get("sentiment"), as_score(value.get("sentiment_score")), value.get("complaint_category")
    checks = []
    if sentiment in SENTIMENTS and number is not None:
        low, high = {"positive": (3.5, 5.0), "neutral": (2.0, 4.0), "negative": (1.0, 3.0)}[sentiment]
        checks.append(("score", low <= number <= high))
    if sentiment in SENTIMENTS and category in COMPLAINT_CATEGORIES:
        checks.append(("category", (category == "none") == (sentiment == "positive") or sentiment == "neutral"))
    if category in COMPLAINT_CATEGORIES and isinstance(value.get("delivery_issue"), bool):
        checks.append(("delivery", value["delivery_issue"] or category != "delivery_delay"))
    if sentiment in SENTIMENTS and "would_recommend" in value:
        checks.append(("recommend", value["would_recommend"] is not (sentiment == "negative")))
    if value.get("urgency") == "high" and isinstance(value.get("requires_response"), bool):
        checks.append(("urgency", value["requires_response"]))
    if not checks:
        return 0.0, "no fields to check"
    failed = [name for name, ok in checks if not ok]
    return 1.0 - len(failed) / len(checks), "fields agree" if not failed else f"disagree: {', '.join(failed)}"


EVIDENCE = (("phrases", _phrases_evidence), ("summary", _summary_evidence), ("product", _product_evidence),
            ("sentiment_cue", _sentiment_evidence))


def score(completion: str, reference: dict | None, context: dict, fields: dict | None = None) -> tuple[dict, dict, dict, object]:
    """`fields`, when given, receives each field's credit against the reference (0 for an answer
    that cannot be read), so the gate can compare fields one by one."""
    parsed = parse_json_object(completion)
    fmt, fmt_reason = format_score(parsed)
    value = parsed.value
    review = context.get("review")
    weights = WEIGHTS_WITH_REFERENCE if reference else WEIGHTS_WITHOUT_REFERENCE
    if value is None:
        if reference and fields is not None:
            fields.update(dict.fromkeys(EXTRACTION_FIELDS, 0.0))
        return dict.fromkeys(weights, 0.0), weights, {"format": fmt_reason}, None
    valid = valid_fields(value)
    extra = [k for k in value if k not in EXTRACTION_FIELDS]
    schema = max(0.0, len(valid) / len(EXTRACTION_FIELDS) - 0.05 * len(extra))
    details = {"format": fmt_reason,
               "schema": f"{len(valid)}/10 fields valid" + (f", unknown keys {extra[:3]}" if extra else "")}
    if reference:
        credits = {name: credit(value.get(name), reference.get(name)) for name, credit, _ in CREDIT_PLAN}
        if isinstance(review, str) and isinstance(value.get("summary"), str):  # a copy of the review is no summary
            credits["summary"] *= _not_copied(value["summary"], review)
        if fields is not None:
            fields.update(credits)
        content = sum(credits[name] * weight for name, _, weight in CREDIT_PLAN) / TOTAL_FIELD_WEIGHT
        misses = [f"{k}={v:.2f}" for k, v in credits.items() if v < 1.0]
        details["content"] = "all fields match" if not misses else "partial: " + ", ".join(misses)
        # form is paid in proportion to the content: a well-formed answer that is wrong earns little
        return {"format": fmt * content, "schema": schema * content, "content": content}, weights, details, value
    if not isinstance(review, str) or not review.strip():
        # nothing to find evidence in: only the form can be judged, and it is worth little alone
        details["evidence"] = "no review in context: nothing to ground the answer in"
        return {**dict.fromkeys(weights, 0.0), "format": fmt, "schema": schema}, weights, details, value
    components = {}
    for name, judge in EVIDENCE:
        components[name], details[name] = judge(value, review)
    evidence = (components["phrases"] + components["summary"]) / 2
    components["consistency"], details["consistency"] = _consistency(value)
    components["consistency"] *= evidence
    components["format"], components["schema"] = fmt * evidence, schema * evidence
    return components, weights, details, value
