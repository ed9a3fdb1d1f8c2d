"""Small text measures the task rewards share: normalisation, content-word overlap, PT-BR-ness, Portuguese words."""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from wordfreq import zipf_frequency

WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
ASCII_WORD = re.compile(r"[a-z]+")
PT_WORDS = frozenset(
    "a o as os um uma de da do das dos em no na nos nas para por com sem que não nao é e mas "
    "mais muito seu sua seus suas você voce pra pro já ja foi está esta são sao ao aos à "
    "como quando também tambem entre sobre até ate pelo pela isso essa esse este esta".split()
)
EN_WORDS = frozenset(
    "the a an of to in on for with without and but is are was were this that your you it "
    "from by at as be have has not more most our their".split()
)

ONLY_EN_WORDS = EN_WORDS - PT_WORDS

# Accented Latin letters -> their base letter. A regex over the few accented characters is
# several times faster than str.translate, which looks up every character of the text.
_ACCENTS = {
    chr(code): unicodedata.normalize("NFD", chr(code))[0]
    for code in range(0xC0, 0x250)
    if len(unicodedata.normalize("NFD", chr(code))) > 1
}
_ACCENTED = re.compile("[" + "".join(_ACCENTS) + "]")


def _base_letter(match: re.Match) -> str:
    return _ACCENTS[match.group()]


@lru_cache(maxsize=65536)
def fold(text: str) -> str:
    """Lower case without accents, for comparisons that a typo in an accent should not fail."""
    lowered = text.lower()
    return lowered if lowered.isascii() else _ACCENTED.sub(_base_letter, lowered)


@lru_cache(maxsize=65536)
def words(text: str) -> tuple[str, ...]:
    folded = fold(text)
    # folded ASCII text has only a-z for letters, and that class matches twice as fast
    return tuple((ASCII_WORD if folded.isascii() else WORD).findall(folded))


# Words that say nothing of a text's content: function words of either language, and the
# words every review summary or push uses whatever it is about.
META_WORDS = frozenset("cliente clientes avaliacao produto pedido compra loja sobre relata reclama elogia".split())
STOP_WORDS = PT_WORDS | EN_WORDS | frozenset(fold(w) for w in PT_WORDS)


@lru_cache(maxsize=65536)
def content_words(text: str) -> frozenset[str]:
    """The words of a text that carry its content: folded, three letters or more, no function words."""
    return frozenset(w for w in words(text) if len(w) >= 3 and w not in STOP_WORDS)


def content_f1(predicted: str, reference: str) -> float:
    """F1 of the two texts' content words (as sets): shared function words earn nothing."""
    p, r = content_words(predicted), content_words(reference)
    if not p and not r:
        return 1.0
    shared = len(p & r)
    if shared == 0:
        return 0.0
    precision, recall = shared / len(p), shared / len(r)
    return 2 * precision * recall / (precision + recall)


def ptbr_score(text: str) -> float:
    """Share of function words that are Portuguese rather than English; 0 for no words."""
    tokens = words(text)
    pt = sum(map(PT_WORDS.__contains__, tokens))
    en = sum(map(ONLY_EN_WORDS.__contains__, tokens))
    if pt + en == 0:
        return 0.0 if not tokens else 0.5
    return pt / (pt + en)


@lru_cache(maxsize=65536)
def is_ptbr_word(word: str) -> bool:
    """Whether a (lower-case) word is attested in written Portuguese: wordfreq's word list for
    "pt", built from subtitles, news, Wikipedia and the web; it holds the loanwords PT-BR copy
    uses ("app", "off", "black friday") and not a garble like "voio"."""
    return zipf_frequency(word, "pt") > 0


def unknown_words(text: str, allowed: str = "") -> list[str]:
    """The words of a text (letters only, two or more) that are not Portuguese words, leaving out
    those of `allowed` (the names and codes a text is given: a customer, a product, a coupon)."""
    given = set(words(allowed))
    tokens = WORD.findall(text.lower())
    return [w for w in tokens if len(w) >= 2 and fold(w) not in given and not is_ptbr_word(w)]


def clear_caches() -> None:
    """Forget memoised tokenisations (benchmarks measure cold text, not cache hits)."""
    for cached in (fold, words, content_words):
        cached.cache_clear()
