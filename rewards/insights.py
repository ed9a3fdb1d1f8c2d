"""Insights reward, reference-free. What is paid is an analysis of the given data in PT-BR
prose: `grounding` (the figures cited in sentences are the data's own, and the answer cites
enough of them; none cited is no credit, and no data given is no credit either), `entities` (it
names the rows it talks about: the data's labels, such as states or categories) and `relevance`
(it speaks to the question and the data's columns). The form (PT-BR, structure: paragraphs, a list, a
recommendation; a sensible length; thinking efficiency: an unclosed `<think>` or reasoning that
eats most of the output costs reward) is paid in proportion to that content, so a fixed text
that fits every form earns almost nothing. The answer is scored without its think block.

Two things an analysis does that a content check alone would not see, each scaling every
component: it says each thing once (a line that repeats an earlier one, its figures aside, is
paid nothing: a half-trained model that loops until the token limit cites the data over and over,
and scored as well as a real analysis while taking minutes to answer), and it selects (an answer
that names most rows of a longer table lists the data instead of analysing it, and is paid the
share that a selective answer names). A third scales every component too: it relates the rows (a
sentence names a row with where it stands: it leads, is the largest or the last, is ahead of
another); an answer that only restates rows, each with its figure, cites the data and names its
rows as an analysis does, and without this would be paid as one on a short table.
"""
from __future__ import annotations

import contextlib
import re

from rewards.parsing import split_think
from rewards.text import META_WORDS, content_words, fold, ptbr_score

FORM = {"ptbr": 0.1, "structure": 0.1, "length": 0.05, "thinking": 0.1}
CONTENT = {"grounding": 0.35, "entities": 0.2, "relevance": 0.1}
WEIGHTS = {**FORM, **CONTENT}
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.M)
CONCLUSION = ("recomend", "sugest", "conclus", "proximo passo", "acao", "portanto", "priorizar")
WORD = re.compile(r"[^\W\d_]{2,}", re.UNICODE)
CITED_ENOUGH = 3  # figures (or rows, when fewer) an analysis cites for full grounding
# An analysis names at most this many of a table's rows; a table this size or smaller may be named
# whole (the store's analysts name four rows, the general style two or three; no reference and no
# answer of the demo model names more).
SELECTIVE = 5
# Words that place a row among the others (folded stems): every reference of every split has a
# sentence naming a row with one, a restated row ("SP tem pedidos de 163") has none.
RANKING = re.compile(r"(?<!\w)(?:maior|menor|mais|menos|lider|destac|frente|ponta|acima|abaixo|pior|melhor|primeir|ultim"
                     r"|pico|topo|supera|maxim|minim|cresc|queda)\w*")
UNRELATED_PAID = 0.5  # what an answer that relates no row to the others is paid of each component


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


def prose_lines(answer: str) -> list[str]:
    """Lines that are sentences, not data: two words or more, and no JSON."""
    return [line for line in answer.splitlines()
            if len(WORD.findall(line)) >= 2 and line.lstrip()[:1] not in "{[" and '":' not in line and '",' not in line]


def grounding(answer: str, context: dict) -> tuple[float, str]:
    rows = context.get("rows")
    if not rows:
        return 0.0, "no data rows given: nothing to ground in"
    values = _data_values(context)
    cited = [read_number(t) for line in prose_lines(answer) for t in NUMBER.findall(line)]
    cited = [r for r in cited if r and not all(float(x).is_integer() and 0 <= x <= 12 for x in r)]  # counts, ordinals
    if not cited:
        return 0.0, "no figures from the data are cited in sentences"
    good = sum(_grounded(r, values) for r in cited)
    enough = min(1.0, good / min(CITED_ENOUGH, len(rows)))
    return good / len(cited) * enough, f"{good}/{len(cited)} figures found in the data"


def _labels(context: dict) -> list[str]:
    """The data's row labels (each row's text cells), in order."""
    labels = []
    for row in context.get("rows") or []:
        cells = row if isinstance(row, (list, tuple)) else (row.values() if isinstance(row, dict) else [row])
        labels += [str(c) for c in cells if isinstance(c, str) and c.strip()][:1]
    return labels


