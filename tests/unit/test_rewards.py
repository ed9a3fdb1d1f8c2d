"""rewards/ as pure functions: ranges, robustness, wrappers, corruption ordering, each push rule,
the SQL reward and its sandbox over a small commerce DB, the TRL reward functions."""
from __future__ import annotations

import copy
import dataclasses
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tasks
from common.records import RewardContext
from demo.commerce_db import file_sha256
from rewards.parsing import parse_json_object, split_think
from rewards.references import InvalidReference
from rewards.scoring import Score
from rewards.sql_question import PARTIAL_VALUES_PAID, question_intent
from rewards.sql_sandbox import check_readonly, run_readonly
from tasks import TASKS, check_reference
from tests.unit.conftest import ctx
from trainer.grpo_reward import StepLog, gdpo_values, reward_function

EXTRACTION_REF = {
    "sentiment": "negative", "sentiment_score": 1.5, "complaint_category": "delivery_delay",
    "product_mentioned": "fone de ouvido", "delivery_issue": True, "would_recommend": False, "urgency": "high",
    "key_phrases": ["ainda não chegou", "prazo de entrega estourado"],
    "summary": "Cliente reclama do atraso na entrega do fone de ouvido.", "requires_response": True,
}
REVIEW = "O fone de ouvido ainda não chegou, prazo de entrega estourado. Não recomendo."
PUSH_CONTEXT = {"campaign": "cupom", "customer_name": "Ana", "product": "mochila", "discount_pct": 15, "coupon": "VOLTA10"}
PUSH_REF = {"title": "Ana, tem cupom pra você 🎉", "body": "15% off em mochila. Use o cupom VOLTA10 e aproveite."}
SQL_REF = "SELECT customer_state, COUNT(*) AS n FROM olist_customers_dataset GROUP BY customer_state ORDER BY n DESC LIMIT 5"
ROWS = {"question": "Quais estados vendem mais?", "columns": ["estado", "receita"], "rows": [["SP", 293568.79], ["RJ", 86627.69], ["MG", 82682.02]]}
INSIGHT = ("<think>\nSP lidera.\n</think>\n\nResumo: SP lidera com receita de 293.568,79.\n"
           "- RJ vem depois com 86.627,69.\n- MG soma 82682,02.\nRecomendação: priorizar campanhas em SP e testar frete menor em MG.")

REFERENCE_ANSWERS = {
    "extraction": (json.dumps(EXTRACTION_REF, ensure_ascii=False), EXTRACTION_REF, {"review": REVIEW}),
    "push": (json.dumps(PUSH_REF, ensure_ascii=False), PUSH_REF, PUSH_CONTEXT),
    "sql": (SQL_REF, {"sql": SQL_REF}, {}),
    "insights": (INSIGHT, None, ROWS),
}


def score(task: str, completion: str, reference=None, context: dict | None = None):
    """tasks.score with the small DB and the query limits in the context, as the service passes them."""
    return tasks.score(task, completion, reference, ctx(task, **context) if context else ctx())


def _check_ranges(result):
    assert 0.0 <= result.total <= 1.0
    assert result.components and all(0.0 <= v <= 1.0 for v in result.components.values())


# --- robustness -------------------------------------------------------------------------

nasty_text = st.one_of(
    st.text(max_size=400),
    st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(0, 5000)),
    st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(0, 3000)),
    st.sampled_from([
        "", " ", "<think>", "</think>", "<think></think>", "```", "```json\n{", "{'sentiment': None,}", "{}",
        "SELECT", "SELECT * FROM sqlite_master", "'; DROP TABLE olist_orders_dataset; --", "\x00\x01\ufffd",
        "SELECT 1 UNION SELECT load_extension('/tmp/x')", "null", "[]", "1e999", "{\"title\": 1e999}",
        "🎉" * 500, "ÁÉÍÓÚ" * 300, "\u202e\u200b\u2028", "{\"sentiment_score\": NaN}",
        '{"title": "a\\ud800", "body": "Confira \\udfff"}', '{"summary": "\\ud83d", "key_phrases": ["\\udc00"]}',
    ]),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.sampled_from(TASKS), text=nasty_text, with_reference=st.booleans())
def test_any_text_gets_a_score_in_range(task, text, with_reference):
    _completion, reference, context = REFERENCE_ANSWERS[task]
    result = score(task, text, reference if with_reference else None, context)
    _check_ranges(result)


def test_huge_input_is_scored():
    for task in TASKS:
        _check_ranges(score(task, "x" * 2_000_000))
        _check_ranges(score(task, "{" * 200_000))


# --- wrappers keep content; corruption never helps ---------------------------------------

def _wrappers(text: str) -> list[str]:
    return [
        f"<think>\nVou analisar.\n</think>\n{text}",
        f"```json\n{text}\n```",
        f"Claro! Aqui está:\n{text}\nEspero ter ajudado.",
        f"Raciocínio curto.</think>\n\n```\n{text}\n```",
    ]


@pytest.mark.parametrize("task", ["extraction", "push", "sql"])
def test_wrapped_correct_answer_keeps_its_content_score(task):
    completion, reference, context = REFERENCE_ANSWERS[task]
    clean = score(task, completion, reference, context)
    assert clean.total == 1.0, clean.details
    content_key = {"extraction": "content", "push": "reference_overlap", "sql": "execution_match"}[task]
    for wrapped in _wrappers(completion):
        result = score(task, wrapped, reference, context)
        assert result.components[content_key] == clean.components[content_key], (wrapped, result.details)
        assert result.total < clean.total or result.total == 1.0


