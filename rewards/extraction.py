"""Extraction reward: one JSON object with the 10 fields of contract §2.

What is paid is the work of reading the review. Form (`format`: clean JSON vs wrapped vs
repaired; `schema`: share of fields present with a valid type and domain) is small and paid only
in proportion to the content, so a well-formed answer that says nothing of the review earns
almost nothing.

With a reference, `content` is field by field, weighted towards the fields that need the review
(product, key phrases, summary, category): exact for enums and booleans, a half-credit for an
adjacent sentiment, closeness within two points for the score, content-word overlap for the
phrases and the summary (function words earn nothing). A constant answer (each field's most
common value) scores well below a model that reads.

Without a reference, each field is checked against what the review's words say of it
(`rewards.review_cues`), and weighs what it weighs with a reference (`FIELD_JUDGES`): `phrases`
(key phrases are whole words of the review that carry a sentiment or complaint cue, covering its
cues; any other substring earns nothing), `summary` (in its own words, about the review, stating
its complaint or verdict and no complaint it does not make: the review's words shuffled or
reversed restate nothing), `product` (a whole noun phrase of the review, not a function word, a
generic word, a word of the purchase rather than of the item, a complaint, part of a cue or a
name cut short; null in full only where the review's words name nothing that could be one),
`sentiment_cue` and `score_cue` (the sentiment and the score range its words call for),
`category_cue` (the complaint category they name), `delivery_cue` (a late or missing delivery), `recommend_cue` (a recommendation, a refusal, or
null where it says neither), and `response_cue` and `urgency_cue` (a strong complaint that no
praise softens waits for an answer and is not of low urgency; any other review is low and waits
for none). A field the words say nothing of earns half. Form is paid in proportion to that
evidence. Version 7 paid the booleans, the score and the urgency inside one `consistency` share
of 0.2; a round's GRPO then traded `delivery_issue` against the other checks (run 46 in
docs/results.md), and the served score ranked a group's samples less like the references did.
Version 9 took any noun phrase of the review for the product ("data prevista", "material",
"entrega") and gave a null product half credit everywhere; on the base model's samples its product
judge ranked them as the references do at 0.54, against 0.91 under version 10's (docs/results.md,
2026-12-06).
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
from rewards import review_cues
from rewards.parsing import format_score, parse_json_object
from rewards.text import META_WORDS, STOP_WORDS, content_f1, content_words, fold, words

SENTIMENT_ORDER = {"negative": 0, "neutral": 1, "positive": 2}
WEIGHTS_WITH_REFERENCE = {"format": 0.05, "schema": 0.1, "content": 0.85}
# How much each field weighs in `content`: the fields only a reader of the review gets right
# weigh most; the booleans, which a constant guesses right most of the time, least.
FIELD_WEIGHTS = {
    "sentiment": 1.0, "sentiment_score": 1.0, "complaint_category": 1.5, "product_mentioned": 1.5, "delivery_issue": 0.5,
    "would_recommend": 0.5, "urgency": 0.5, "key_phrases": 1.5, "summary": 1.5, "requires_response": 0.5,
}
assert set(FIELD_WEIGHTS) == set(EXTRACTION_FIELDS)
STEM = 5  # letters of a word compared when a summary's words are looked for in the review ("atraso", "atrasou")
MAX_PHRASE_WORDS = 8  # a key phrase is a short excerpt, not the review cut in pieces
OWN_WORDS = 0.2  # the share of a summary's words not in the review for full credit (the references': 0.3-0.8)
# Words that never name what was bought: the nouns of the purchase (its delivery, dates, price,
# payment, service, packaging, material), the verbs of buying and receiving, discourse words and
# numbers. A "product" made only of them ("data prevista", "entrega", "pedi", "dois dias") names
# no item, and a review whose words outside its cues are all of them names none.
NOT_PRODUCT_WORDS = frozenset(fold(w) for w in (
    "data datas prevista previsto prazo prazos entrega entregas expectativa expectativas material qualidade tamanho "
    "cor cores modelo embalagem atendimento atendente vendedor vendedora site app aplicativo frete preço valor nota "
    "fiscal cartão pagamento boleto parcela parcelas dinheiro reembolso estorno rastreio semana semanas dia dias mês "
    "meses vez vezes coisa metade resposta problema suporte chamado fábrica retorno loja minha minhas meu meus "
    "pedi comprei recebi veio vieram chegou mandaram feito olha gente bom boa enfim sinceramente obrigado obrigada "
    "isso aqui tudo nada todo toda todos mundo ninguém nenhum nenhuma jeito pouco bem super depois parece item itens "
    "aguardo compro compraria abri informa dois duas três quatro cinco dez quinze vinte trinta").split())
# A null product on a review whose words could name one: likely wrong, never sure. At half credit
# (version 10's first form) a null was the safe answer, and GRPO's arm answered null on 39 of 40
# test rows (docs/results.md, 2026-12-06).
NULL_BESIDE_A_CANDIDATE = 0.25
# the review goes on with "de <noun>" right after a product name: the name was cut short
CUT_SHORT = re.compile(r"\s+(?:de|do|da)\s+(?!\d)\w{3,}")


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


# --- without a reference: the answer's claims checked against the review -------------------

def _span_in(phrase: str, folded_review: str) -> tuple[int, int] | None:
    """Where a phrase stands in the folded review as whole words, or None."""
    folded = fold(phrase).strip()
    match = re.search(rf"(?<!\w){re.escape(folded)}(?!\w)", folded_review) if folded else None
    return match.span() if match else None


def _phrases_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    """Key phrases are the review's own words (whole words, verbatim, short) that carry what it
    says: a sentiment or complaint cue. A substring without a cue is no key phrase, and phrases
    that miss most of the review's cues, or cover most of its words, are paid less."""
    phrases = _phrases(value.get("key_phrases"))
    if not phrases:
        return 0.0, "no key phrases"
    text = fold(review)
    found = [(p, span) for p in _short(phrases) if (span := _span_in(p, text))]
    carrying = [span for p, span in found if review_cues.has_cue(p)]
    precision = len(carrying) / len(phrases)
    cues = reading.cue_spans
    covered = sum(any(start <= s and e <= end for start, end in carrying) for s, e in cues)
    recall = covered / len(cues) if cues else 1.0
    coverage = sum(len(words(p)) for p, _ in found) / max(1, len(words(review)))
    selective = 1.0 if coverage <= 0.7 else max(0.0, (1.0 - coverage) / 0.3)
    credit = precision * (0.5 + 0.5 * recall) * selective
    return credit, (f"{len(carrying)}/{len(phrases)} phrases are the review's words with a cue, covering {covered}/"
                    f"{len(cues)} of its cues and {coverage:.0%} of its words")


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


