"""The read-only SQL sandbox: the only way anything of ours executes SQL that a model wrote.

Two layers. Before execution, sqlglot must parse exactly one statement that is a SELECT (or a
set operation / WITH over SELECTs) with no write, DDL, PRAGMA, ATTACH, transaction or command
node anywhere in its tree. During execution, the DB is opened `mode=ro` with `query_only`, an
authorizer that allows only reads and non-extension functions, length limits, a wall-clock
deadline enforced by a progress handler (a runaway recursive CTE is interrupted) and a row cap.
The time limit and the row cap are the caller's (an operator's settings), never defaults here.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # unsupported syntax is refused; no need to log it

MAX_SQL_CHARS = 20_000
# sqlglot reads `a JOIN b JOIN c ON .. ON ..` (nested joins) by backtracking, so a chain of JOINs
# without ON costs twice as much with each JOIN: 0.03 s for 12, 0.5 s for 16, and 810 s for one
# sampled completion of 26 (docs/results.md, 2026-12-06). No query over the store's nine tables
# needs more than 12; the tokens are counted first, in time linear in the text.
MAX_JOINS = 12
SQLITE = Dialect.get_or_raise("sqlite")
FORBIDDEN_NODES = (
    exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Create, exp.Drop, exp.Alter, exp.TruncateTable,
    exp.Pragma, exp.Attach, exp.Detach, exp.Command, exp.Transaction, exp.Commit, exp.Rollback, exp.Set,
    exp.Use, exp.Into, exp.Copy, exp.LoadData, exp.Analyze,
)
READ_ONLY_ROOTS = (exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Subquery)
ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
FORBIDDEN_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


@dataclass(frozen=True)
class Checked:
    ok: bool
    reason: str
    tree: exp.Expression | None = None  # the single statement's tree, when there is one
    parsed: bool = True  # False only when the text is not SQL that sqlglot can read


def check_readonly(sql: str) -> Checked:
    if len(sql) > MAX_SQL_CHARS:
        return Checked(False, f"statement longer than {MAX_SQL_CHARS} characters", parsed=False)
    try:
        tokens = SQLITE.tokenize(sql)
        joins = sum(token.token_type == TokenType.JOIN for token in tokens)
        if joins > MAX_JOINS:
            return Checked(False, f"{joins} JOINs; at most {MAX_JOINS} are read", parsed=False)
        statements = [s for s in SQLITE.parser().parse(tokens, sql) if s is not None]
    except (ParseError, TokenError, RecursionError, ValueError) as error:
        return Checked(False, f"does not parse: {str(error).splitlines()[0][:120] if str(error) else type(error).__name__}", parsed=False)
    if not statements:
        return Checked(False, "no statement", parsed=False)
    if len(statements) != 1:
        return Checked(False, f"{len(statements)} statements; exactly one SELECT is allowed")
    tree = statements[0]
    if not isinstance(tree, READ_ONLY_ROOTS):
        return Checked(False, f"{tree.key.upper()} is not a SELECT", tree)
    for node in tree.walk():
        if isinstance(node, FORBIDDEN_NODES):
            return Checked(False, f"{node.key.upper()} is not allowed in a read-only query", tree)
        if isinstance(node, exp.Anonymous) and str(node.this).lower() in FORBIDDEN_FUNCTIONS:
            return Checked(False, f"function {node.this} is not allowed", tree)
    return Checked(True, "single read-only SELECT", tree)


@dataclass
class QueryResult:
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    truncated: bool = False
    error: str | None = None
    seconds: float = 0.0


def _authorize(action, arg1, arg2, db_name, trigger):
    if action not in ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in FORBIDDEN_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


_local = threading.local()


def _connection(db_path: Path) -> sqlite3.Connection:
    cache = getattr(_local, "connections", None)
    if cache is None:
        cache = _local.connections = {}
    key = str(db_path)
    con = cache.get(key)
    if con is None:
        if not Path(db_path).is_file():
            raise FileNotFoundError(f"commerce DB not found at {db_path}")
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, check_same_thread=False)
        con.execute("PRAGMA query_only = ON")
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
        con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 2)
        con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        con.set_authorizer(_authorize)
        cache[key] = con
    return con


def execute_readonly(db_path: Path, sql: str, timeout_s: float, row_cap: int) -> QueryResult:
    """Run an already checked SELECT; never raises for anything the SQL does."""
    con = _connection(db_path)
    deadline = time.perf_counter() + timeout_s
    con.set_progress_handler(lambda: 1 if time.perf_counter() > deadline else 0, 2000)
    started = time.perf_counter()
    try:
        cursor = con.execute(sql)
        rows = cursor.fetchmany(row_cap + 1)
        columns = [d[0] for d in cursor.description or ()]
        cursor.close()
    except (sqlite3.Error, OverflowError, ValueError, MemoryError, RecursionError) as error:
        elapsed = time.perf_counter() - started
        message = "time limit exceeded" if "interrupted" in str(error) else str(error)[:200]
        return QueryResult(error=message, seconds=elapsed)
    finally:
        con.set_progress_handler(None, 0)
    return QueryResult(columns, rows[:row_cap], len(rows) > row_cap, None, time.perf_counter() - started)


def run_readonly(db_path: Path, sql: str, timeout_s: float, row_cap: int) -> QueryResult:
    """Check, then execute: what the gateway's `execute: true` uses."""
    checked = check_readonly(sql)
    if not checked.ok:
        return QueryResult(error=f"refused: {checked.reason}")
    return execute_readonly(db_path, sql, timeout_s, row_cap)