def test_ptbr_decimal_comma_and_quirky_json_are_understood():
    quirky = json.dumps(EXTRACTION_REF, ensure_ascii=False).replace('"sentiment_score": 1.5', '"sentiment_score": 1,5')
    result = score("extraction", quirky, EXTRACTION_REF, {"review": REVIEW})
    assert result.components["content"] == 1.0 and result.components["format"] == 1.0  # never penalised
    as_string = quirky.replace("1,5", '"1,5"')
    assert score("extraction", as_string, EXTRACTION_REF).components["content"] == 1.0
    python_style = ("{'sentiment': 'negative', 'sentiment_score': 1.5, 'complaint_category': 'delivery_delay', "
                    "'product_mentioned': 'fone de ouvido', 'delivery_issue': True, 'would_recommend': False, "
                    "'urgency': 'high', 'key_phrases': ['ainda não chegou', 'prazo de entrega estourado',], "
                    "'summary': 'Cliente reclama do atraso na entrega do fone de ouvido.', 'requires_response': True,}")
    result = score("extraction", python_style, EXTRACTION_REF)
    assert result.components["content"] == 1.0 and result.components["format"] == 0.5
    # a comma inside a string is left alone
    parsed = parse_json_object('{"summary": "nota 4,5 de 5", "sentiment_score": 4,5}').value
    assert parsed == {"summary": "nota 4,5 de 5", "sentiment_score": 4.5}


def test_think_block_variants():
    assert split_think("<think>a</think> b").answer == "b"
    assert split_think("a</think>b").think == "a"
    twice = split_think("<think>a</think>b</think> c")
    assert twice.think == "a</think>b" and twice.answer == "c"
    unclosed = split_think("<think>pensando sem parar")
    assert not unclosed.closed and unclosed.answer == ""
    assert score("insights", "<think>pensando sem parar", None, ROWS).components["thinking"] == 0.0
    long_think = "<think>" + "hmm " * 2000 + "</think>Resumo curto."
    assert score("insights", long_think, None, ROWS).components["thinking"] < 0.3


def _extraction_corruptions() -> list[dict]:
    out = []
    for field, bad in [("sentiment", "positive"), ("sentiment", "furious"), ("sentiment_score", 5.0),
                       ("sentiment_score", 9), ("complaint_category", "price"), ("product_mentioned", None),
                       ("delivery_issue", False), ("delivery_issue", "sim"), ("would_recommend", True),
                       ("urgency", "low"), ("key_phrases", []), ("key_phrases", ["a"] * 7), ("summary", "x" * 300),
                       ("summary", "Outra coisa."), ("requires_response", False)]:
        variant = copy.deepcopy(EXTRACTION_REF)
        variant[field] = bad
        out.append(variant)
    for field in EXTRACTION_REF:
        variant = copy.deepcopy(EXTRACTION_REF)
        del variant[field]
        out.append(variant)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(variant=st.sampled_from(_extraction_corruptions()), with_reference=st.booleans())
