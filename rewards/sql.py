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
words point at, its values compared against columns with the operator the question means, the
aggregate it asks for and what it is taken over, the rows it is made of; `rewards.sql_question`) carries most of the
weight, and `result_shape` (rows at all; one figure for a count or an average, N rows for a
ranking of N, a row per group; no spread of figures nobody asked for) and schema linking are paid
only in its proportion: a query that ignores the question earns almost nothing.

A query that errors or times out keeps half of its form and nothing else, so it scores below
any query that runs: RL is never led towards errors. Completions are read in time linear in
their length: a query is at most `MAX_SQL_LINES` lines, and what runs past that is not part of it.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from sqlglot import exp

from common.commerce import SCHEMA_COLUMNS
from rewards.parsing import split_think, strip_fences
from rewards.sql_question import PRODUCTS, SCHEMA_COLUMN_NAMES, Cues, is_constant, question_cues, question_match
from rewards.sql_sandbox import QueryResult, check_readonly, execute_readonly

# `reference_ran` (weight 0) says whether the reference itself ran: when it did not, the answer
# was not judged on content, which is undecided rather than wrong
WEIGHTS_WITH_REFERENCE = {"format": 0.02, "safety": 0.0, "parse": 0.03, "schema_link": 0.05, "executes": 0.05,
                          "execution_match": 0.85, "reference_ran": 0.0}
WEIGHTS_WITHOUT_REFERENCE = {"format": 0.03, "safety": 0.0, "parse": 0.03, "schema_link": 0.1, "executes": 0.09,
                             "question_match": 0.55, "result_shape": 0.2}
ERROR_PAID = 0.5  # what a query that fails or times out keeps of its form: below any query that runs
MAX_SQL_LINES = 60  # the longest reference query has 12 lines
MAX_SQL_CHARS = 4_000
SQL_START = re.compile(r"\b(SELECT|WITH)\b", re.I)
# A text that opens with any statement verb is SQL from its first word: nothing is cut, so
# "CREATE TABLE t AS SELECT ..." is judged (and refused) whole.
STATEMENT_VERB = re.compile(
    r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|ATTACH|DETACH|VACUUM|BEGIN|COMMIT|"
    r"ROLLBACK|REINDEX|ANALYZE|EXPLAIN|SAVEPOINT|RELEASE|VALUES)\b", re.I)
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
    # A query is at most MAX_SQL_LINES lines and MAX_SQL_CHARS characters: what runs past them is
    # not part of it, and the search stays bounded (each try re-parses the prefix).
    if len(lines) > MAX_SQL_LINES or len(sql) > MAX_SQL_CHARS:
        lines = _bounded(lines)
    while len(lines) > 1 and not check_readonly("\n".join(lines)).parsed:
        lines.pop()
    sql = "\n".join(lines).strip().rstrip(";").strip()
    wrapped = thought.think is not None or fenced or sql != completion.strip().rstrip(";").strip()
    return sql, wrapped


def _bounded(lines: list[str]) -> list[str]:
    kept, size = [], 0
    for line in lines[:MAX_SQL_LINES]:
        size += len(line) + 1
        if size > MAX_SQL_CHARS:
            break
        kept.append(line)
    return kept or [lines[0][:MAX_SQL_CHARS]]


def schema_link(tree: exp.Expression) -> tuple[float, str]:
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables = [t.name.lower() for t in tree.find_all(exp.Table) if t.name]
    real = [t for t in tables if t not in cte_names]
    aliases = {a.alias.lower() for a in tree.find_all(exp.Alias) if a.alias} | cte_names
    aliases |= {str(col).lower() for cte in tree.find_all(exp.CTE) for col in (cte.args.get("alias").columns if cte.args.get("alias") else [])}
    known = set().union(*(TABLES[t] for t in real if t in TABLES)) if any(t in TABLES for t in real) else SCHEMA_COLUMN_NAMES
    columns = [c.name.lower() for c in tree.find_all(exp.Column) if c.name and c.name != "*"]
    checked_columns = [c for c in columns if c not in aliases]
    good = sum(t in TABLES for t in real) + sum(c in known for c in checked_columns)
    total = len(real) + len(checked_columns)
    if total == 0:
        return 0.5, "no table or column referenced"
    bad = [t for t in real if t not in TABLES] + [c for c in checked_columns if c not in known]
    return good / total, "all names exist" if not bad else f"unknown names: {', '.join(sorted(set(bad))[:5])}"


