"""Robust parsing of what small models write around their answer: a `<think>` block (closed,
unclosed, or closed without its opening tag because the chat template opened it), markdown
fences, prose around the JSON, PT-BR decimal commas, trailing commas, single quotes and
Python's True/False/None.

`parse_json_object` reports how much repair it needed, so format cleanliness can be scored
apart from content: a correct answer in a quirky wrapper keeps its content score.
"""
from __future__ import annotations

import json
import re
from typing import NamedTuple

import json_repair
import msgspec

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.S)
# A number with a decimal comma in value position: `: 4,5` followed by a delimiter.
# json_repair is quadratic on pathological input ("{" * 200_000 takes ~25 s); answers of
# these tasks are a few KB, so only candidates of a plausible size and nesting are repaired.
MAX_REPAIR_CHARS = 8_000
MAX_REPAIR_BRACKETS = 200
DECIMAL_COMMA = re.compile(r":\s*-?\d+,\d")
STRING_OR_DECIMAL = re.compile(r'"(?:[^"\\]|\\.)*"|(:\s*-?\d+),(\d+)(?=\s*[,}\]\n])')


class Thought(NamedTuple):  # NamedTuples: built on every score, 3x cheaper than frozen dataclasses
    think: str | None  # the reasoning, None when there is no think block
    closed: bool  # False when the block never closed (the answer is then empty)
    answer: str


def split_think(text: str) -> Thought:
    """The answer is what follows the last `</think>`: a small model sometimes closes twice."""
    start = text.find(THINK_OPEN)
    end = text.rfind(THINK_CLOSE)
    if end != -1 and (start == -1 or start < end):
        begin = start + len(THINK_OPEN) if start != -1 else 0
        return Thought(text[begin:end].strip(), True, text[end + len(THINK_CLOSE):].strip())
    if start != -1:
        return Thought(text[start + len(THINK_OPEN):].strip(), False, text[:start].strip())
    return Thought(None, True, text.strip())


def strip_fences(text: str) -> tuple[str, bool]:
    match = FENCE.search(text) if "```" in text else None
    if match:
        return match.group(1).strip(), True
    return text, False


def _fix_decimal_commas(text: str) -> str:
    """Replace decimal commas in value position; strings are matched first and left alone."""
    return STRING_OR_DECIMAL.sub(lambda m: m.group(0) if m.group(1) is None else f"{m.group(1)}.{m.group(2)}", text)