def test_correct_extraction_beats_every_corruption(variant, with_reference):
    reference = EXTRACTION_REF if with_reference else None
    best = score("extraction", json.dumps(EXTRACTION_REF, ensure_ascii=False), reference, {"review": REVIEW})
    worse = score("extraction", json.dumps(variant, ensure_ascii=False), reference, {"review": REVIEW})
    assert best.total >= worse.total


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 200), noise=st.text(max_size=20))
def test_correct_answer_beats_truncated_or_noisy_variants(cut, noise):
    for task in TASKS:
        completion, reference, context = REFERENCE_ANSWERS[task]
        best = score(task, completion, reference, context).total
        truncated = completion[: max(0, len(completion) - cut - 1)]
        assert best >= score(task, truncated, reference, context).total
        spliced = completion[: len(completion) // 2] + noise + completion[len(completion) // 2 + 3:]
        assert best >= score(task, spliced, reference, context).total


@pytest.mark.parametrize("variant,component", [
    ({"title": "ANA, PROMOÇÃO IMPERDÍVEL!! 🎉🎉🎉", "body": PUSH_REF["body"]}, "caps"),
    ({"title": PUSH_REF["title"], "body": "Use o cupom e aproveite. " * 3 + "15% off em mochila."}, "key_info_early"),
    ({"title": "Oi, tem cupom", "body": "15% off hoje. Aproveite."}, "personalised"),
    ({"title": PUSH_REF["title"], "body": "15% off em mochila com cupom VOLTA10."}, "action_verb"),
    ({"title": PUSH_REF["title"], "body": "15% off em mochila!! Aproveite."}, "exclamations"),
    ({"title": "Ana, " + "x" * 60, "body": PUSH_REF["body"]}, "title_length"),
    ({"title": PUSH_REF["title"], "body": "15% off em mochila. " + "Aproveite muito. " * 12}, "body_length"),
    ({"title": "Ana 🎉🔥⭐📦", "body": PUSH_REF["body"]}, "emoji"),
    ({"title": "Ana, your coupon", "body": "15% off the mochila. Check it out with the coupon and enjoy the deal."}, "ptbr"),
    ({"title": PUSH_REF["title"], "body": PUSH_REF["body"], "extra": "x" * 5000}, "payload_bytes"),
])
def test_each_push_rule_is_its_own_component(variant, component):
    good = score("push", json.dumps(PUSH_REF, ensure_ascii=False), None, PUSH_CONTEXT)
    bad = score("push", json.dumps(variant, ensure_ascii=False), None, PUSH_CONTEXT)
    assert bad.components[component] < good.components[component] == 1.0
    assert bad.total < good.total


def test_escaped_lone_surrogates_are_read_as_replacement_characters():
    # "\ud800" is valid JSON text but no UTF-8 string: an answer holding one must still be scored,
    # recorded and returned, so it reads as U+FFFD (a surrogate pair stays the character it spells)
    value = parse_json_object('{"title": "Oi \\ud800", "body": "Confira \\ud83c\\udf89 \\udfff"}').value
    assert value == {"title": "Oi \ufffd", "body": "Confira 🎉 \ufffd"}
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    result = score("push", '{"title": "Ana, \\ud800", "body": "Confira o fone com 20% off"}', None, PUSH_CONTEXT)
    assert result.valid and result.details["format"] == "clean JSON" and result.details["payload_bytes"].endswith(" bytes")


def test_push_payload_counts_bytes_not_characters():
    emoji_heavy = {"title": "Ana", "body": "🎉" * 1100}  # 1,100 characters, 4,400 bytes
    assert score("push", json.dumps(emoji_heavy, ensure_ascii=False), None, PUSH_CONTEXT).components["payload_bytes"] == 0.0


def test_insights_grounding_catches_invented_numbers():
    invented = INSIGHT.replace("293.568,79", "999.999,00").replace("86.627,69", "12.345,67")
    good, bad = score("insights", INSIGHT, None, ROWS), score("insights", invented, None, ROWS)
    assert good.components["grounding"] == 1.0 and bad.components["grounding"] < 0.5
    english = "Summary: SP leads with 293568.79 in revenue.\n- RJ is next.\nWe recommend focusing on SP."
    assert score("insights", english, None, ROWS).components["ptbr"] < 0.5
    assert score("insights", INSIGHT, None, ROWS).reference_used is False


CITIES = {"question": "Quais cidades fazem mais pedidos?", "columns": ["cidade", "pedidos"],
          "rows": [["sorocaba", 203], ["santos", 202], ["santo andre", 191], ["sao paulo", 190], ["guarulhos", 182],
                   ["campinas", 172], ["duque de caxias", 111], ["nova iguacu", 108], ["rio de janeiro", 106], ["niteroi", 105]]}
CITIES_ANALYSIS = ("<think>\nOs maiores: sorocaba, santos, santo andre.\n</think>\n\n"
                   "Resumo: sorocaba lidera em pedidos com 203, à frente de santos (202) e santo andre (191).\n"
                   "- sorocaba: pedidos de 203.\n- santos: pedidos de 202.\n- santo andre: pedidos de 191.\n"
                   "- Na outra ponta, niteroi tem pedidos de 105.\n"
                   "Recomendação: reforçar a entrega expressa nas cidades que mais compram.")


def test_insights_pays_nothing_for_lines_that_repeat_an_earlier_one():
    """A half-trained model loops until the token limit, its figures counting up or not (seen in
    bench learn's insights candidates); each repeated line dilutes what the answer is paid."""
    once = score("insights", CITIES_ANALYSIS, None, CITIES)
    assert once.total > 0.95 and "paid" not in once.details
    looped = CITIES_ANALYSIS.replace("Recomendação", "\n".join(["- Na outra ponta, niteroi tem pedidos de 105."] * 30) + "\nRecomendação")
    counting = CITIES_ANALYSIS.replace("Recomendação", "\n".join(f"- Na outra ponta, santos tem pedidos de {n}." for n in range(203, 233))
                                       + "\nRecomendação")
    for answer, repeated in ((looped, 30), (counting, 29)):  # the first line of the count is new
        result = score("insights", answer, None, CITIES)
        assert result.total < 0.2 * once.total, result.details
        assert result.details["repetition"] == f"{repeated} of 36 lines repeat an earlier one"


def test_insights_pays_a_listing_of_a_long_table_less_than_an_analysis_that_selects():
    every_row = ("<think>\nListo.\n</think>\n\nResumo: os pedidos por cidade.\n"
                 + "\n".join(f"- {city} tem pedidos de {n}." for city, n in CITIES["rows"]) + "\nRecomendação: priorizar as maiores.")
    listing = score("insights", every_row, None, CITIES)
    assert listing.details["selection"] == "names 10 of 10 rows: lists the data (an analysis names at most 5)"
    analysis = score("insights", CITIES_ANALYSIS, None, CITIES)
    assert analysis.details["selection"] == "names 4 of 10 rows" and listing.components["grounding"] < 0.25
    # (5/10)^2 for naming every row, a half for relating none of them (below)
    assert listing.details["paid"] == "every component paid at 0.12 (repetition, selection, claims)"
    assert listing.total <= 0.2 * analysis.total
    six = {**CITIES, "rows": CITIES["rows"][:6]}
    assert score("insights", every_row, None, six).details["selection"].startswith("names 6 of 6 rows: lists the data")
    short_table = {**CITIES, "rows": CITIES["rows"][:3]}
    whole = ("<think>\nTrês cidades.\n</think>\n\nResumo: sorocaba lidera em pedidos com 203.\n- santos: pedidos de 202.\n"
             "- santo andre: pedidos de 191.\nRecomendação: priorizar sorocaba.")
    assert score("insights", whole, None, short_table).details["selection"] == "names 3 of 3 rows"  # a short table may be named whole


def test_insights_pays_half_for_rows_restated_that_no_sentence_relates():
    """A short table restated row by row cites every figure and names every row, as an analysis
    does; what it lacks is a sentence that places a row among the others."""
    short_table = {**CITIES, "rows": CITIES["rows"][:4]}
    restated = ("<think>\nOs dados.\n</think>\n\nOs pedidos por cidade:\n"
                + "\n".join(f"- {city} tem pedidos de {n}." for city, n in short_table["rows"]) + "\nRecomendação: priorizar as vendas.")
    related = restated.replace("- sorocaba tem pedidos de 203.", "- sorocaba lidera, com pedidos de 203.")
    plain, ranked = score("insights", restated, None, short_table), score("insights", related, None, short_table)
    assert plain.details["claims"].endswith("(it restates the data: no row is placed among the others)")
    assert "claims" in plain.details["paid"]
    assert ranked.details["claims"] == "1 true, 0 false" and "paid" not in ranked.details
    assert plain.total == pytest.approx(0.5 * ranked.total, abs=0.02)
    # the ranking word and the row must share a sentence: a word of rank about no row relates nothing
    apart = restated.replace("Os pedidos por cidade:", "As maiores cidades lideram os pedidos:")
    assert score("insights", apart, None, short_table).details["claims"].endswith("no row is placed among the others)")


def _naive_execution_match(rows: list[tuple], expected: tuple[tuple, ...], ordered: bool) -> tuple[float, str]:
    """The comparison as first written: every row normalised and canonical, bags compared whole."""
    from collections import Counter

    def canonical(row):
        return tuple(sorted(row, key=lambda v: (type(v).__name__, str(v))))

    predicted = [tuple(round(float(v), 4) if isinstance(v, (int, float)) else v for v in row) for row in rows]
    if ordered and predicted == list(expected):
        return 1.0, ""
    p, e = Counter(map(canonical, predicted)), Counter(map(canonical, expected))
    if p == e:
        return (0.8 if ordered else 1.0), ""
    union = sum((p | e).values())
    return (0.5 * sum((p & e).values()) / union if union else 0.0), ""


SQL_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 2.00001, 2.5, -0.0]), st.sampled_from(["SP", "RJ", "1"]))


