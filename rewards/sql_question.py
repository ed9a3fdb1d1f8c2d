"""What a question asks of its SQL, for the reference-free SQL reward: the tables its words point
at, the values it names (a state, a year, a month, a status, a payment type, a category, a
number) and the aggregate it asks for (a count, an average, a sum). An answer earns
reference-free credit only for those, so a query that runs cleanly but ignores the question
(`SELECT COUNT(*) FROM olist_orders_dataset` for any question) earns little, and one whose result
is a constant, or whose condition compares literals with each other, earns nothing. A value counts only where the query uses it: compared against a
column (WHERE, HAVING, JOIN ... ON, IN, LIKE, BETWEEN) or as the LIMIT; echoed in a string in the
select list, it counts for nothing; nor does a value compared against a column that cannot hold
its kind (a state against a date, a year against a price): such a filter selects nothing the
question asked about. Nor does a year equated with a month's text, nor a number the question names
without a comparison used with `>` or `<`; and a `strftime` equated with a text its format never
writes (`strftime('%Y', ...) = '2017-01'`) is a condition no row meets. An average or a sum must
be taken over what the question measures (its weight, price, freight, rating). The store's
one-word category names, which no pattern tells from other words, come from its database
(`rewards.sql.store_names`).

Version 11 pays a query that uses only some of the question's values a tenth of what it paid
(`PARTIAL_VALUES_PAID`). Version 9 of the reward (`rewards.scoring.REWARD_VERSION`) added the checks of the last two sentences, the
store's names and "cancelamentos" as the canceled status: SQL's GRPO
candidates wrote `strftime('%Y', order_purchase_timestamp) = '2017-01'` for "em 2017", which
version 8 paid as the year, so its served score ranked a trained policy's samples further from
the references than the base model's (docs/results.md, 2026-12-06).
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

from sqlglot import exp

from common.commerce import ORDER_STATUSES, PAYMENT_TYPES, SCHEMA_COLUMNS, UF_CODES, VIEW
from rewards.text import fold

# A query that uses some of the values the question names, not all, answers a wider question
# ("pedidos cancelados em 2016" counted over every 2016 order): of the base model's 1,280 sampled
# queries, 95 that ran did so and none matched its reference, which pays them 0.15 of 1. Paid in
# full share (version 10) they earned 0.575 without one, almost four times what a reference pays.
# Version 11 pays a tenth of the share: above none of the values, far below all of them.
PARTIAL_VALUES_PAID = 0.1
ORDERS, CUSTOMERS, SELLERS = "olist_orders_dataset", "olist_customers_dataset", "olist_sellers_dataset"
PRODUCTS, ITEMS, PAYMENTS = "olist_products_dataset", "olist_order_items_dataset", "olist_order_payments_dataset"
REVIEWS, TRANSLATION = "olist_order_reviews_dataset", "product_category_name_translation"
# folded word stems -> the tables that can answer for them (any one of them will do)
TABLE_WORDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("pedido", "compra", "cancelad", "cancelament", "entreg", "atras", "status"), (ORDERS,)),
    **dict.fromkeys(("cliente", "customer"), (CUSTOMERS,)),
    **dict.fromkeys(("vendedor", "seller"), (SELLERS, ITEMS)),
    **dict.fromkeys(("produto", "product", "categoria", "peso"), (PRODUCTS, ITEMS)),
    **dict.fromkeys(("item", "itens", "preco", "frete", "vendid", "vendeu", "venderam"), (ITEMS,)),
    **dict.fromkeys(("fatur", "receita", "ticket"), (ITEMS, PAYMENTS)),
    **dict.fromkeys(("pagament", "pago", "pagou", "parcel", "boleto", "cartao", "voucher"), (PAYMENTS,)),
    **dict.fromkeys(("avaliac", "nota", "review", "comentario"), (REVIEWS,)),
    "ingles": (TRANSLATION,),
}
PAYMENT_WORDS = {"cartao de credito": "credit_card", "cartao de debito": "debit_card", "boleto": "boleto", "voucher": "voucher"}
STATUS_WORDS = {"cancelad": "canceled", "cancelament": "canceled"}
NUMBER_WORDS = {"dois": "2", "duas": "2", "tres": "3", "cinco": "5", "dez": "10"}
YEAR = re.compile(r"\b(201[0-9]|202[0-9])\b")
MONTH_YEAR = re.compile(r"\b(\d{1,2})/(\d{4})\b")
MONTH_OF_YEAR = re.compile(r"\bmes (\d{1,2}) de (\d{4})\b")
NUMBER = re.compile(r"(?<![\w/])(\d+(?:[.,]\d+)?)(?![\w/])")
IDENTIFIER = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


# folded question words -> the aggregate function that answers them
AGGREGATE_WORDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("quantos", "quantas", "numero de", "numero total", "quantidade", "contagem"), "count"),
    (("media", "medio", "em media"), "avg"),
    (("soma", "somam", "faturamento", "total pago", "valor total", "quanto foi vendido"), "sum"),
)
AGGREGATES = {"count": exp.Count, "avg": exp.Avg, "sum": exp.Sum}
# the shape of the answer a question asks for: one row per group, or rows in a ranked order
GROUPING = re.compile(r"\b(por (mes|ano|status|estado|tipo|categoria|cidade|forma|vendedor|nota)|cada|mes a mes|distribu\w*)\b")
RANKING = re.compile(r"\b(mais|menos)\b(?! de\b)|\b(maior|maiores|menor|menores|pior|piores|melhor|melhores|top)\b")
PREDICATES = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Like, exp.ILike, exp.Between, exp.Is)


# the question excludes something: a value may then be used with != or NOT IN
NEGATION = re.compile(r"\b(exceto|fora d[eoa]s?|nao|sem|diferentes? d[eoa]s?|excluindo|menos [oa]s?)\b")
# words before a number that say how to compare with it
ABOVE = re.compile(r"\b(acima de|mais de|maior(es)? (que|do que)|superior(es)? a|pelo menos|no minimo|a partir de|"
                   r"mais que|passa de|ultrapassa)\s*(r\$\s*)?$")
BELOW = re.compile(r"\b(abaixo de|menos de|menor(es)? (que|do que)|inferior(es)? a|ate|no maximo|menos que)\s*(r\$\s*)?$")
# what a grouped or ranked answer is made of ("as 5 cidades", "por estado"): the columns that name it
ENTITY_WORDS: dict[str, frozenset[str]] = {
    "cidade": frozenset({"customer_city", "seller_city"}),
    "estado": frozenset({"customer_state", "seller_state"}),
    "categoria": frozenset({"product_category_name", "product_category_name_english"}),
    "vendedor": frozenset({"seller_id"}),
    "produto": frozenset({"product_id"}),
    "cliente": frozenset({"customer_id", "customer_unique_id"}),
    "status": frozenset({"order_status"}),
    "tipo de pagamento": frozenset({"payment_type"}),
    "forma de pagamento": frozenset({"payment_type"}),
}
ENTITY = re.compile(r"\b(?:por|cada|o|a|os|as|qual|quais|top|\d+|dois|duas|tres|cinco|dez)\s+(?:\d+\s+|cinco\s+|dez\s+|tres\s+)?"
                    r"(cidade|estado|categoria|vendedor|produto|cliente|status|tipo de pagamento|forma de pagamento)")
# folded question words -> the columns an average or a sum it asks for is taken over ("o peso médio": AVG(product_weight_g))
MEASURE_WORDS: tuple[tuple[re.Pattern, frozenset[str]], ...] = (
    (re.compile(r"\b(peso|pesa|pesam|pesado)\b"), frozenset({"product_weight_g"})),
    (re.compile(r"\b(preco|precos|custa|custam|custo)\b"), frozenset({"price"})),
    (re.compile(r"\bfrete\b"), frozenset({"freight_value"})),
    (re.compile(r"\bnotas?\b"), frozenset({"review_score"})),
    (re.compile(r"\bparcela"), frozenset({"payment_installments"})),
    (re.compile(r"\b(faturamento|receita)\b"), frozenset({"price", "payment_value"})),
)
COUNT_OF = re.compile(r"\b(?:os|as|top)\s+(\d+|dois|duas|tres|cinco|dez)\s+\w+")


class Cues(NamedTuple):
    tables: tuple[frozenset[str], ...]  # for each table word: the tables that answer for it
    values: tuple[str, ...]  # folded texts the SQL must use as compared values or LIMIT
    aggregates: tuple[str, ...] = ()  # aggregate functions the question asks for
    grouped: bool = False  # it asks for one row per group
    ranked: bool = False  # it asks for the most or least of something
    negated: bool = False  # it excludes something ("exceto SP"): != and NOT IN are then its meaning
    comparisons: tuple[tuple[str, str], ...] = ()  # (number, "above" | "below") where the question says so
    entity: frozenset[str] = frozenset()  # the columns a grouped or ranked answer is made of
    count: int | None = None  # how many rows it asks for ("as 5 cidades")
    measure: frozenset[str] = frozenset()  # the columns an average or a sum it asks for is taken over


def question_cues(question: str, schema_names: frozenset[str], names: frozenset[str] = frozenset()) -> Cues:
    """What `question` asks of its SQL. `names`: the store's own value names (its product
    categories, `rewards.sql.store_names`), so that one written as a single word ("um item de
    musica") is a value the query must use, as a snake_case one is."""
    folded = fold(question)
    tables = tuple(dict.fromkeys(frozenset(t) for stem, t in TABLE_WORDS.items() if stem in folded))
    values: list[str] = [uf.lower() for uf in re.findall(r"\b[A-Z]{2}\b", question) if uf in UF_CODES]
    for month, year in MONTH_YEAR.findall(folded) + MONTH_OF_YEAR.findall(folded):
        values.append(f"{year}-{int(month):02d}")
    values += [y for y in YEAR.findall(folded) if not any(v.startswith(y + "-") for v in values)]
    values += [status for status in ORDER_STATUSES if re.search(rf"\b{status}\b", folded)]
    values += [status for stem, status in STATUS_WORDS.items() if stem in folded and status not in values]
    values += [ptype for words, ptype in PAYMENT_WORDS.items() if words in folded]
    values += [name for name in IDENTIFIER.findall(folded) if name not in schema_names]  # a category, a campaign
    values += [word for word in re.findall(r"\b[a-z]+\b", folded) if word in names]
    numbers = [n.replace(",", ".") for n in NUMBER.findall(MONTH_YEAR.sub(" ", MONTH_OF_YEAR.sub(" ", folded)))]
    values += [n for n in numbers if n not in {y for y in YEAR.findall(folded)}]
    values += [digit for word, digit in NUMBER_WORDS.items() if re.search(rf"\b{word}\b", folded)]
    aggregates = tuple(name for cues, name in AGGREGATE_WORDS if any(re.search(rf"\b{c}\b", folded) for c in cues))
    if "avg" in aggregates:  # "quantos dias, em média": the average of a count-like quantity
        aggregates = tuple(a for a in aggregates if a != "count")
    comparisons = []
    for match in NUMBER.finditer(folded):
        before = folded[max(0, match.start() - 30):match.start()]
        side = "above" if ABOVE.search(before) else ("below" if BELOW.search(before) else None)
        if side:
            comparisons.append((match.group(1).replace(",", "."), side))
    entity = ENTITY.search(folded)
    count = COUNT_OF.search(folded)
    grouped, ranked = bool(GROUPING.search(folded)), bool(RANKING.search(folded))
    measured = [columns for pattern, columns in MEASURE_WORDS if pattern.search(folded)]
    measure = frozenset().union(*measured) if measured and {"avg", "sum"} & set(aggregates) else frozenset()
    return Cues(tables, tuple(dict.fromkeys(values)), aggregates, grouped, ranked, bool(NEGATION.search(folded)),
                tuple(comparisons), ENTITY_WORDS[entity.group(1)] if entity and (grouped or ranked) else frozenset(),
                int(NUMBER_WORDS.get(count.group(1), count.group(1))) if count else None, measure)


def is_constant(tree: exp.Expression) -> bool:
    """A SELECT whose every output is a literal: its result does not depend on the data."""
    select = tree if isinstance(tree, exp.Select) else tree.find(exp.Select)
    if select is None:
        return True
    return all(not list(e.find_all(exp.Column, exp.AggFunc, exp.Star)) for e in select.expressions)


OPERATORS = {exp.GT: "above", exp.GTE: "above", exp.LT: "below", exp.LTE: "below", exp.NEQ: "excluded"}
SCHEMA_COLUMN_NAMES = frozenset(c.lower() for columns in SCHEMA_COLUMNS.values() for c in columns)
# the kinds of value a question names that only some columns hold: (is of the kind, holds it).
# A state compared with a date ("strftime('%Y-%m', order_purchase_timestamp) = 'SP'") is used
# in the query and selects nothing the question asked about.
DATE_TEXT = re.compile(r"\d{1,4}(-\d{1,2}){0,2}( \d{2}:\d{2}(:\d{2})?)?")
HOLDERS = {  # kind: (a question's value of the kind, a column of the kind, a literal such a column can equal)
    "state": (lambda value: value.upper() in UF_CODES, lambda column: column.endswith("_state"), lambda text: text.upper() in UF_CODES),
    "date": (lambda value: re.fullmatch(r"20\d\d(-\d\d)?", value) is not None,
             lambda column: "timestamp" in column or "date" in column or column.endswith("_at"),
             lambda text: DATE_TEXT.fullmatch(text) is not None),
    "status": (lambda value: value in ORDER_STATUSES, lambda column: column == "order_status", lambda text: text.lower() in ORDER_STATUSES),
    "payment_type": (lambda value: value in PAYMENT_TYPES, lambda column: column == "payment_type",
                     lambda text: text.lower() in PAYMENT_TYPES),
}


def value_kind(value: str) -> str:
    """The kind of a value a question names: one of `HOLDERS`' kinds, a number, or a name (a category)."""
    for kind, (is_kind, _, _) in HOLDERS.items():
        if is_kind(value):
            return kind
    return "number" if NUMBER.fullmatch(value) else "name"


def question_intent(question: str) -> frozenset[str]:
    """What a question asks of its SQL without the values it names: the tables its words point
    at, the aggregate, the shape (grouped, ranked, how many rows), the comparisons, and the kinds
    of value it filters on. Two phrasings of one query share these where they share almost no
    words ("Quanto pesa, em gramas, um produto de X em média?", "Qual o peso médio dos produtos
    da categoria Y?"), and two queries about the same things differ in them."""
    cues = question_cues(question, SCHEMA_COLUMN_NAMES)
    asks = {"table:" + "|".join(sorted(tables)) for tables in cues.tables}
    asks |= {"aggregate:" + name for name in cues.aggregates}
    asks |= {"value:" + value_kind(value) for value in cues.values}
    asks |= {"compared:" + side for _, side in cues.comparisons}
    asks |= {flag for flag, on in (("grouped", cues.grouped), ("ranked", cues.ranked), ("negated", cues.negated),
                                   ("counted", cues.count is not None)) if on}
    if cues.entity:
        asks.add("entity:" + "|".join(sorted(cues.entity)))
    return frozenset(asks)


class Compared(NamedTuple):
    text: str  # the literal
    how: str  # "equal", "above", "below", "between", "excluded" (!= and NOT ...), or "limit"
    columns: frozenset[str]  # the columns it is compared against (none for a LIMIT)


def compared_literals(tree: exp.Expression) -> list[Compared]:
    """The literals the query uses, each with how and against which columns: compared against a
    column, or as the LIMIT."""
    used = []
    for predicate in tree.find_all(*PREDICATES):
        if predicate.find(exp.Column) is None:
            continue
        how = OPERATORS.get(type(predicate), "between" if isinstance(predicate, exp.Between) else "equal")
        if isinstance(predicate.parent, exp.Not):
            how = "excluded"
        columns = frozenset(c.name.lower() for c in predicate.find_all(exp.Column))
        used += [Compared(str(literal.this), how, columns) for literal in predicate.find_all(exp.Literal)]
    for limit in tree.find_all(exp.Limit):
        used += [Compared(str(literal.this), "limit", frozenset()) for literal in limit.find_all(exp.Literal)]
    return used


def held(value: str, columns: frozenset[str]) -> bool:
    """Whether a column the value is compared against can hold a value of its kind (a state, a
    date, a status, a payment type); a value of no such kind, or a name that is no schema column
    (an alias the query made), is given the benefit of the doubt."""
    for is_kind, holds, _ in HOLDERS.values():
        if is_kind(value):
            return not columns or any(c not in SCHEMA_COLUMN_NAMES or holds(c) for c in columns)
    return True


# what SQLite's strftime writes for each of its formats' fields; a format with any other field is not judged
TIME_FIELDS = {"%Y": r"\d{4}", "%m": r"\d{2}", "%d": r"\d{2}", "%H": r"\d{2}", "%M": r"\d{2}", "%S": r"\d{2}",
               "%j": r"\d{3}", "%w": r"\d", "%W": r"\d{2}", "%%": "%"}
TIME_FIELD = re.compile(r"%.")


def time_shape(format_: str) -> re.Pattern | None:
    """The texts `strftime(format_, ...)` can write, as a pattern; None for a format with a field
    outside `TIME_FIELDS`."""
    parts, at = [], 0
    for field in TIME_FIELD.finditer(format_):
        if field.group() not in TIME_FIELDS:
            return None
        parts += [re.escape(format_[at:field.start()]), TIME_FIELDS[field.group()]]
        at = field.end()
    return re.compile("".join(parts) + re.escape(format_[at:]))


def _formatted(side: exp.Expression) -> tuple[str, re.Pattern] | None:
    """A `strftime` side's format and the shape of what it writes (`TimeToStr`, as sqlglot reads
    SQLite's), or None."""
    format_ = side.args.get("format") if isinstance(side, exp.TimeToStr) else None
    shape = time_shape(str(format_.this)) if isinstance(format_, exp.Literal) and format_.is_string else None
    return None if shape is None else (str(format_.this), shape)


def never_met(tree: exp.Expression) -> str | None:
    """An equality (= or IN) no row can meet: a `strftime` equated with a text its format never
    writes (`strftime('%Y', order_purchase_timestamp) = '2017-01'`: a year is four digits; `= 2017`:
    a number, which SQLite never finds equal to text), or a
    column of a known kind (a state, a date, a status, a payment type), and only such columns,
    equated with a literal of another kind (`strftime('%Y-%m', order_purchase_timestamp) =
    'Quantos pedidos?'`). Said, or None."""
    for predicate in tree.find_all(exp.EQ, exp.In):
        if isinstance(predicate.parent, exp.Not):
            continue
        # the literals it is equated with, not those inside an expression (a strftime format)
        sides = [predicate.left, predicate.right] if isinstance(predicate, exp.EQ) else [predicate.this, *predicate.expressions]
        literals = [side for side in sides if isinstance(side, exp.Literal)]
        for format_, shape in filter(None, map(_formatted, sides)):
            # strftime writes text, and SQLite never finds text equal to a number: `= 2017` is never met
            unwritten = [str(lit.this) if lit.is_string else lit.sql() for lit in literals
                         if not (lit.is_string and shape.fullmatch(str(lit.this)))]
            if unwritten:
                return f"it equates strftime('{format_}', ...) with {unwritten[0]!r}, a text it never writes: a condition no row meets"
        columns = {c.name.lower() for side in sides if not isinstance(side, exp.Literal) for c in side.find_all(exp.Column)}
        for _, holds, fits in HOLDERS.values():
            if columns and all(c in SCHEMA_COLUMN_NAMES and holds(c) for c in columns):
                wrong = [str(lit.this) for lit in literals if not fits(str(lit.this))]
                if wrong:
                    return f"it equates {sorted(columns)[0]} with {wrong[0]!r}, a value it never holds: a condition no row meets"
    return None


def _meant(how: str, value: str, cues: Cues) -> bool:
    """Whether a value is used with the operator the question means: a value it names without a
    comparison ("nota 5") is met by equality, never by > or < (`review_score > 5`), except a date,
    which a range may bound ("em 2017": `>= '2017-01-01' AND < '2018-01-01'`)."""
    if how == "excluded":
        return cues.negated
    if how == "limit":  # a LIMIT says how many rows: only the count the question asks for ("os 5 estados")
        return cues.count is not None and value == str(cues.count)
    wanted = dict(cues.comparisons).get(value)
    if wanted is None:
        return how in ("equal", "between") or value_kind(value) == "date"
    return how in (wanted, "between")


def _names(value: str, compared: Compared) -> bool:
    """Whether the compared literal names the value: as a word within it, and for a date that it
    is equated with, exactly (a LIKE's trailing wildcard aside): `= '2017-01'` is January, not the
    year 2017 the question names."""
    text = fold(compared.text)
    if compared.how == "equal" and value_kind(value) == "date":
        return text.rstrip("%").rstrip("-") == value
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text) is not None


