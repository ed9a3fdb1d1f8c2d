"""Answers that do no work: constants, empty answers, the input echoed back, the context copied
into a fixed template, one statement looped. Every reward must score them far below a real
answer, with a reference and without one; the unit tests hold them to that, and `tucano bench
rewards --trivial` prints the table the results log (docs/results.md) shows.

Each maker takes a task's input, as its model (and, for the constants, the references of the rows being
scored, whose most common value per field is the best constant there is) and returns a completion.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable

from common.tasks import EXTRACTION_FIELDS, ExtractionInput, InsightsInput, PushInput, SqlInput


def _modal_extraction(references: list[dict]) -> dict:
    """The most common value of each field over the references (key phrases empty, product null)."""
    modal = {}
    for field in EXTRACTION_FIELDS:
        values = [json.dumps(r.get(field), ensure_ascii=False) for r in references if isinstance(r, dict)]
        modal[field] = json.loads(Counter(values).most_common(1)[0][0]) if values else None
    return {**modal, "key_phrases": [], "product_mentioned": None, "summary": "Cliente avaliou o produto."}


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"[.,!?]", text) if s.strip()]


def _windows(text: str, size: int = 3) -> list[str]:
    tokens = text.split()
    return [" ".join(tokens[i:i + size]) for i in range(0, max(1, len(tokens) - size + 1), size)][:5]


def _pairs(text: str) -> list[str]:
    """Two-word substrings of a text, as many as fit: 'key phrases' that carry nothing in particular."""
    tokens = text.split()
    return [" ".join(tokens[i:i + 2]).strip(".,!?") for i in range(0, max(1, len(tokens) - 1), 2)]


def _shortest_word(text: str) -> str:
    return min(re.findall(r"\w+", text) or [""], key=len)


def _reversed(text: str) -> str:
    return " ".join(reversed(re.findall(r"\w+", text)))[:200]


def extraction_makers(references: list[dict]) -> dict[str, Callable[[ExtractionInput], str]]:
    modal = _modal_extraction(references)

    def holes(task_input: ExtractionInput, sentiment: str | None = None, phrases: int = 5) -> str:
        """Every cheap hole at once: a one-letter 'product' found in the review, two-word substrings
        as key phrases, the review's words reversed as its summary."""
        review = task_input.review
        return json.dumps({**modal, "sentiment": sentiment or modal["sentiment"], "product_mentioned": _shortest_word(review),
                           "key_phrases": _pairs(review)[:phrases], "summary": _reversed(review)}, ensure_ascii=False)

    return {
        "empty": lambda _: "",
        "empty object": lambda _: "{}",
        "most common value per field": lambda _: json.dumps(modal, ensure_ascii=False),
        "review echoed (phrases = its sentences, summary = its start)": lambda task_input: json.dumps(
            {**modal, "key_phrases": _sentences(task_input.review)[:5], "summary": task_input.review[:200]}, ensure_ascii=False),
        "review echoed in 3-word windows": lambda task_input: json.dumps(
            {**modal, "key_phrases": _windows(task_input.review), "summary": task_input.review[:200]}, ensure_ascii=False),
        "a one-letter product, two-word substrings, the review reversed": holes,
        "the same holes with a constant neutral sentiment": lambda task_input: holes(task_input, "neutral"),
        "the same holes with more than five key phrases (schema-invalid)": lambda task_input: holes(task_input, phrases=12),
    }


def _question_values(question: str) -> str:
    return " ".join(re.findall(r"\b(?:[A-Z]{2}|\d+(?:[.,]\d+)?|[a-z]+_[a-z_]+)\b", question)) or question[:40]


def _excluded_and_stuffed(task_input: SqlInput) -> str:
    """The question's states excluded instead of chosen, grouped, ranked and every aggregate at once:
    a query shaped like an answer that answers nothing."""
    states = re.findall(r"\b[A-Z]{2}\b", task_input.question) or ["SP"]
    count = (re.findall(r"\b(\d+)\b", task_input.question) or ["5"])[0]
    listed = ", ".join(f"'{s}'" for s in states)
    return ("SELECT customer_state, COUNT(*), AVG(price), SUM(price) FROM orders_enriched WHERE customer_state NOT IN "
            f"({listed}) GROUP BY customer_state ORDER BY 2 DESC LIMIT {count}")


def _values_against_a_date(task_input: SqlInput) -> str:
    """Each value of the question compared with the purchase month, one count: every value used in
    the query, on a column that cannot hold it (the README quickstart's demo answer, v6's 1.000)."""
    values = _question_values(task_input.question).replace("'", "").split()
    compared = " OR ".join(f"strftime('%Y-%m', order_purchase_timestamp) = '{v}'" for v in values)
    return f"SELECT COUNT(*) FROM orders_enriched WHERE {compared}"


SQL_MAKERS: dict[str, Callable[[SqlInput], str]] = {
    "empty": lambda _: "",
    "SELECT 1": lambda _: "SELECT 1",
    "count of all orders": lambda _: "SELECT COUNT(*) FROM olist_orders_dataset",
    "the whole view": lambda _: "SELECT * FROM orders_enriched",
    "the question's values echoed in a string": lambda task_input: (
        "SELECT *, '" + _question_values(task_input.question).replace("'", "") + "' AS pergunta FROM orders_enriched"),
    "the question's values in a tautology": lambda task_input: (
        "SELECT COUNT(*) FROM orders_enriched WHERE '" + _question_values(task_input.question).replace("'", "")
        + "' = '" + _question_values(task_input.question).replace("'", "") + "'"),
    "the question's values excluded, every aggregate, grouped and ranked": _excluded_and_stuffed,
    "the question's values compared with the purchase month": _values_against_a_date,
    "a query that errors": lambda _: "SELECT customer_state, COUNT(*) FROM olist_orders_dataset GROUP BY customer_state",
}