@settings(max_examples=150, deadline=None)
@given(expected=st.lists(st.lists(SQL_VALUES, min_size=1, max_size=3).map(tuple), max_size=6),
       extra=st.lists(st.lists(SQL_VALUES, min_size=1, max_size=4).map(tuple), max_size=6),
       keep=st.lists(st.booleans(), max_size=6), ordered=st.booleans(), shuffle=st.randoms(use_true_random=False))
def test_execution_match_scores_as_the_whole_bag_comparison_does(expected, extra, keep, ordered, shuffle):
    """Normalising and sorting only rows that may match (as wide, the same values' hash) changes
    no score: reference rows, some kept, some with their values permuted, among rows of any width."""
    from rewards.sql import _normalised, execution_match

    normalised = tuple(map(_normalised, expected))
    rows = [row if not flip else tuple(shuffle.sample(row, len(row))) for row, flip in zip(expected, keep + [False] * len(expected))]
    rows = [row for row, kept in zip(rows, keep + [True] * len(rows)) if kept] + extra
    if shuffle.random() < 0.5:
        shuffle.shuffle(rows)
    assert execution_match(rows, normalised, ordered)[0] == pytest.approx(_naive_execution_match(rows, normalised, ordered)[0])
    assert execution_match(list(expected), normalised, ordered)[0] == 1.0


def test_sql_scores_reference_free_and_with_reference():
    with_ref = score("sql", "SELECT customer_state, COUNT(*) FROM olist_customers_dataset GROUP BY 1 ORDER BY 2 DESC LIMIT 5", SQL_REF)
    assert with_ref.components["execution_match"] == 1.0 and with_ref.reference_used
    wrong_order = score("sql", "SELECT customer_state, COUNT(*) AS n FROM olist_customers_dataset GROUP BY 1 ORDER BY n ASC LIMIT 5", SQL_REF)
    assert wrong_order.components["execution_match"] < 1.0
    bag = "SELECT order_status, COUNT(*) FROM olist_orders_dataset GROUP BY order_status"
    reordered = "SELECT COUNT(*), order_status FROM olist_orders_dataset GROUP BY order_status ORDER BY 1"
    assert score("sql", reordered, {"sql": bag}).components["execution_match"] == 1.0  # a bag: order and column order free
    free = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset", None, {"question": "Quantos pedidos existem no total?"})
    assert not free.reference_used and "execution_match" not in free.components and free.total == 1.0
    bad_names = score("sql", "SELECT colour FROM olist_ordersz")
    assert bad_names.components["schema_link"] == 0.0 and bad_names.components["executes"] == 0.0


# --- the SQL sandbox --------------------------------------------------------------------

FORBIDDEN = [
    "DELETE FROM olist_orders_dataset",
    "UPDATE olist_orders_dataset SET order_status = 'x'",
    "INSERT INTO olist_orders_dataset (order_id) VALUES ('x')",
    "REPLACE INTO olist_sellers_dataset VALUES ('a', 'b', 'c', 'd')",
    "DROP TABLE olist_orders_dataset",
    "ALTER TABLE olist_orders_dataset ADD COLUMN x",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t AS SELECT 1",
    "CREATE VIEW v AS SELECT 1",
    "PRAGMA writable_schema = ON",
    "PRAGMA table_info(olist_orders_dataset)",
    "ATTACH DATABASE '/tmp/evil.db' AS evil",
    "DETACH DATABASE main",
    "SELECT 1; DELETE FROM olist_orders_dataset",
    "SELECT 1; SELECT 2",
    "SELECT load_extension('/tmp/evil.so')",
    "VACUUM",
    "VACUUM INTO '/tmp/copy.db'",
    "BEGIN TRANSACTION",
    "SELECT * INTO copy FROM olist_orders_dataset",
    "REINDEX",
    "ANALYZE",
    "WITH x AS (SELECT 1) DELETE FROM olist_orders_dataset",
]


