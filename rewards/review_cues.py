"""What a PT-BR customer review says, read from its words: the complaints it makes (by
category), its polarity, whether it recommends, and whether delivery went wrong. The
reference-free extraction reward checks an answer's claims against these readings.

Cues are folded (lower case, no accents) and match at the start of a word, so a stem such as
"atras" finds "atraso", "atrasou" and "atrasado". A review may carry cues of several categories
("o fone chegou quebrado e atrasou"): an answer that names any of them names a complaint the
review makes. The lists are general PT-BR e-commerce vocabulary, not the demo generator's
fragments; a review with no cue at all leaves the reward unable to judge (half credit), never
sure of a wrong answer.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from rewards.text import fold

# complaint category -> folded cues (word-initial stems or phrases)
COMPLAINT_CUES: dict[str, tuple[str, ...]] = {
    "delivery_delay": ("atras", "demor", "nao chegou", "ainda nao chegou", "prazo de entrega estour", "estourad",
                       "passou da data", "passou do prazo", "fora do prazo", "onde esta o pedido", "nao foi entregue",
                       "nunca chegou", "extravi"),
    "product_defect": ("defeit", "quebr", "parou de funcionar", "nao liga", "nao funciona", "estragad", "queimou",
                       "com problema", "avariad", "trincad"),
    "wrong_item": ("errad", "outra coisa", "trocad", "diferente da que", "diferente do que", "outro modelo",
                   "mandaram outro", "nao era o que", "tamanho errado", "cor diferente"),
    "missing_item": ("falt", "incomplet", "metade do pedido", "nao veio na caixa", "veio so", "so veio"),
    "quality": ("qualidade ruim", "baixa qualidade", "ma qualidade", "pessima qualidade", "material fino", "muito fino",
                "fragil", "frageil", "desbot", "nao vale o que custa", "vagabund", "mal acabad", "descascou", "rasgou"),
    "customer_service": ("atendiment", "atendente", "chamado", "suporte", "ninguem resolve", "nao respond",
                         "grosseir", "sem resposta"),
    "price": ("caro", "preco", "frete muito", "frete caro", "custa caro", "valor alto", "subiu"),
    "packaging": ("embalagem", "caixa chegou", "caixa amassad", "amassad", "rasgad", "sem protecao", "mal embalad"),
    "other": ("nota fiscal", "cobraram", "cobranca", "cobrado duas", "nao consigo rastrear", "rastreio", "reembols",
              "estorno"),
}
# complaints that make a review negative; price and packaging alone leave a review neutral-to-negative
STRONG_COMPLAINTS = frozenset(COMPLAINT_CUES) - {"price", "packaging"}
DELIVERY_COMPLAINTS = frozenset({"delivery_delay", "missing_item"})
POSITIVE_CUES = ("otim", "excelent", "amei", "adorei", "perfeit", "superou", "rapid", "maravilh", "lind", "gostei",
                 "satisfeit", "vale cada centavo", "bem embalad", "antes do prazo", "como na foto", "de qualidade",
                 "recomendo", "indico", "nota 10", "muito bom", "muito boa", "top")
NEUTRAL_CUES = ("e ok", "nada de especial", "razoavel", "cumpre o que promete", "mediano", "normal", "mais ou menos")
NEGATION = re.compile(r"\b(?:nao|nunca|nem)\s+(?:\w+\s+)?$")
RECOMMENDS = re.compile(r"\b(?:recomendo|indico|compraria de novo|compro de novo|vou comprar de novo)")
DOES_NOT_RECOMMEND = re.compile(r"\b(?:nao|nunca)\s+(?:\w+\s+)?(?:recomendo|indico|compro mais|compro de novo|compraria)")


def _compile(cues: tuple[str, ...]) -> re.Pattern:
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(c) for c in sorted(cues, key=len, reverse=True)) + ")")


COMPLAINT_PATTERNS = {category: _compile(cues) for category, cues in COMPLAINT_CUES.items()}
POSITIVE_PATTERN = _compile(POSITIVE_CUES)
NEUTRAL_PATTERN = _compile(NEUTRAL_CUES)
# Broader words a summary uses to speak of a complaint or a verdict ("Qualidade fraca", "Cliente
# elogia"): enough to say what a summary is about, too loose to read a review's complaints from.
SUMMARY_WORDS: dict[str, tuple[str, ...]] = {
    "delivery_delay": ("entrega", "prazo"), "product_defect": ("funcion",), "wrong_item": ("troca", "outro"),
    "missing_item": ("faltando",), "quality": ("qualidade",), "customer_service": ("resposta", "atend"),
    "price": ("valor", "custo"), "packaging": ("caixa", "danific", "proteca"), "other": ("problema", "administrativ"),
    "positive": ("elogi", "satisf", "positiv", "gost", "atendeu", "aprov", "bom", "boa"),
    "neutral": ("neutr", "ok", "sem grandes", "regular"),
}
SUMMARY_PATTERNS = {topic: _compile(words) for topic, words in SUMMARY_WORDS.items()}
ALL_CUES = _compile(tuple(c for cues in COMPLAINT_CUES.values() for c in cues) + POSITIVE_CUES + NEUTRAL_CUES)


class Reading(NamedTuple):
    complaints: frozenset[str]  # categories the review's words complain of
    positive: bool  # praise that is not negated
    neutral: bool  # words of a lukewarm verdict
    recommends: bool | None  # True, False, or None when it does not say
    cue_spans: tuple[tuple[int, int], ...]  # where the cues are, in the folded text

    @property
    def strong(self) -> bool:
        """A complaint that makes a review negative, or a refusal to recommend."""
        return bool(self.complaints & STRONG_COMPLAINTS) or self.recommends is False

    @property
    def says_something(self) -> bool:
        """The words carry a complaint or a verdict; otherwise they decide no field."""
        return bool(self.complaints) or self.positive or self.neutral

    @property
    def needs_answer(self) -> bool:
        """A strong complaint that no praise softens: it waits for the store's answer and is not of
        low urgency. One softened by praise ("chegou amassada, mas o som é ótimo") does not."""
        return self.strong and not self.positive

    @property
    def polarity(self) -> str | None:
        """The sentiment the words call for, or None when they say nothing either way."""
        strong = self.strong
        mild = bool(self.complaints) and not strong
        if strong and self.positive:
            return "mixed"
        if strong:
            return "negative"
        if self.positive and mild:
            return "mixed"
        if mild or self.neutral:
            return "neutral"
        return "positive" if self.positive else None

    @property
    def delivery_problem(self) -> bool:
        return bool(self.complaints & DELIVERY_COMPLAINTS)


def _unnegated(pattern: re.Pattern, text: str) -> list[re.Match]:
    return [m for m in pattern.finditer(text) if not NEGATION.search(text[max(0, m.start() - 20):m.start()])]


@lru_cache(maxsize=16384)
def read(review: str) -> Reading:
    text = fold(review)
    complaints = frozenset(c for c, pattern in COMPLAINT_PATTERNS.items() if pattern.search(text))
    positive = _unnegated(POSITIVE_PATTERN, text)
    does_not = DOES_NOT_RECOMMEND.search(text)
    recommends = False if does_not else (True if RECOMMENDS.search(text) else None)
    spans = tuple((m.start(), m.end()) for m in ALL_CUES.finditer(text))
    positive = [m for m in positive if not (does_not and does_not.start() <= m.start() < does_not.end())]
    return Reading(complaints, bool(positive), bool(NEUTRAL_PATTERN.search(text)), recommends, spans)


CUE_WORDS = re.compile(ALL_CUES.pattern + r"\w*")  # a cue with the rest of its word ("atrasado" of "atras")


def without_cues(folded: str) -> str:
    """A folded text with every word that carries a cue of sentiment or complaint blanked out."""
    return CUE_WORDS.sub(" ", folded)


def has_cue(text: str) -> bool:
    """Whether a piece of text carries a cue of sentiment or complaint."""
    return ALL_CUES.search(fold(text)) is not None


def complaints_said(text: str) -> frozenset[str]:
    """The complaint categories a text states in a review's own words."""
    folded = fold(text)
    return frozenset(c for c, pattern in COMPLAINT_PATTERNS.items() if pattern.search(folded))


def topics(text: str) -> frozenset[str]:
    """What a summary speaks of: complaint categories and verdicts (positive, neutral), broadly."""
    folded = fold(text)
    said = {c for c, pattern in COMPLAINT_PATTERNS.items() if pattern.search(folded)}
    said |= {t for t, pattern in SUMMARY_PATTERNS.items() if pattern.search(folded)}
    if POSITIVE_PATTERN.search(folded):
        said.add("positive")
    return frozenset(said)