IDENTIFIER = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", re.I)
KNOWN_NAMES = frozenset(TABLES) | SCHEMA_COLUMN_NAMES


def identifier_link(sql: str) -> tuple[float, str]:
    """For SQL that does not parse: the share of snake_case identifiers that are real names."""
    names = IDENTIFIER.findall(sql)
    if not names:
        return 0.0, "no identifiers"
    good = sum(n.lower() in KNOWN_NAMES for n in names)
    return 0.5 * good / len(names), f"unparsed; {good}/{len(names)} identifiers are schema names"


_STORE_NAMES: dict[tuple[str, float], frozenset[str]] = {}


def store_names(db_path: Path, timeout_s: float) -> frozenset[str]:
    """The store's product category names written as one word ("musica", "bebidas"): values a
    question may name that no pattern tells from any other word (snake_case ones are found by
    their form). Read from the store's database once per version of its file; none where it
    cannot be read, so a question's cues are then what its words alone say."""
    try:
        key = (str(db_path), db_path.stat().st_mtime)
    except OSError:
        return frozenset()
    if key not in _STORE_NAMES:
        result = execute_readonly(db_path, f"SELECT DISTINCT product_category_name FROM {PRODUCTS}", timeout_s=timeout_s,
                                  row_cap=10_000)
        if result.error:
            return frozenset()
        _STORE_NAMES.clear()
        _STORE_NAMES[key] = frozenset(row[0].lower() for row in result.rows if isinstance(row[0], str) and row[0].isalpha())
    return _STORE_NAMES[key]


def _normalised(row: tuple) -> tuple:
    """Numbers (booleans too) as floats to 4 places, so 3, 3.0 and 3.00001 are one value."""
    return tuple(round(float(v), 4) if isinstance(v, (int, float)) else v for v in row)


_REFERENCE_RESULTS: dict[tuple, tuple[tuple[tuple, ...], bool]] = {}


def _reference_result(db_path: str, sql: str, timeout_s: float, row_cap: int) -> tuple[tuple[tuple, ...], bool] | str:
    """The reference's rows and whether order counts, or why it could not be run. Only results are
    kept: a reference that failed (a time-out under load, say) is run again next time."""
    key = (db_path, sql, timeout_s, row_cap)
    if key in _REFERENCE_RESULTS:
        return _REFERENCE_RESULTS[key]
    checked = check_readonly(sql)
    if not checked.ok:
        return f"the reference is refused: {checked.reason}"
    result = execute_readonly(Path(db_path), sql, timeout_s=timeout_s, row_cap=row_cap)
    if result.error:
        return f"the reference failed: {result.error}"
    if len(_REFERENCE_RESULTS) >= 4096:
        _REFERENCE_RESULTS.clear()
    _REFERENCE_RESULTS[key] = (tuple(map(_normalised, result.rows)), checked.tree.args.get("order") is not None)
    return _REFERENCE_RESULTS[key]


def _canonical(row: tuple) -> tuple:
    """A row with its values in a fixed order, so a permutation of the columns still matches."""
    return tuple(sorted(row, key=lambda v: (type(v).__name__, str(v))))


def _values_hash(row: tuple) -> int:
    """The same for any order of a row's values: rows whose hashes differ cannot be one canonical row."""
    return sum(map(hash, row))


def execution_match(rows: list[tuple], expected: tuple[tuple, ...], ordered: bool) -> tuple[float, str]:
    """`rows` as the query returned them, `expected` normalised. Only rows that may equal a
    reference row (as wide, the same values' hash) are normalised and put in canonical order
    (doing so for every value of a 1,000-row `SELECT *` took most of a score); the others count
    toward the union alone."""
    widths = {len(row) for row in expected}
    predicted = [_normalised(row) for row in rows if len(row) in widths]
    if ordered and len(predicted) == len(rows) and predicted == list(expected):
        return 1.0, "same rows in the same order"
    e = Counter(map(_canonical, expected))
    hashes = set(map(_values_hash, expected))
    p = Counter(_canonical(row) for row in predicted if _values_hash(row) in hashes)
    matched = sum((p & e).values())
    if matched == len(rows) == len(expected):
        return (0.8, "same rows, wrong order") if ordered else (1.0, "same bag of rows")
    union = len(rows) + len(expected) - matched
    return 0.5 * matched / union if union else 0.0, f"{matched} of {len(expected)} reference rows matched"