def _field_dump(task_input: PushInput) -> str:
    fields = "; ".join(f"{key}: {value}" for key, value in task_input.model_dump(exclude_none=True).items())
    return json.dumps({"title": (task_input.campaign or "")[:40], "body": fields[:140]}, ensure_ascii=False)


def _fact_template(task_input: PushInput) -> str:
    """The context's values poured into one fixed sentence, whatever the campaign."""
    name = task_input.customer_name or "Oi"
    facts = [f"{task_input.discount_pct}%" if task_input.discount_pct else "", task_input.product or "",
             task_input.coupon or "", task_input.deadline or ""]
    body = "Novidade de " + " ".join(f for f in facts if f) + ". Confira no app."
    return json.dumps({"title": f"{name}, novidade pra você"[:40], "body": body[:140]}, ensure_ascii=False)


def _every_campaign(task_input: PushInput) -> str:
    """One copy that says every campaign's message, with the name, product and discount."""
    name = task_input.customer_name or "Oi"
    discount = f"{task_input.discount_pct}% off" if task_input.discount_pct else "ofertas"
    product = task_input.product or "seu produto"
    body = (f"{discount} em {product}: preço caiu, voltou ao estoque, cupom no carrinho, pedido enviado e entregue; "
            "avalie e aproveite a Black Friday.")
    return json.dumps({"title": f"{name}, confira", "body": body[:140]}, ensure_ascii=False)


PUSH_MAKERS: dict[str, Callable[[PushInput], str]] = {
    "empty": lambda _: "",
    "empty object": lambda _: "{}",
    "constant copy": lambda _: json.dumps({"title": "Novidades pra você", "body": "Confira as ofertas de hoje no app."}, ensure_ascii=False),
    "the context's fields dumped": _field_dump,
    "the context's values in a fixed template": _fact_template,
    "one copy that says every campaign's message": _every_campaign,
}

FIXED_INSIGHT = ("<think>\nVou resumir os dados.\n</think>\n\nResumo: os dados mostram diferenças entre os grupos.\n"
                 "- Alguns itens se destacam mais do que outros.\n- Há espaço para melhorar.\n"
                 "Recomendação: priorizar as ações de maior impacto e acompanhar os resultados.")

def _row_statement(row: list | tuple, columns: list) -> str:
    """One row said as a sentence: its label, the last column's name and its figure."""
    return f"- {row[0]} tem {columns[-1]} de {row[-1]}."


def _looped_statement(task_input: InsightsInput) -> str:
    """A true statement about the first row, said again and again until the token limit: what a
    half-trained model that loops writes."""
    rows, columns = task_input.rows or [[""]], task_input.columns or ["", ""]
    first = rows[0] if isinstance(rows[0], (list, tuple)) else [rows[0]]
    statement = _row_statement(first, columns)
    return "<think>\nOs dados.\n</think>\n\nResumo dos dados.\n" + "\n".join([statement] * 60)


def _listed_rows(task_input: InsightsInput) -> str:
    """Every row of the data restated as a sentence, in the data's order, with a stock
    recommendation: it cites every figure and names every row, and analyses nothing."""
    rows, columns = task_input.rows or [], task_input.columns or ["", ""]
    lines = [_row_statement(row, columns) for row in rows if isinstance(row, (list, tuple)) and row]
    return ("<think>\nListo os dados.\n</think>\n\nOs dados de " + task_input.question + "\n"
            + "\n".join(lines) + "\nRecomendação: priorizar os maiores.")


def _false_leader(task_input: InsightsInput) -> str:
    """The smallest row called the leader, figures moved to the next row, and a wrong count: an
    analysis in shape whose every claim is false."""
    rows = [r for r in task_input.rows or [] if isinstance(r, (list, tuple)) and len(r) >= 2]
    columns = task_input.columns or ["", ""]
    if len(rows) < 2:
        return FIXED_INSIGHT
    ranked = sorted(rows, key=lambda r: r[-1] if isinstance(r[-1], (int, float)) else 0)
    low, high = ranked[0], ranked[-1]
    return ("<think>\nAnaliso.\n</think>\n\n"
            f"Resumo: entre os {len(rows) - 1} registros, {low[0]} lidera em {columns[-1]} com {high[-1]}.\n"
            f"- {high[0]} é o menor, com {low[-1]}.\n- {rows[1][0]} tem {columns[-1]} de {rows[0][-1]}.\n"
            "Recomendação: priorizar o líder.")


INSIGHTS_MAKERS: dict[str, Callable[[InsightsInput], str]] = {
    "empty": lambda _: "",
    "fixed text with a closed think block": lambda _: FIXED_INSIGHT,
    "the question echoed": lambda task_input: f"<think>\n{task_input.question}\n</think>\n\n{task_input.question}",
    "the data echoed": lambda task_input: "<think>\nOs dados.\n</think>\n\n" + json.dumps(
        {"columns": task_input.columns or [], "rows": task_input.rows or []}, ensure_ascii=False),
    "one statement repeated until the token limit": _looped_statement,
    "every row restated": _listed_rows,
    "the smallest row called the leader, figures on the wrong rows, a wrong count": _false_leader,
}
