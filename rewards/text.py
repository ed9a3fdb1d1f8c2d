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


# Accented Latin letters -> their base letter, applied with str.translate (C speed).
_ACCENTS = {
    code: unicodedata.normalize("NFD", chr(code))[0]
    for code in range(0xC0, 0x250)
    if len(unicodedata.normalize("NFD", chr(code))) > 1
}


@lru_cache(maxsize=65536)
def fold(text: str) -> str:
    """Lower case without accents, for comparisons that a typo in an accent should not fail."""
    return text.lower().translate(_ACCENTS)


@lru_cache(maxsize=65536)
def words(text: str) -> tuple[str, ...]:
    return tuple(WORD.findall(fold(text)))


@lru_cache(maxsize=65536)
def _bag(text: str) -> tuple[dict[str, int], int]:
    tokens = words(text)
    return dict(Counter(tokens)), len(tokens)


def token_f1(predicted: str, reference: str) -> float:
    (p, p_len), (r, r_len) = _bag(predicted), _bag(reference)
    if not p_len and not r_len:
        return 1.0
    common = sum(min(count, r.get(word, 0)) for word, count in p.items())
    if common == 0:
        return 0.0
    precision, recall = common / p_len, common / r_len
    return 2 * precision * recall / (precision + recall)


def ptbr_score(text: str) -> float:
    """Share of function words that are Portuguese rather than English; 0 for no words."""
    tokens = words(text)
    pt = sum(t in PT_WORDS for t in tokens)
    en = sum(t in EN_WORDS and t not in PT_WORDS for t in tokens)
    if pt + en == 0:
        return 0.0 if not tokens else 0.5
    return pt / (pt + en)


def clear_caches() -> None:
    """Forget memoised tokenisations (benchmarks measure cold text, not cache hits)."""
    for cached in (fold, words, _bag):
        cached.cache_clear()