@pytest.mark.parametrize("statement", FORBIDDEN)
def test_forbidden_statements_are_refused_unexecuted(small_commerce_db, statement):
    before = file_sha256(small_commerce_db)
    assert not check_readonly(statement).ok
    result = run_readonly(small_commerce_db, statement, timeout_s=1.0, row_cap=1000)
    assert result.error and result.error.startswith("refused")
    scored = score("sql", statement, SQL_REF)
    assert scored.total == 0.0 and scored.components["safety"] == 0.0 and scored.components["executes"] == 0.0
    assert file_sha256(small_commerce_db) == before


def test_runaway_queries_are_stopped_within_the_limit(small_commerce_db):
    runaway = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"
    started = time.perf_counter()
    result = run_readonly(small_commerce_db, runaway, timeout_s=0.2, row_cap=1000)
    assert result.error == "time limit exceeded"
    assert time.perf_counter() - started < 1.7
    blowup = "WITH RECURSIVE r(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM r) SELECT length(x) FROM r"
    assert run_readonly(small_commerce_db, blowup, timeout_s=2.0, row_cap=1000).error  # length limit, not memory exhaustion
    cross = "SELECT COUNT(*) FROM olist_orders_dataset a, olist_orders_dataset b, olist_orders_dataset c"
    assert run_readonly(small_commerce_db, cross, timeout_s=0.2, row_cap=1000).error == "time limit exceeded"
    assert tasks.score("sql", runaway, SQL_REF, dataclasses.replace(ctx(), timeout_s=0.1)).components["executes"] == 0.0


def test_a_chain_of_joins_is_refused_before_sqlglot_parses_it(small_commerce_db):
    """sqlglot parses `a JOIN b JOIN c ...` without ON by backtracking over nested joins, twice as
    long with each JOIN: a sampled completion of 26 took 810 s to score. It is refused from its
    tokens, and scored as text that does not parse; a query within the bound is read as before."""
    sampled = "SELECT placa FROM placa " + " ".join(["JOIN product_category_name"] * 25) + " JOIN pe"
    checked = check_readonly(sampled)
    assert not checked.ok and not checked.parsed and checked.reason == "26 JOINs; at most 12 are read"
    assert run_readonly(small_commerce_db, sampled, timeout_s=1.0, row_cap=10).error.startswith("refused")
    scored = score("sql", sampled, SQL_REF)
    assert scored.components["executes"] == 0.0 and scored.components["parse"] == 0.0 and scored.total < 0.05
    twelve = "SELECT COUNT(*) FROM olist_orders_dataset o" + "".join(
        f" JOIN olist_customers_dataset c{i} ON c{i}.customer_id = o.customer_id" for i in range(12))
    assert check_readonly(twelve).ok and check_readonly("SELECT 'JOIN JOIN JOIN' || x FROM t JOIN u").ok
    assert check_readonly(twelve + " JOIN olist_sellers_dataset s").reason == "13 JOINs; at most 12 are read"


def test_row_cap(small_commerce_db):
    result = run_readonly(small_commerce_db, "SELECT * FROM olist_order_items_dataset", timeout_s=1.0, row_cap=50)
    assert len(result.rows) == 50 and result.truncated


# --- TRL reward functions ---------------------------------------------------------------

def test_the_grpo_reward_is_the_scored_total_with_the_scoring_weights():
    """Training and serving agree: `sum` returns exactly `score(...).total` for each sample,
    whatever its task and whether it has a reference."""
    completions = [[{"role": "assistant", "content": REFERENCE_ANSWERS[t][0] + ("" if k else " x")}] for t in TASKS for k in (0, 1)]
    kwargs = {"task": [t for t in TASKS for _ in (0, 1)], "reference": [REFERENCE_ANSWERS[t][1] for t in TASKS for _ in (0, 1)],
              "context": [(ctx(t, **REFERENCE_ANSWERS[t][2]) if REFERENCE_ANSWERS[t][2] else ctx()).to_json() for t in TASKS for _ in (0, 1)]}
    log = StepLog()
    values = reward_function("sum", 2, 0.1, log)(completions=completions, **kwargs)
    for value, completion, task, reference, context in zip(values, completions, kwargs["task"], kwargs["reference"], kwargs["context"]):
        assert value == tasks.score(task, completion[0]["content"], reference, RewardContext.from_json(context, tasks.definition(task).input_model)).total
    assert log.batches[0]["groups"] == 4 and 0.0 <= log.batches[0]["zero_variance_share"] <= 1.0


def test_the_relevant_advantage_pays_only_queries_that_address_the_question_and_flattens_groups_of_none(small_commerce_db):
    """`relevant`: a reference-free SQL sample earns its total only where the served score finds it
    addresses the question; a group with no such sample is flat (and so dropped); a sample scored with
    a reference, or of a task without a relevance component, keeps its total as under `sum`."""
    import torch

    from trainer.trl_internals import flat_groups

    question = {"question": "Quantos clientes são do estado SP?"}
    answers = ["SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state = 'SP'",  # answers it
               "SELECT COUNT(*) FROM olist_orders_dataset",  # runs, answers another question
               "SELECT COUNT(*) FROM no_such_table",  # fails
               "SELECT AVG(price) FROM olist_order_items_dataset"]  # runs, answers another question
    context = ctx("sql", **question).to_json()
    free = [tasks.score("sql", a, None, ctx("sql", **question)) for a in answers]
    assert free[0].components["question_match"] > 0 and all(f.components["question_match"] == 0 for f in free[1:])
    assert len({round(f.total, 6) for f in free[1:]}) > 1  # under sum, running and failing still differ
    group = {"completions": answers, "task": ["sql"] * 4, "context": [context] * 4}
    relevant = reward_function("relevant", 4, 0.1)(**group)
    assert relevant == [free[0].total, 0.0, 0.0, 0.0] and free[0].total > 0
    assert reward_function("sum", 4, 0.1)(**group) == [f.total for f in free]

    none = {key: value[1:] + value[1:2] for key, value in group.items()}  # no sample addresses the question
    values = torch.tensor(reward_function("relevant", 4, 0.1)(**none))
    assert bool(flat_groups(values - values.mean(), 4).all())

    with_reference = dict(group, reference=[{"sql": answers[0]}] * 4)
    assert reward_function("relevant", 4, 0.1)(**with_reference) == reward_function("sum", 4, 0.1)(**with_reference)
    push = {"completions": [REFERENCE_ANSWERS["push"][0], REFERENCE_ANSWERS["push"][0] + " x"], "task": ["push"] * 2,
            "context": [ctx("push", **REFERENCE_ANSWERS["push"][2]).to_json()] * 2}
    assert tasks.definition("push").relevance is None
    assert reward_function("relevant", 2, 0.1)(**push) == reward_function("sum", 2, 0.1)(**push)