def _own_words(summary: str, review: str) -> float:
    """A summary says the review in other words: one made only of the review's words, in any
    order (shuffled, reversed), restates nothing."""
    summary_words = words(summary)
    if not summary_words:
        return 0.0
    review_words = set(words(review))
    own = sum(w not in review_words for w in summary_words) / len(summary_words)
    return min(1.0, own / OWN_WORDS)


def _summary_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    """A summary in its own words, about what the review is about, that states the review's facts
    (its complaint, or its verdict when it has none) and no complaint the review does not make."""
    summary = value.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        return 0.0, "no summary"
    said = {w[:STEM] for w in content_words(summary) - META_WORDS}
    if not said:
        return 0.0, "the summary names nothing of the review"
    about = len(said & {w[:STEM] for w in content_words(review)}) / len(said)
    facts = set(reading.complaints)
    if reading.polarity in ("positive", "neutral") and not facts:
        facts.add(reading.polarity)
    spoken = review_cues.topics(summary)
    stated = 1.0 if not facts or facts & spoken else 0.3
    false = review_cues.complaints_said(summary) - reading.complaints
    truthful = 0.3 if false else 1.0
    own = _own_words(summary, review)
    # a summary is about the review when it shares its words, or states its facts in other words
    related = 1.0 if facts and facts & spoken else min(1.0, 2.0 * about)
    credit = related * _not_copied(summary, review) * own * stated * truthful
    return credit, (f"{about:.0%} of its content words from the review, {own:.0%} of the own-words share met, "
                    f"{'states' if stated == 1.0 else 'misses'} the review's facts {sorted(facts)}"
                    + (f", claims {sorted(false)} the review does not make" if false else ""))


def _naming_words(folded: str) -> frozenset[str]:
    """The content words of a folded text that could be part of a product's name."""
    return content_words(folded) - META_WORDS - NOT_PRODUCT_WORDS