def named_rows(answer: str, labels: list[str]) -> list[str]:
    """The row labels that the answer's sentences name."""
    text = fold(" ".join(prose_lines(answer)))
    return [label for label in labels if re.search(rf"(?<!\w){re.escape(fold(label))}(?!\w)", text)]


def entities(named: list[str], labels: list[str]) -> tuple[float, str]:
    if not labels:
        return 0.0, "no labelled rows given"
    return min(1.0, len(named) / min(CITED_ENOUGH, len(labels))), f"names {len(named)} of the {len(labels)} rows"


def repetition(answer: str) -> tuple[float, str]:
    """The share of the answer's statements (lines of two words or more) that say nothing new:
    the same words as an earlier line, whatever its figures (a loop that counts up is a loop)."""
    seen: set[str] = set()
    statements = repeated = 0
    for line in answer.splitlines():
        key = NUMBER.sub("#", fold(line)).strip(" -*•.:;")
        if len(WORD.findall(key)) < 2:
            continue
        statements += 1
        repeated += key in seen
        seen.add(key)
    share = repeated / statements if statements else 0.0
    return share, f"{repeated} of {statements} lines repeat an earlier one"


def selection(named: list[str], labels: list[str]) -> tuple[float, str]:
    """1.0 for an answer that names at most `SELECTIVE` rows; past that, the square of the share a
    selective answer names, since a listing's every row also earns it grounding and entities."""
    if len(named) <= SELECTIVE:
        return 1.0, f"names {len(named)} of {len(labels)} rows"
    return (SELECTIVE / len(named)) ** 2, f"names {len(named)} of {len(labels)} rows: lists the data (an analysis names at most {SELECTIVE})"


def relates(answer: str, labels: list[str]) -> tuple[bool, str]:
    """Whether a sentence names a row with a word that places it among the others."""
    for line in prose_lines(answer):
        if RANKING.search(fold(line)) and named_rows(line, labels):
            return True, "a sentence places a named row among the others"
    return False, "no sentence places a named row among the others: it restates the data"


def relevance(answer: str, context: dict) -> tuple[float, str]:
    asked = content_words(" ".join([str(context.get("question", ""))] + [str(c) for c in context.get("columns") or []])) - META_WORDS
    if not asked:
        return 0.0, "no question"
    shared = asked & content_words(answer)
    return min(1.0, 3 * len(shared) / len(asked)), f"{len(shared)}/{len(asked)} of the question's words"


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
    components, details = dict.fromkeys(WEIGHTS, 0.0), {}
    thinking_credit, details["thinking"] = thinking(thought.think, thought.closed, answer)
    if not answer:
        details["answer"] = "empty answer"
        return components, WEIGHTS, details, answer
    labels = _labels(context)
    named = named_rows(answer, labels)  # read once: entities pay for it, selection for not overdoing it
    components["grounding"], details["grounding"] = grounding(answer, context)
    components["entities"], details["entities"] = entities(named, labels)
    components["relevance"], details["relevance"] = relevance(answer, context)
    content = sum(components[name] * weight for name, weight in CONTENT.items()) / sum(CONTENT.values())
    structure_credit, details["structure"] = structure(answer)
    form = {"ptbr": ptbr_score(answer), "structure": structure_credit, "length": length(answer), "thinking": thinking_credit}
    details["length"] = f"{len(answer)} characters; form paid at {content:.2f} (the content's share)"
    components.update({name: credit * content for name, credit in form.items()})
    repeated, details["repetition"] = repetition(answer)
    selective, details["selection"] = selection(named, labels)
    related, details["relation"] = relates(answer, labels)
    paid = (1.0 - repeated) * selective * (1.0 if related else UNRELATED_PAID)
    if paid < 1.0:
        details["paid"] = f"every component paid at {paid:.2f} (repetition, selection, relation)"
        components = {name: credit * paid for name, credit in components.items()}
    return components, WEIGHTS, details, answer