def test_gdpo_centres_each_component_per_group_and_a_tiny_spread_stays_tiny():
    def scored(components, weights):
        return Score(0.0, components, False, True, weights=weights)

    weights = {"a": 0.5, "b": 0.5}
    # component a varies a lot, b only by 0.001: b's share of the advantage must stay small
    group = [scored({"a": 1.0, "b": 0.5005}, weights), scored({"a": 0.0, "b": 0.4995}, weights)]
    values = gdpo_values(group, 2, std_floor=0.1)
    assert abs(sum(values)) < 1e-9  # centred within the group
    assert abs(values[0] - 0.5 * 1.0 - 0.5 * 0.005) < 1e-6  # a: (1-0.5)/0.5 = 1; b: 0.0005/0.1
    plain = [(0.5005 - 0.5) / (0.0005 + 1e-4)]  # what std + 1e-4 would give b: a full unit
    assert plain[0] > 0.8
    flat = [scored({"a": 0.3, "b": 0.3}, weights)] * 2
    assert gdpo_values(flat, 2, 0.1) == [0.0, 0.0]


# --- rewards that cannot be gamed ---------------------------------------------------------

@pytest.mark.parametrize("question", [
    "Quantos clientes são do estado SP?", "Qual o valor médio dos pagamentos com boleto?", "Quantos vendedores estão no estado RJ?",
    "Qual a nota média das avaliações por categoria de produto?", "Quantos pedidos foram feitos em 2017?",
])
def test_a_constant_sql_answer_scores_low_without_a_reference(question):
    gamed = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset", None, {"question": question})
    assert gamed.total <= 0.55 and gamed.components["question_match"] <= 0.5, gamed.details
    constant = score("sql", "SELECT 42", None, {"question": question})
    assert constant.total <= 0.15 and constant.components["question_match"] == 0.0


def test_a_sql_answer_that_addresses_the_question_earns_reference_free_credit():
    right = score("sql", "SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state = 'SP'", None,
                  {"question": "Quantos clientes são do estado SP?"})
    wrong_value = score("sql", "SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state = 'RJ'", None,
                        {"question": "Quantos clientes são do estado SP?"})
    assert right.total == 1.0 and right.components["question_match"] == 1.0
    assert wrong_value.total < right.total


