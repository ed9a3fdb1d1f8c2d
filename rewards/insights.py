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
share that a selective answer names).

What it claims must be true of the data (`claims`): a row said to lead, be the largest or the
smallest, the first or last of the list, or ahead of another row, must be so in some numeric
column, and "entre os N registros" must count the rows. Each false claim multiplies every
component by `FALSE_CLAIM_PAID`, which costs more than claiming nothing (an answer that only
restates rows is paid `UNRELATED_PAID`). A figure must sit beside the row it belongs to: on a
line that names rows, it is grounded only as a value of the row named nearest before it.
"""
from __future__ import annotations

import contextlib
import re

from common.tasks import InsightsInput
from rewards.parsing import split_think
from rewards.text import META_WORDS, content_words, fold, ptbr_score

FORM = {"ptbr": 0.1, "structure": 0.1, "length": 0.05, "thinking": 0.1}
CONTENT = {"grounding": 0.35, "entities": 0.2, "relevance": 0.1}
WEIGHTS = {**FORM, **CONTENT}
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.M)
CONCLUSION = ("recomend", "sugest", "conclus", "proximo passo", "acao", "portanto", "priorizar")
RECOMMENDATION = re.compile(r"(?<!\w)(?:" + "|".join(CONCLUSION) + ")")
WORD = re.compile(r"[^\W\d_]{2,}", re.UNICODE)
CITED_ENOUGH = 3  # figures (or rows, when fewer) an analysis cites for full grounding
# An analysis names at most this many of a table's rows; a table this size or smaller may be named
# whole (the store's analysts name four rows, the general style two or three; no reference and no
# answer of the demo model names more).
SELECTIVE = 5
UNRELATED_PAID = 0.5  # what an answer that relates no row to the others is paid of each component
CLAIM_REACH = 60  # characters between a superlative and the row it speaks of
FALSE_CLAIM_PAID = 0.4  # each false claim multiplies every component by this: worse than saying nothing
NUMBER_WORDS = {"dois": "2", "duas": "2", "tres": "3", "quatro": "4", "cinco": "5", "seis": "6", "sete": "7", "oito": "8",
                "nove": "9", "dez": "10"}
_N = r"(\d+|" + "|".join(NUMBER_WORDS) + ")"
# "entre os 15 registros", "as 5 linhas", "os dados têm 8 estados" is not read: only the data's rows as such
COUNT_CLAIM = re.compile(rf"(?<!\w)(?:entre|dos|das|nos|nas|os|as|sao|temos|tenho|ha)\s+(?:os\s+|as\s+)?{_N}\s+(registros|linhas)(?!\w)")
# what places a row among the others (folded): the named row nearest before it is the subject
CLAIM = re.compile(
    r"(?<!\w)(?:(?P<first>primeir[oa] da (?:lista|tabela))|(?P<last>ultim[oa] da (?:lista|tabela))"
    r"|(?P<ahead>a frente d[eoa]s?|supera|acima d[eoa]s?)|(?P<behind>atras d[eoa]s?|abaixo d[eoa]s?)"
    r"|(?P<max>lidera\w*|lider\w*|maior|maiores|mais alt[oa]s?|topo|no pico|maxim[oa])"
    r"|(?P<min>menor|menores|mais baix[oa]s?|minim[oa]|lanterna)"
    r"|(?P<end>destaca\w*|outra ponta|pior|piores|melhor|melhores))(?!\w)")


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


def _cells(row) -> list:
    """A data row's cells, whether it came as a list, an object or a bare value."""
    return list(row) if isinstance(row, (list, tuple)) else (list(row.values()) if isinstance(row, dict) else [row])


def _row_values(row) -> list[float]:
    """Every number of a row: numeric cells, and the figures written in its text cells."""
    values = []
    for cell in _cells(row):
        if isinstance(cell, (int, float)) and not isinstance(cell, bool):
            values.append(float(cell))
        elif isinstance(cell, str):
            values += [v for token in NUMBER.findall(cell) for v in read_number(token)]
    return values


def _data_values(asked: InsightsInput) -> list[float]:
    values = [v for row in asked.rows or [] for v in _row_values(row)]
    values += [v for token in NUMBER.findall(asked.question) for v in read_number(token)]
    return values


