"""Small text measures the task rewards share: normalisation, token overlap, PT-BR-ness."""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
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
    return tuple(WORD.findall(fold(text)))


@lru_cache(maxsize=65536)
def _bag(text: str) -> tuple[Counter, int]:
    tokens = words(text)
    return Counter(tokens), len(tokens)


def token_f1(predicted: str, reference: str) -> float:
    (p, p_len), (r, r_len) = _bag(predicted), _bag(reference)
    if not p_len and not r_len:
        return 1.0
    common = sum(min(p[word], r[word]) for word in p.keys() & r.keys())
    if common == 0:
        return 0.0
    precision, recall = common / p_len, common / r_len
    return 2 * precision * recall / (precision + recall)


def ptbr_score(text: str) -> float:
    """Share of function words that are Portuguese rather than English; 0 for no words."""
    bag, count = _bag(text)
    pt = sum(bag[w] for w in PT_WORDS.intersection(bag))
    en = sum(bag[w] for w in ONLY_EN_WORDS.intersection(bag))
    if pt + en == 0:
        return 0.0 if not count else 0.5
    return pt / (pt + en)


def clear_caches() -> None:
    """Forget memoised tokenisations (benchmarks measure cold text, not cache hits)."""
    for cached in (fold, words, _bag):
        cached.cache_clear()