@pytest.mark.parametrize("question,sql", [
    # the demo model's answer in the README's quickstart, which scored 1.000 under reward version 6
    ("Quantos pedidos foram entregues no estado de SP?",
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y-%m', order_purchase_timestamp) = 'SP'"),
    ("Quantos pedidos foram feitos em 2017?", "SELECT COUNT(*) FROM orders_enriched WHERE price > 2017"),
    ("Quantos pedidos foram pagos com boleto?", "SELECT COUNT(*) FROM orders_enriched WHERE order_status = 'boleto'"),
    ("Quantos pedidos estão com status delivered?", "SELECT COUNT(*) FROM orders_enriched WHERE customer_city = 'delivered'"),
])
def test_a_value_compared_against_a_column_that_cannot_hold_it_is_not_used(question, sql):
    wrong_column = score("sql", sql, None, {"question": question})
    assert wrong_column.total <= 0.6 and wrong_column.components["question_match"] <= 0.5, wrong_column.details
    said = wrong_column.details["question_match"]
    assert "missing" in said or "no row meets" in said, said  # the value counted as unused, or the condition as never met


@pytest.mark.parametrize("question,sql", [
    ("Quantos pedidos existem?",  # no value in the question to check: the condition itself can never be met
     "SELECT COUNT(*) FROM orders_enriched WHERE strftime('%Y-%m', order_purchase_timestamp) = 'Quantos pedidos existem?'"),
    ("Quantos pedidos existem?", "SELECT COUNT(*) FROM orders_enriched WHERE order_status IN ('delivered', 'SP')"),
    ("Quantos clientes existem?", "SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state = 'São Paulo'"),
])
def test_an_equality_no_row_can_meet_earns_no_reference_free_credit(question, sql):
    never = score("sql", sql, None, {"question": question})
    assert never.components["question_match"] == 0.0 and "a condition no row meets" in never.details["question_match"]
    assert never.total <= 0.15


@pytest.mark.parametrize("question,sql", [
    ("Quantos pedidos existem?",  # '%m' is strftime's format, not a value the month is equated with
     "SELECT COUNT(*) FROM orders_enriched WHERE strftime('%m', order_purchase_timestamp) = '03'"),
    ("Quantos pedidos foram entregues no estado de SP?",
     "SELECT COUNT(*) FROM orders_enriched WHERE order_status = 'delivered' AND customer_state = 'SP'"),
    ("Quantos pedidos foram feitos em 2017?",
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '2017'"),
    ("Quantos pedidos foram feitos em 2017?",  # an alias the query made: no schema column to judge by
     "SELECT ano, COUNT(*) FROM (SELECT strftime('%Y', order_purchase_timestamp) AS ano FROM olist_orders_dataset) "
     "WHERE ano = '2017' GROUP BY ano"),
    ("Qual o valor médio dos pagamentos com boleto?",
     "SELECT AVG(payment_value) FROM olist_order_payments_dataset WHERE payment_type = 'boleto'"),
])
def test_a_value_compared_against_a_column_of_its_kind_is_used(question, sql):
    right = score("sql", sql, None, {"question": question})
    assert "missing" not in right.details["question_match"], right.details


@pytest.mark.parametrize("sql", [
    # SmolLM2's GRPO candidates wrote these for a year: a year is four digits, and strftime('%Y') writes nothing else
    "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '2017-01'",
    # a list holding a text the format never writes, judged as a list holding a value its column never holds is
    # (`order_status IN ('delivered', 'SP')` below): the list was not written for the column
    "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) IN ('2017', '2017-1')",
    "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y-%m', order_purchase_timestamp) = '2017'",
    # strftime writes text, and SQLite finds no text equal to the number 2017
    "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = 2017",
])
def test_a_strftime_equated_with_a_text_its_format_never_writes_is_never_met(sql, small_commerce_db):
    never = score("sql", sql, None, {"question": "Quantos pedidos foram feitos em 2017?"})
    assert never.components["question_match"] == 0.0, never.details
    assert "a text it never writes: a condition no row meets" in never.details["question_match"]
    if " IN " not in sql:  # SQLite agrees: no order meets the equality, where the year's own text finds some
        assert run_readonly(small_commerce_db, sql, timeout_s=2.0, row_cap=10).rows == [(0,)]
    year = "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '2017'"
    assert run_readonly(small_commerce_db, year, timeout_s=2.0, row_cap=10).rows[0][0] > 0


@pytest.mark.parametrize("sql,used", [
    ("SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '2017'", True),
    ("SELECT COUNT(*) FROM olist_orders_dataset WHERE order_purchase_timestamp LIKE '2017%'", True),
    ("SELECT COUNT(*) FROM olist_orders_dataset WHERE order_purchase_timestamp BETWEEN '2017-01-01' AND '2017-12-31'", True),
    ("SELECT COUNT(*) FROM olist_orders_dataset WHERE order_purchase_timestamp >= '2017-01-01' "
     "AND order_purchase_timestamp < '2018-01-01'", True),
    # January, not the year: the month's text holds the year's digits, and its rows are a twelfth of them
    ("SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y-%m', order_purchase_timestamp) = '2017-01'", False),
    ("SELECT COUNT(*) FROM olist_orders_dataset WHERE order_purchase_timestamp LIKE '2017-01%'", False),
])
def test_a_year_is_used_only_where_the_query_keeps_the_whole_year(sql, used):
    said = score("sql", sql, None, {"question": "Quantos pedidos foram feitos em 2017?"}).details["question_match"]
    assert ("missing" not in said) is used, said


def test_cancellations_ask_for_the_canceled_status():
    question = {"question": "Qual o número de cancelamentos em 2016?"}  # a noun, where "cancelados" was the cue
    year_only = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '2016'",
                      None, question)
    both = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'canceled' "
                        "AND strftime('%Y', order_purchase_timestamp) = '2016'", None, question)
    assert "missing ['canceled']" in year_only.details["question_match"] and year_only.components["question_match"] == 0.05
    assert both.components["question_match"] == 1.0, both.details


def test_a_query_that_uses_some_of_the_questions_values_is_paid_a_tenth_of_their_share():
    """Version 11: a count over every 2016 order answers a wider question than "cancelados em
    2016", so it is wrong; version 10 paid it 0.575 without a reference, where a reference pays it
    at most 0.15. It now earns a little more than a query that uses none of the values, and far
    less than one that uses both."""
    question = {"question": "Quantos pedidos foram cancelados em 2016?"}
    none = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'delivered'", None, question)
    year_only = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '2016'",
                      None, question)
    both = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'canceled' "
                        "AND strftime('%Y', order_purchase_timestamp) = '2016'", None, question)
    assert "0/2 values" in none.details["question_match"] and none.components["question_match"] == 0.0
    assert year_only.components["question_match"] == pytest.approx(0.5 * PARTIAL_VALUES_PAID) and PARTIAL_VALUES_PAID == 0.1
    assert none.total < year_only.total < 0.2 and both.total > 0.9, (none.total, year_only.total, both.total)


def test_a_number_the_question_names_without_a_comparison_is_met_by_equality():
    question = {"question": "Quantas avaliações têm nota 5?"}
    equal = score("sql", "SELECT COUNT(*) FROM olist_order_reviews_dataset WHERE review_score = 5", None, question)
    above = score("sql", "SELECT COUNT(*) FROM olist_order_reviews_dataset WHERE review_score > 5", None, question)
    assert equal.components["question_match"] == 1.0, equal.details
    assert above.components["question_match"] == 0.0 and "missing ['5']" in above.details["question_match"], above.details
    # where the question says how to compare, that comparison is the one met
    more = {"question": "Quantos pagamentos foram parcelados em mais de 5 vezes?"}
    assert score("sql", "SELECT COUNT(*) FROM olist_order_payments_dataset WHERE payment_installments > 5", None,
                 more).components["question_match"] == 1.0
    assert score("sql", "SELECT COUNT(*) FROM olist_order_payments_dataset WHERE payment_installments = 5", None,
                 more).components["question_match"] == 0.0