def _grounded(reading: set[float], values: list[float]) -> bool:
    return any(abs(r - v) <= max(0.006 * abs(v), 0.011) for r in reading for v in values)


def prose_lines(answer: str) -> list[str]:
    """Lines that are sentences, not data: two words or more, and no JSON."""
    return [line for line in answer.splitlines()
            if len(WORD.findall(line)) >= 2 and line.lstrip()[:1] not in "{[" and '":' not in line and '",' not in line]


def grounding(answer: str, asked: InsightsInput, labels: list[str]) -> tuple[float, str]:
    """The figures cited in sentences are the data's, each beside the row it belongs to: a figure
    on a line that names rows must be a value of the row named nearest before it (or after, when
    none is before); on a line that names none, any value of the data."""
    rows = asked.rows
    if not rows:
        return 0.0, "no data rows given: nothing to ground in"
    values = _data_values(asked)
    per_row = [_row_values(r) for r in rows] if len(labels) == len(rows) else None
    cited = good = misplaced = 0
    for line in prose_lines(answer):
        folded = fold(line)
        mentions = _mentions(folded, labels) if per_row else []
        counts = [m.span(1) for m in COUNT_CLAIM.finditer(folded)]
        for match in NUMBER.finditer(folded):
            reading = read_number(match.group())
            if not reading or all(float(x).is_integer() and 0 <= x <= 12 for x in reading):
                continue  # counts, ordinals
            if any(start <= match.start() < end for start, end in counts):
                continue  # a claim of how many rows there are: `claims` checks it
            cited += 1
            before = [i for at, i in mentions if at < match.start()]
            after = [i for at, i in mentions if at > match.start()]
            row = before[-1] if before else (after[0] if after else None)
            if row is None:
                good += _grounded(reading, values)
            elif _grounded(reading, per_row[row]):
                good += 1
            else:
                misplaced += _grounded(reading, values)
    if not cited:
        return 0.0, "no figures from the data are cited in sentences"
    enough = min(1.0, good / min(CITED_ENOUGH, len(rows)))
    return good / cited * enough, f"{good}/{cited} figures found in the data beside their rows" + (
        f" ({misplaced} beside the wrong row)" if misplaced else "")


def _labels(asked: InsightsInput) -> list[str]:
    """The data's row labels (each row's text cells), in order."""
    labels = []
    for row in asked.rows or []:
        labels += [str(c) for c in _cells(row) if isinstance(c, str) and c.strip()][:1]
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


def _numeric_columns(rows: list) -> list[list[float | None]]:
    """Each numeric column of the data, row by row (None where a row has no number there)."""
    table = [_cells(r) for r in rows]
    width = max((len(r) for r in table), default=0)
    columns = []
    for i in range(width):
        cells = [r[i] if i < len(r) else None for r in table]
        numbers = [float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else None for c in cells]
        if sum(n is not None for n in numbers) >= 2:
            columns.append(numbers)
    return columns


def _mentions(folded: str, labels: list[str]) -> list[tuple[int, int]]:
    """(position, row index) of every row label the folded text names, in order."""
    found = []
    for index, label in enumerate(labels):
        found += [(m.start(), index) for m in re.finditer(rf"(?<!\w){re.escape(fold(label))}(?!\w)", folded)]
    return sorted(found)


def _extreme(index: int, columns: list[list[float | None]], side: str) -> bool:
    """Whether a row holds the largest ("max"), smallest ("min") or either ("end") value of some column."""
    for values in columns:
        value, present = values[index], [v for v in values if v is not None]
        if value is None:
            continue
        if (side in ("max", "end") and value == max(present)) or (side in ("min", "end") and value == min(present)):
            return True
    return False