CLOSERS = {"{": "}", "[": "]"}
TRAILING_PARTIAL = re.compile(r'(,?\s*"[^"]*"\s*:\s*[^\s,\[\]{}"]*|,\s*"[^"]*"|,\s*[^\s,\[\]{}":]*)\s*$')
# strings (their body, and their closing quote if they have one) and brackets outside strings
STRUCTURE = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*)("?)|([\[\]{}])')


def _close_truncated(text: str) -> list[str]:
    """Ways to close what a completion cut at max_tokens left open (a string, objects, lists):
    as it stands, then without a dangling key, comma or half-written literal (`fal`, `1.`).
    Empty when the text is not simply truncated. Far cheaper than a general repair."""
    stack, cut_string = [], None
    for string, closing_quote, bracket in STRUCTURE.findall(text):
        if string:
            cut_string = None if closing_quote else string  # only the last string can be cut
        elif bracket in CLOSERS:
            stack.append(CLOSERS[bracket])
        elif not stack or stack.pop() != bracket:
            return []
    if not stack:
        return []
    closers = "".join(reversed(stack))
    if cut_string is not None:  # a cut value is closed; a cut key is dropped with its comma
        return [text + '"' + closers, text[:text.rfind(cut_string)].rstrip().rstrip(",") + closers]
    return [text + closers, _drop_dangling(text) + closers]


def _drop_dangling(text: str) -> str:
    """The text without what TRAILING_PARTIAL matches at its end. A match holds at most two
    quotes, the text's last two, so the search starts after the third last: from the start it
    would try every position of the answer."""
    start = len(text)
    for _ in range(3):
        start = text.rfind('"', 0, start)
        if start == -1:
            break
    match = TRAILING_PARTIAL.search(text, start + 1)
    return text if match is None else text[:match.start()] + text[match.end():]


def _outer_object(text: str) -> str | None:
    start = text.find("{")
    if start == -1:
        return None
    end = text.rfind("}")
    return text[start:end + 1] if end > start else text[start:]


class ParsedJSON(NamedTuple):
    value: dict | None
    wrapped: bool  # think block, fences or prose had to be removed
    repaired: bool  # syntax had to be repaired (quotes, trailing commas, Python literals, truncation)


# msgspec decodes JSON about 5x faster than the json module, and fails faster too (scoring
# decodes every completion, and truncated ones several times). It refuses an escaped lone
# surrogate (`"\\ud800"`), which has no UTF-8 form and would break every later encode of the
# answer: it becomes U+FFFD. Python's json still reads what msgspec refuses but a model may
# write (NaN, Infinity, numbers out of float range, raw surrogate characters).
_DECODER = msgspec.json.Decoder()
LONE_SURROGATE_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _loads(text: str):
    try:
        return _DECODER.decode(text)
    except (msgspec.ValidationError, UnicodeEncodeError):
        pass
    except (msgspec.DecodeError, RecursionError):
        if "\\u" in text and LONE_SURROGATE_ESCAPE.search(text):
            return _loads(LONE_SURROGATE_ESCAPE.sub(r"\\ufffd", text))
        if "NaN" not in text and "Infinity" not in text:
            return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def parse_json_object(text: str) -> ParsedJSON:
    thought = split_think(text)
    body, fenced = strip_fences(thought.answer)
    candidate = _outer_object(body)
    if candidate is None:
        return ParsedJSON(None, False, False)
    wrapped = thought.think is not None or fenced or candidate != body.strip()
    value, repaired = _loads(candidate), False
    if value is None and DECIMAL_COMMA.search(candidate):  # PT-BR decimals are understood, never penalised
        candidate = _fix_decimal_commas(candidate)
        value = _loads(candidate)
    if value is None:
        repaired = True
        for closed in _close_truncated(candidate):
            value = _loads(closed)
            if value is not None:
                break
    if value is None:
        repairable = len(candidate) <= MAX_REPAIR_CHARS and candidate.count("{") + candidate.count("[") <= MAX_REPAIR_BRACKETS
        try:
            value = json_repair.loads(candidate) if repairable else None
        except (ValueError, RecursionError, TypeError, IndexError):
            value = None
    if not isinstance(value, dict):
        return ParsedJSON(None, wrapped, repaired)
    return ParsedJSON(value, wrapped, repaired)


def format_score(parsed: ParsedJSON) -> tuple[float, str]:
    if parsed.value is None:
        return 0.0, "no JSON object could be read"
    if parsed.repaired:
        return 0.5, "JSON needed syntax repair"
    if parsed.wrapped:
        return 0.75, "JSON was wrapped in think/fences/prose"
    return 1.0, "clean JSON"


_STD_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def value_spans(text: str) -> dict[str, tuple[int, int]]:
    """Where each top-level key's value of the first JSON object in `text` lies, as character
    spans [start, end) of `text`: what GRPO's per-field credit gives each field's tokens. Only
    well-formed JSON is read (no repair): the walk stops at the first thing it cannot read, and
    what it found before stays (a caller that needs every field checks that all are there)."""
    spans: dict[str, tuple[int, int]] = {}
    position = text.find("{")
    if position == -1:
        return spans
    position = _SPACE.match(text, position + 1).end()
    try:
        while position < len(text) and text[position] == '"':
            key, position = _STD_DECODER.raw_decode(text, position)
            position = _SPACE.match(text, position).end()
            if text[position:position + 1] != ":":
                return spans
            start = _SPACE.match(text, position + 1).end()
            _, position = _STD_DECODER.raw_decode(text, start)
            spans[key] = (start, position)
            position = _SPACE.match(text, position).end()
            if text[position:position + 1] != ",":
                return spans
            position = _SPACE.match(text, position + 1).end()
    except (ValueError, RecursionError):
        pass
    return spans
