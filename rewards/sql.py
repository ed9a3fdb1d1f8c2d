"""SQL reward: one read-only SQLite SELECT over the commerce schema.

Components: `format` (bare SQL vs wrapped in think/fences/prose), `safety` (a gate: anything
but one read-only SELECT is refused unexecuted and scores 0 in total), `parse`, `schema_link`
(share of referenced tables and columns that exist), `executes` (runs without error within
the limits), and with a reference `execution_match`: results compared as bags of rows, in
order only when the reference has ORDER BY (as Spider's test-suite does), partial credit by
multiset overlap. With a reference the execution match is 0.85 of the total: a query that
parses and runs but returns the wrong result earns at most 0.15, and one whose result is a
constant (it reads no table, or selects only literals) matches nothing.

Without a reference, `question_match` (what of the question the SQL addresses: the tables its
words point at, its values compared against columns, the aggregate it asks for;
`rewards.sql_question`) carries most of the weight, and schema linking and execution earn credit
only in its proportion: a query that ignores the question earns almost nothing, and an empty or
NULL result earns half the execution credit.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

from sqlglot import exp

from common.commerce import SCHEMA_COLUMNS
from rewards.parsing import split_think, strip_fences
from rewards.sql_question import is_constant, question_match
from rewards.sql_sandbox import QueryResult, check_readonly, execute_readonly

WEIGHTS_WITH_REFERENCE = {"format": 0.02, "safety": 0.0, "parse": 0.03, "schema_link": 0.05, "executes": 0.05,
                          "execution_match": 0.85}
WEIGHTS_WITHOUT_REFERENCE = {"format": 0.05, "safety": 0.0, "parse": 0.05, "schema_link": 0.15, "executes": 0.15,
                             "question_match": 0.6}
SQL_START = re.compile(r"\b(SELECT|WITH)\b", re.I)
# A text that opens with any statement verb is SQL from its first word: nothing is cut, so
# "CREATE TABLE t AS SELECT ..." is judged (and refused) whole.
STATEMENT_VERB = re.compile(
    r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|ATTACH|DETACH|VACUUM|BEGIN|COMMIT|"
    r"ROLLBACK|REINDEX|ANALYZE|EXPLAIN|SAVEPOINT|RELEASE|VALUES)\b", re.I)
ALL_COLUMNS = {c.lower() for cols in SCHEMA_COLUMNS.values() for c in cols}
TABLES = {t.lower(): {c.lower() for c in cols} for t, cols in SCHEMA_COLUMNS.items()}


def extract_sql(completion: str) -> tuple[str, bool]:
    """The SQL inside a completion, and whether it had to be unwrapped."""
    thought = split_think(completion)
    text, fenced = strip_fences(thought.answer)
    text = text.strip()
    match = None if STATEMENT_VERB.match(text) else SQL_START.search(text)
    if match:
        text = text[match.start():]
    sql = text.strip().rstrip(";").strip()
    lines = sql.splitlines()
    # Prose after the query ("Espero ter ajudado."): keep the longest run of leading lines that
    # parses. Dropped lines are never executed, so this cannot smuggle a second statement in.
    while len(lines) > 1 and not check_readonly("\n".join(lines)).parsed:
        lines.pop()
    sql = "\n".join(lines).strip().rstrip(";").strip()
    wrapped = thought.think is not None or fenced or sql != completion.strip().rstrip(";").strip()
    return sql, wrapped


def schema_link(tree: exp.Expression) -> tuple[float, str]:
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables = [t.name.lower() for t in tree.find_all(exp.Table) if t.name]
    real = [t for t in tables if t not in cte_names]
    aliases = {a.alias.lower() for a in tree.find_all(exp.Alias) if a.alias} | cte_names
    aliases |= {str(col).lower() for cte in tree.find_all(exp.CTE) for col in (cte.args.get("alias").columns if cte.args.get("alias") else [])}
    known = set().union(*(TABLES[t] for t in real if t in TABLES)) if any(t in TABLES for t in real) else ALL_COLUMNS
    columns = [c.name.lower() for c in tree.find_all(exp.Column) if c.name and c.name != "*"]
    checked_columns = [c for c in columns if c not in aliases]
    good = sum(t in TABLES for t in real) + sum(c in known for c in checked_columns)
    total = len(real) + len(checked_columns)
    if total == 0:
        return 0.5, "no table or column referenced"
    bad = [t for t in real if t not in TABLES] + [c for c in checked_columns if c not in known]
    return good / total, "all names exist" if not bad else f"unknown names: {', '.join(sorted(set(bad))[:5])}"


IDENTIFIER = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", re.I)
KNOWN_NAMES = frozenset(TABLES) | frozenset(ALL_COLUMNS)


def identifier_link(sql: str) -> tuple[float, str]:
    """For SQL that does not parse: the share of snake_case identifiers that are real names."""
    names = IDENTIFIER.findall(sql)
    if not names:
        return 0.0, "no identifiers"
    good = sum(n.lower() in KNOWN_NAMES for n in names)
    return 0.5 * good / len(names), f"unparsed; {good}/{len(names)} identifiers are schema names"


def _normalise(value):
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return round(float(value), 4)
    return value


def _rows(result: QueryResult) -> list[tuple]:
    return [tuple(_normalise(v) for v in row) for row in result.rows]


@lru_cache(maxsize=4096)
def _reference_result(db_path: str, sql: str, timeout_s: float, row_cap: int) -> tuple[tuple[tuple, ...], bool] | None:
    checked = check_readonly(sql)
    if not checked.ok:
        return None
    result = execute_readonly(Path(db_path), sql, timeout_s=timeout_s, row_cap=row_cap)
    if result.error:
        return None
    return tuple(_rows(result)), checked.tree.args.get("order") is not None


def _canonical(row: tuple) -> tuple:
    """A row with its values in a fixed order, so a permutation of the columns still matches."""
    return tuple(sorted(row, key=lambda v: (type(v).__name__, str(v))))


def execution_match(predicted: list[tuple], expected: tuple[tuple, ...], ordered: bool) -> tuple[float, str]:
    if ordered and list(predicted) == list(expected):
        return 1.0, "same rows in the same order"
    p, e = Counter(map(_canonical, predicted)), Counter(map(_canonical, expected))
    if p == e:
        return (0.8, "same rows, wrong order") if ordered else (1.0, "same bag of rows")
    union = sum((p | e).values())
    overlap = sum((p & e).values()) / union if union else 0.0
    return 0.5 * overlap, f"{sum((p & e).values())} of {sum(e.values())} reference rows matched"


def _limits(context: dict) -> tuple[float, int]:
    try:
        return float(context["timeout_s"]), int(context["row_cap"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("scoring SQL needs context['timeout_s'] and context['row_cap'] (the query limits)") from None


def score(completion: str, reference: dict | None, context: dict, db_path: Path) -> tuple[dict, dict, dict, object]:
    sql, wrapped = extract_sql(completion)
    weights = WEIGHTS_WITH_REFERENCE if reference else WEIGHTS_WITHOUT_REFERENCE
    components = dict.fromkeys(weights, 0.0)
    components["format"] = 0.5 if wrapped else 1.0
    details = {"format": "SQL was wrapped in think/fences/prose" if wrapped else "bare SQL"}
    if not sql:
        details["safety"] = "no SQL found"
        components["format"] = 0.0
        return components, weights, details, None
    checked = check_readonly(sql)
    details["safety"] = checked.reason
    if not checked.parsed:  # partial credit for naming real tables and columns
        components["schema_link"], details["schema_link"] = identifier_link(sql)
        return components, weights, details, sql
    if not checked.ok:  # refused: a write or anything but one SELECT earns nothing at all
        return dict.fromkeys(weights, 0.0), weights, details, sql
    components["safety"] = components["parse"] = 1.0
    components["schema_link"], details["schema_link"] = schema_link(checked.tree)
    timeout_s, row_cap = _limits(context)
    result = execute_readonly(db_path, sql, timeout_s=timeout_s, row_cap=row_cap)
    if result.error:
        details["executes"] = f"error: {result.error}"
        return components, weights, details, sql
    components["executes"] = 1.0
    details["executes"] = f"{len(result.rows)} rows" + (" (capped)" if result.truncated else "")
    if not reference:
        if not result.rows or all(v is None for v in result.rows[0]):
            components["executes"], details["executes"] = 0.5, "runs, but its result is empty or NULL"
        used = {t.name.lower() for t in checked.tree.find_all(exp.Table)} & set(TABLES)
        match, details["question_match"] = question_match(str(context.get("question", "")), checked.tree, used, KNOWN_NAMES)
        components["question_match"] = match
        components["schema_link"] *= match  # reference-free credit only for what the question asks
        components["executes"] *= match
        return components, weights, details, sql
    expected = _reference_result(str(db_path), reference["sql"], timeout_s, row_cap)
    if is_constant(checked.tree):
        details["execution_match"] = "the result is a constant: it does not come from the data"
    elif expected is None:
        details["execution_match"] = "the reference query itself fails; content not scored"
        components["execution_match"] = 0.0
    else:
        components["execution_match"], details["execution_match"] = execution_match(_rows(result), *expected)
    return components, weights, details, sql