def result_shape(result: QueryResult, cues: Cues) -> tuple[float, str]:
    """Whether the result has the shape the question asks for: rows at all, one number for a
    count or an average, as many rows as a ranking of N asks, a row per group, and not a spread
    of figures the question did not ask for."""
    rows = result.rows
    if not rows or all(all(v is None for v in row) for row in rows):
        return 0.0, "empty or NULL result"
    columns = len(result.columns)
    wanted_columns = max(1, len(cues.aggregates)) + (1 if cues.grouped or cues.ranked or cues.entity else 0)
    if columns > wanted_columns + 1:
        return 0.25, f"{columns} columns where the question asks for {wanted_columns}"
    if cues.count is not None:
        return (1.0, f"{len(rows)} rows for a ranking of {cues.count}") if len(rows) == cues.count or (
            0 < len(rows) < cues.count and not result.truncated) else (0.25, f"{len(rows)} rows where {cues.count} are asked for")
    if cues.grouped:
        return (1.0, f"{len(rows)} groups") if len(rows) > 1 else (0.5, "one row where a row per group is asked for")
    if cues.aggregates and not cues.ranked:
        return (1.0, "one figure, as asked") if len(rows) == 1 else (0.25, f"{len(rows)} rows where one figure is asked for")
    return 1.0, f"{len(rows)} rows"


def valid(components: dict[str, float], details: dict[str, str]) -> bool:
    """A safe query that ran, whatever it answers."""
    return components["safety"] == 1.0 and not details.get("executes", "error").startswith("error")


def score(completion: str, reference: dict | None, question: str, db_path: Path, timeout_s: float,
          row_cap: int) -> tuple[dict, dict, dict, object]:
    """`question`: what the task input asks; the query runs on the DB at `db_path` within `timeout_s` and `row_cap` rows."""
    sql, wrapped = extract_sql(completion)
    weights = WEIGHTS_WITH_REFERENCE if reference else WEIGHTS_WITHOUT_REFERENCE
    components = dict.fromkeys(weights, 0.0)
    components["format"] = 0.5 if wrapped else 1.0
    details = {"format": "SQL was wrapped in think/fences/prose" if wrapped else "bare SQL"}
    expected = _reference_result(str(db_path), reference["sql"], timeout_s, row_cap) if reference else None
    if reference and not isinstance(expected, str):
        components["reference_ran"] = 1.0
    if not sql:
        details["safety"] = "no SQL found"
        components["format"] = 0.0
        return components, weights, details, None
    checked = check_readonly(sql)
    details["safety"] = checked.reason
    if not checked.parsed:  # partial credit for naming real tables and columns
        components["schema_link"], details["schema_link"] = identifier_link(sql)
        components["format"] *= ERROR_PAID
        return components, weights, details, sql
    if not checked.ok:  # refused: a write or anything but one SELECT earns nothing at all
        return dict.fromkeys(weights, 0.0), weights, details, sql
    components["safety"] = components["parse"] = 1.0
    components["schema_link"], details["schema_link"] = schema_link(checked.tree)
    result = execute_readonly(db_path, sql, timeout_s=timeout_s, row_cap=row_cap)
    if result.error:
        details["executes"] = f"error: {result.error}"
        # an error or a time-out earns less than any query that runs, so RL is never led to one
        paid = {k: v * ERROR_PAID for k, v in components.items()}
        if reference:
            paid["reference_ran"] = components["reference_ran"]
        return paid, weights, details, sql
    components["executes"] = 1.0
    details["executes"] = f"{len(result.rows)} rows" + (" (capped)" if result.truncated else "")
    if not reference:
        cues = question_cues(question, KNOWN_NAMES, store_names(db_path, timeout_s))
        used = {t.name.lower() for t in checked.tree.find_all(exp.Table)} & set(TABLES)
        match, details["question_match"] = question_match(cues, checked.tree, used)
        shape, details["result_shape"] = result_shape(result, cues)
        # an answer to the question has its shape, and the shape of an answer to another question is worth nothing
        components["question_match"] = components["result_shape"] = match * shape
        components["schema_link"] *= match  # reference-free credit only for what the question asks
        return components, weights, details, sql
    if is_constant(checked.tree):
        details["execution_match"] = "the result is a constant: it does not come from the data"
    elif isinstance(expected, str):
        # undecided, not wrong: `reference_ran` says so, and the next scoring runs the reference again
        details["execution_match"] = f"{expected}; content not scored"
    else:
        components["execution_match"], details["execution_match"] = execution_match(result.rows, *expected)
    return components, weights, details, sql