@pytest.mark.parametrize("question,right,wrong", [
    ("Qual o peso médio dos produtos da categoria telefonia_fixa?",
     "SELECT AVG(product_weight_g) FROM olist_products_dataset WHERE product_category_name = 'telefonia_fixa'",
     "SELECT AVG(product_length_cm) FROM olist_products_dataset WHERE product_category_name = 'telefonia_fixa'"),
    ("Quanto custa, em média, um item de cama_mesa_banho?",
     "SELECT AVG(i.price) FROM olist_order_items_dataset i JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "WHERE p.product_category_name = 'cama_mesa_banho'",
     "SELECT AVG(i.freight_value) FROM olist_order_items_dataset i JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "WHERE p.product_category_name = 'cama_mesa_banho'"),
    ("Qual o valor total de frete em 2017?",
     "SELECT SUM(i.freight_value) FROM olist_order_items_dataset i JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '2017'",
     "SELECT SUM(i.price) FROM olist_order_items_dataset i JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '2017'"),
])
def test_an_average_or_a_sum_must_be_of_what_the_question_measures(question, right, wrong):
    good = score("sql", right, None, {"question": question})
    bad = score("sql", wrong, None, {"question": question})
    assert "averages or sums what the question measures" in good.details["question_match"], good.details
    assert bad.components["question_match"] == 0.0 and "averages or sums none of" in bad.details["question_match"], bad.details


def test_a_category_the_store_names_in_one_word_is_a_value_the_query_must_use(small_commerce_db):
    from rewards.sql import store_names
    from rewards.sql_question import SCHEMA_COLUMN_NAMES, question_cues

    names = store_names(small_commerce_db, 1.0)
    assert "musica" in names and all(name.isalpha() and name == name.lower() for name in names)
    question = {"question": "Quanto custa, em média, um item de musica?"}
    assert "musica" in question_cues(question["question"], SCHEMA_COLUMN_NAMES, names).values
    assert "musica" not in question_cues(question["question"], SCHEMA_COLUMN_NAMES).values  # its words alone do not say so
    every_item = score("sql", "SELECT AVG(price) FROM olist_order_items_dataset", None, question)
    its_items = score("sql", "SELECT AVG(i.price) FROM olist_order_items_dataset i JOIN olist_products_dataset p "
                             "ON p.product_id = i.product_id WHERE p.product_category_name = 'musica'", None, question)
    assert every_item.components["question_match"] == 0.0 and "missing ['musica']" in every_item.details["question_match"]
    assert its_items.components["question_match"] == 1.0, its_items.details
    assert store_names(small_commerce_db.parent / "absent.db", 1.0) == frozenset()  # no database: the words alone


def test_insights_earns_no_grounding_without_data():
    no_data = score("insights", INSIGHT, None, {"question": "Como vão as vendas?"})
    assert no_data.components["grounding"] == 0.0
    assert no_data.total < score("insights", INSIGHT, None, ROWS).total


# --- corrections and references are checked before anything stores them ------------------

@pytest.mark.parametrize("task,value,needle", [
    ("extraction", {"sentiment": "furious"}, "sentiment"),
    ("extraction", {**EXTRACTION_REF, "urgency": "now"}, "urgency"),
    ("extraction", {**EXTRACTION_REF, "extra": 1}, "extra"),
    ("extraction", "not json", "JSON object"),
    ("extraction", [1, 2], "JSON object"),
    ("push", {"title": "x" * 41, "body": "ok"}, "title"),
    ("push", {"title": "Oi"}, "body"),
    ("sql", "DROP TABLE olist_orders_dataset", "not a read-only SELECT"),
    ("sql", "SELECT 1; SELECT 2", "not a read-only SELECT"),
    ("sql", {"sql": 5}, "one SELECT"),
    ("sql", "", "one SELECT"),
    ("insights", {"answer": "x"}, "text"),
])
def test_bad_corrections_are_refused_with_the_problem_named(task, value, needle):
    with pytest.raises(InvalidReference, match=needle):
        check_reference(task, value)


def test_good_corrections_are_kept_in_their_stored_form():
    assert check_reference("extraction", json.dumps({**EXTRACTION_REF, "sentiment_score": "1,5"})) == EXTRACTION_REF
    assert check_reference("push", PUSH_REF) == PUSH_REF
    assert check_reference("sql", SQL_REF + ";") == {"sql": SQL_REF}
    assert check_reference("sql", {"sql": SQL_REF}) == {"sql": SQL_REF}
    assert check_reference("insights", INSIGHT) == INSIGHT


def test_what_a_question_asks_is_the_same_in_other_words_and_with_other_values_and_differs_between_queries():
    weight = question_intent("Quanto pesa, em gramas, um produto de esporte_lazer em média?")
    assert weight == question_intent("Qual o peso médio dos produtos da categoria telefonia_fixa?")
    assert weight == {"aggregate:avg", "table:olist_order_items_dataset|olist_products_dataset", "value:name"}
    orders = question_intent("Quantos pedidos de clientes de TO foram feitos em 2018?")
    assert {"aggregate:count", "value:state", "value:date"} <= orders
    assert orders - {"table:olist_customers_dataset"} == question_intent("Qual o número de compras vindas de ES em 2016?")
    cities = question_intent("Liste as cinco cidades de AL que mais compraram.")
    assert {"ranked", "counted", "value:state", "entity:customer_city|seller_city"} <= cities and not cities & weight
    assert question_intent("Quantos pagamentos foram parcelados em mais de 3 vezes?") >= {"compared:above", "value:number"}
    assert question_intent("Quantos pedidos foram cancelados em 2016?") >= {"value:status", "value:date"}
    assert question_intent("olá") == frozenset()