def _product_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    """The product is a whole noun phrase of the review: whole words, at least one of them a
    content word that is not a generic one ("pedido", "produto") nor a word of the purchase
    ("entrega", "data prevista"), no article or preposition at either end, no sentiment or
    complaint cue and no part of one, and not cut short where the review goes on with "de <noun>"
    ("fone" of "fone de ouvido"). No product is right in full only where the review names
    nothing that could be one; elsewhere it is likely wrong (`NULL_BESIDE_A_CANDIDATE`)."""
    if "product_mentioned" not in value:
        return 0.0, "no product field"
    product = value.get("product_mentioned")
    if product is None:
        if not _naming_words(review_cues.without_cues(fold(review))):
            return 1.0, "no product named, and the review names nothing that could be one"
        return NULL_BESIDE_A_CANDIDATE, "no product named, though the review names what could be one"
    if not isinstance(product, str) or not product.strip():
        return 0.0, "not a product name"
    text, folded = fold(review), fold(product).strip(" .,;:!?")
    match = re.search(rf"(?<!\w){re.escape(folded)}(?!\w)", text)
    if match is None:
        return 0.0, "the product is not named, as whole words, in the review"
    product_words = words(folded)
    if not product_words or not (content_words(folded) - META_WORDS):
        return 0.0, "names nothing specific (a function word or a generic word)"
    if product_words[0] in STOP_WORDS or product_words[-1] in STOP_WORDS or len(product_words) > 6:
        return 0.25, "not a noun phrase: it starts or ends on a function word, or runs on"
    if review_cues.has_cue(folded):
        return 0.0, "a complaint or sentiment, not a product"
    if not _naming_words(folded):
        return 0.0, "names the purchase (its delivery, price, service, a date), not a product"
    if any(start < match.end() and match.start() < end for start, end in reading.cue_spans):
        return 0.0, "part of a complaint or verdict of the review, not a product"
    if CUT_SHORT.match(text[match.end():]):
        return 0.5, "cut short: the review's noun phrase goes on"
    return 1.0, "a noun phrase of the review"


SENTIMENT_CREDIT = {  # what the review's words call for -> credit of each sentiment
    "positive": {"positive": 1.0, "neutral": 0.25, "negative": 0.0},
    "negative": {"negative": 1.0, "neutral": 0.25, "positive": 0.0},
    "neutral": {"neutral": 1.0, "negative": 0.5, "positive": 0.25},
    "mixed": {"neutral": 1.0, "negative": 0.5, "positive": 0.5},
}


def _sentiment_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    sentiment = value.get("sentiment")
    if sentiment not in SENTIMENTS:
        return 0.0, "no valid sentiment"
    polarity = reading.polarity
    if polarity is None:
        return 0.5, "the review's words say nothing either way"
    credit = SENTIMENT_CREDIT[polarity][sentiment]
    return credit, f"{sentiment} for a review whose words are {polarity}"


def _category_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    """The complaint category is one the review's words make; "none" only for a review without
    a complaint."""
    category = value.get("complaint_category")
    if category not in COMPLAINT_CATEGORIES:
        return 0.0, "no valid category"
    if reading.complaints:
        credit = 1.0 if category in reading.complaints else 0.0
        return credit, f"{category}; the review complains of {sorted(reading.complaints)}"
    if reading.polarity in ("positive", "neutral"):
        return (1.0, "none, as the review complains of nothing") if category == "none" else \
            (0.0, f"{category}, a complaint the review does not make")
    return (0.5, "the review's words name no category") if category in ("none", "other") else \
        (0.25, f"{category}, which the review's words do not name")


# The sentiment score each verdict calls for (PT-BR reviews: 1 is the worst, 5 the best); a score
# outside the range loses its credit over two points, as the reference's closeness does.
SCORE_RANGES = {"negative": (1.0, 2.0), "mixed": (2.5, 3.5), "neutral": (2.5, 3.5), "positive": (4.0, 5.0)}


def _score_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    if not _valid_score(value.get("sentiment_score")):
        return 0.0, "no valid sentiment score"
    number = as_score(value["sentiment_score"])
    if reading.polarity is None:
        return 0.5, "the review's words say nothing either way"
    low, high = SCORE_RANGES[reading.polarity]
    off = max(low - number, number - high, 0.0)
    return max(0.0, 1.0 - off / 2.0), f"{number:g} for a review whose words are {reading.polarity} ({low:g}-{high:g})"


def _decided(value, expected: bool | None, decided: bool, name: str, said: tuple[str, str]) -> tuple[float, str]:
    """A boolean field against what the review's words say of it (`said`: how a review that does,
    and one that does not, reads); half credit where they say nothing."""
    if not isinstance(value, bool):
        return 0.0, f"no valid {name}"
    if not decided:
        return 0.5, "the review's words say nothing either way"
    return float(value is expected), f"{value} for a review that {said[0] if expected else said[1]}"