def answer_columns(tree: exp.Expression) -> set[str]:
    """The columns the answer is made of: what it groups by and what it selects."""
    select = tree if isinstance(tree, exp.Select) else tree.find(exp.Select)
    if select is None:
        return set()
    columns = {c.name.lower() for e in select.expressions for c in e.find_all(exp.Column)}
    group = select.args.get("group")
    if group is not None:
        columns |= {c.name.lower() for c in group.find_all(exp.Column)}
    return columns


def _dumps_a_table(tree: exp.Expression) -> bool:
    """Rows as they are stored: no filter, grouping, aggregate, limit or DISTINCT."""
    select = tree if isinstance(tree, exp.Select) else tree.find(exp.Select)
    if select is None:
        return True
    shaped = ("where", "group", "having", "limit", "distinct")
    return not any(select.args.get(k) for k in shaped) and select.find(exp.AggFunc) is None


def question_match(cues: Cues, tree: exp.Expression, tables_used: set[str]) -> tuple[float, str]:
    """How much of what the question asks the SQL addresses, as the product of its parts, so
    missing one part costs its share however well the rest is done: a table its words point at
    (words are loose, so any one will do; the `orders_enriched` view answers for all), each value
    it names used in the query (values are exact: a state, a year, a number; all of them, or a
    tenth of their share, `PARTIAL_VALUES_PAID`), the aggregate it
    asks for, and the shape (grouped, ranked). A query that dumps a table matches nothing."""
    if not tables_used or is_constant(tree):
        return 0.0, "the result is a constant: no table is read, or only literals are selected"
    if _dumps_a_table(tree):
        return 0.0, "it returns a table's rows as stored: no filter, grouping, aggregate or limit"
    if any(predicate.find(exp.Column) is None for predicate in tree.find_all(*PREDICATES)):
        return 0.0, "it compares literals with each other: a condition that does not read the data"
    impossible = never_met(tree)
    if impossible:
        return 0.0, impossible
    literals = compared_literals(tree)
    parts, said = [], []
    if cues.tables:
        named = frozenset().union(*cues.tables)
        hit = bool(named & tables_used) or VIEW in tables_used
        parts.append(1.0 if hit else 0.0)
        said.append("reads a table the question names" if hit else f"reads none of {sorted(named)}")
    if cues.values:
        found = [v for v in cues.values if any(_meant(c.how, v, cues) and held(v, c.columns) and _names(v, c) for c in literals)]
        parts.append(1.0 if len(found) == len(cues.values) else PARTIAL_VALUES_PAID * len(found) / len(cues.values))
        missing = [v for v in cues.values if v not in found]
        said.append(f"{len(found)}/{len(cues.values)} values of the question used in the query" + (f" (missing {missing[:4]})" if missing else ""))
    if cues.aggregates:
        present = [name for name in cues.aggregates if tree.find(AGGREGATES[name]) is not None]
        used = [name for name, kind in AGGREGATES.items() if tree.find(kind) is not None]
        # every aggregate at once is no answer to a question that asks for one of them
        parts.append(len(present) / len(cues.aggregates) * (len(present) / len(used) if used else 0.0))
        said.append(f"{len(present)}/{len(cues.aggregates)} aggregates asked for ({', '.join(cues.aggregates)})"
                    + (f", {len(used)} used" if len(used) > len(present) else ""))
    if cues.measure:
        over = {c.name.lower() for node in tree.find_all(exp.Avg, exp.Sum) for c in node.find_all(exp.Column)}
        # an alias the query made (a sub-query's column) is given the benefit of the doubt
        hit = bool(cues.measure & over) or any(c not in SCHEMA_COLUMN_NAMES for c in over)
        parts.append(1.0 if hit else 0.0)
        said.append("averages or sums what the question measures" if hit else f"averages or sums none of {sorted(cues.measure)}")
    if cues.grouped:
        grouped = tree.find(exp.Group) is not None
        parts.append(1.0 if grouped else 0.0)
        said.append("grouped, as asked" if grouped else "not grouped, though the question asks per group")
    if cues.ranked:
        ranked = tree.find(exp.Order) is not None or tree.find(exp.Max, exp.Min) is not None
        parts.append(1.0 if ranked else 0.0)
        said.append("ranked, as asked" if ranked else "not ranked, though the question asks for the most or least")
    if cues.entity:
        made_of = bool(cues.entity & answer_columns(tree))
        parts.append(1.0 if made_of else 0.0)
        said.append("its rows are what the question asks for" if made_of else f"its rows are not {sorted(cues.entity)}")
    if not parts:
        return 0.5, "the question names no table or value to check against"
    return math.prod(parts), "; ".join(said)