def claims(answer: str, asked: InsightsInput, labels: list[str]) -> tuple[int, list[str]]:
    """The answer's claims about the data that can be checked, and the false ones: a row that
    leads, is the largest, smallest, first or last (of the list), or ahead of another; and how
    many rows there are ("entre os 15 registros"). A superlative is about the row named nearest
    to it, a comparison about the rows named before and after it; either is true when it holds
    in some numeric column."""
    rows = asked.rows or []
    columns, true, false = _numeric_columns(rows), 0, []
    for line in prose_lines(answer):
        folded = fold(line)
        for match in COUNT_CLAIM.finditer(folded):
            said = int(NUMBER_WORDS.get(match.group(1), match.group(1)))
            if said == len(rows):
                true += 1
            else:
                false.append(f"says {said} {match.group(2)}, the data has {len(rows)}")
        mentions = _mentions(folded, labels)
        if not mentions or not columns or RECOMMENDATION.search(folded):
            continue  # a recommendation speaks of plans ("frete menor em MG"), not of the data
        for match in CLAIM.finditer(folded):
            kind = next(k for k, v in match.groupdict().items() if v)
            before = [i for at, i in mentions if at < match.start()]
            after = [i for at, i in mentions if at >= match.end()]
            if kind in ("ahead", "behind"):
                if not before or not after:
                    continue
                a, b = before[-1], after[0]
                ok = any(v[a] is not None and v[b] is not None and (v[a] >= v[b] if kind == "ahead" else v[a] <= v[b]) for v in columns)
                subject = f"{labels[a]} {'ahead of' if kind == 'ahead' else 'behind'} {labels[b]}"
            else:
                near = [(abs(at - match.start()), i) for at, i in mentions if abs(at - match.start()) <= CLAIM_REACH]
                if not near:
                    continue
                subject_index = min(near)[1]
                if kind in ("first", "last"):
                    ok = subject_index == (0 if kind == "first" else len(labels) - 1)
                else:
                    ok = _extreme(subject_index, columns, kind)
                subject = f"{labels[subject_index]} is {kind}"
            if ok:
                true += 1
            else:
                false.append(f"false: {subject}")
    return true, false


def relevance(answer: str, asked: InsightsInput) -> tuple[float, str]:
    words_asked = content_words(" ".join([asked.question, *(asked.columns or [])])) - META_WORDS
    if not words_asked:
        return 0.0, "no question"
    shared = words_asked & content_words(answer)
    return min(1.0, 3 * len(shared) / len(words_asked)), f"{len(shared)}/{len(words_asked)} of the question's words"


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


def score(completion: str, reference: dict | None, task_input: InsightsInput | None) -> tuple[dict, dict, dict, object]:
    """`task_input`: the request's question and data (None: scored without them, as a question left empty)."""
    asked = task_input if task_input is not None else InsightsInput.model_construct(question="")
    thought = split_think(completion)
    answer = thought.answer
    components, details = dict.fromkeys(WEIGHTS, 0.0), {}
    thinking_credit, details["thinking"] = thinking(thought.think, thought.closed, answer)
    if not answer:
        details["answer"] = "empty answer"
        return components, WEIGHTS, details, answer
    labels = _labels(asked)
    named = named_rows(answer, labels)  # read once: entities pay for it, selection for not overdoing it
    components["grounding"], details["grounding"] = grounding(answer, asked, labels)
    components["entities"], details["entities"] = entities(named, labels)
    components["relevance"], details["relevance"] = relevance(answer, asked)
    content = sum(components[name] * weight for name, weight in CONTENT.items()) / sum(CONTENT.values())
    structure_credit, details["structure"] = structure(answer)
    form = {"ptbr": ptbr_score(answer), "structure": structure_credit, "length": length(answer), "thinking": thinking_credit}
    details["length"] = f"{len(answer)} characters; form paid at {content:.2f} (the content's share)"
    components.update({name: credit * content for name, credit in form.items()})
    repeated, details["repetition"] = repetition(answer)
    selective, details["selection"] = selection(named, labels)
    true, false = claims(answer, asked, labels)
    relation = FALSE_CLAIM_PAID ** len(false) if false else (1.0 if true else UNRELATED_PAID)
    details["claims"] = f"{true} true, {len(false)} false" + (f": {'; '.join(false[:3])}" if false else "") + \
        ("" if true or false else " (it restates the data: no row is placed among the others)")
    paid = (1.0 - repeated) * selective * relation
    if paid < 1.0:
        details["paid"] = f"every component paid at {paid:.2f} (repetition, selection, claims)"
        components = {name: credit * paid for name, credit in components.items()}
    return components, WEIGHTS, details, answer