def _delivery_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    return _decided(value.get("delivery_issue"), reading.delivery_problem, reading.says_something, "delivery_issue",
                    ("complains of a late or missing delivery", "makes no delivery complaint"))


def _response_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    return _decided(value.get("requires_response"), reading.needs_answer, reading.says_something, "requires_response",
                    ("makes a strong complaint no praise softens", "makes no unsoftened strong complaint"))


def _recommend_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    """null is "not said": a review that does not say gets null."""
    if "would_recommend" not in value or not FIELD_CHECKS["would_recommend"](value["would_recommend"]):
        return 0.0, "no valid would_recommend"
    said = {True: "recommends", False: "does not recommend", None: "does not say"}[reading.recommends]
    return float(value["would_recommend"] is reading.recommends), f"{value['would_recommend']} for a review that {said}"


def _urgency_evidence(value: dict, review: str, reading: review_cues.Reading) -> tuple[float, str]:
    """Low for a review that waits for no answer; medium or high for one that does."""
    urgency = value.get("urgency")
    if urgency not in URGENCIES:
        return 0.0, "no valid urgency"
    if not reading.says_something:
        return 0.5, "the review's words say nothing either way"
    right = (urgency == "low") is not reading.needs_answer
    return float(right), f"{urgency} for a review that {'waits' if reading.needs_answer else 'does not wait'} for an answer"


# Without a reference, each field is judged by what the review's words say of it (its judge below)
# and weighs what it weighs with one: the two scores pay the same fields in the same proportions.
FIELD_JUDGES = {
    "sentiment": ("sentiment_cue", _sentiment_evidence), "sentiment_score": ("score_cue", _score_evidence),
    "complaint_category": ("category_cue", _category_evidence), "product_mentioned": ("product", _product_evidence),
    "delivery_issue": ("delivery_cue", _delivery_evidence), "would_recommend": ("recommend_cue", _recommend_evidence),
    "urgency": ("urgency_cue", _urgency_evidence), "key_phrases": ("phrases", _phrases_evidence),
    "summary": ("summary", _summary_evidence), "requires_response": ("response_cue", _response_evidence),
}
assert set(FIELD_JUDGES) == set(EXTRACTION_FIELDS)
WEIGHTS_WITHOUT_REFERENCE = {"format": WEIGHTS_WITH_REFERENCE["format"], "schema": WEIGHTS_WITH_REFERENCE["schema"],
                             **{name: round(WEIGHTS_WITH_REFERENCE["content"] * FIELD_WEIGHTS[field] / TOTAL_FIELD_WEIGHT, 6)
                                for field, (name, _) in FIELD_JUDGES.items()}}



def valid(output) -> bool:
    """Every field present and each within its type and range, whatever they say."""
    return isinstance(output, dict) and set(output) == set(EXTRACTION_FIELDS) and len(valid_fields(output)) == len(output)


def score(completion: str, reference: dict | None, review: str | None, fields: dict | None = None) -> tuple[dict, dict, dict, object]:
    """`review`: the request's review (None: scored without it); `fields`, when given, receives each field's credit against the reference (0 for an answer
    that cannot be read), so the gate can compare fields one by one."""
    parsed = parse_json_object(completion)
    fmt, fmt_reason = format_score(parsed)
    value = parsed.value
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
    reading = review_cues.read(review)
    components = {}
    for name, judge in FIELD_JUDGES.values():
        components[name], details[name] = judge(value, review, reading)
    evidence = sum(components[name] * weights[name] for name, _ in FIELD_JUDGES.values()) / WEIGHTS_WITH_REFERENCE["content"]
    # form is paid in proportion to the evidence, as with a reference in proportion to the content
    components["format"], components["schema"] = fmt * evidence, schema * evidence
    return components, weights, details, value


def field_shares(components: dict[str, float], weights: dict[str, float], fields: dict[str, float]) -> dict[str, float]:
    """Each output field's part of a scored answer's total: its credit times what it weighs in the
    total (with a reference its credit against the reference, `fields`; without one its judge's
    component). The parts sum to the total less the form's (format and schema), which is paid in
    proportion to them. GRPO's per-field credit gives each field's tokens the change in its own
    part (`trainer.field_credit`)."""
    whole = sum(weights.values())
    if "content" in weights:  # scored with a reference
        scale = weights["content"] / whole / TOTAL_FIELD_WEIGHT
        return {name: scale * FIELD_WEIGHTS[name] * fields.get(name, 0.0) for name in EXTRACTION_FIELDS}
    return {name: weights[component] / whole * components.get(component, 0.0) for name, (component, _) in FIELD_JUDGES.items()}
