"""The demo's task datasets, built from the synthetic commerce DB in the format of
`common.datasets` (one JSONL file per task and split). `reference` is what rewards score
against (contract §3; none for insights), `target` a demonstration completion.

Two kinds of rows, so that what the loop learns can be measured honestly:
- general rows (`bootstrap` split): what the demo model's bootstrap SFT reads. Reviews of a
  general catalogue, the general SQL patterns, the general push campaigns, the four general
  insights questions, analysed in the general style (the largest value, the first and last rows).
- the demo store's own rows (`train`, `eval`, `test`): reviews from its commerce DB about its
  own catalogue (with complaint categories the bootstrap never shows), its own SQL questions
  (`sql_patterns.TEAM_PATTERNS`), its own campaigns and products, its six insights questions,
  analysed in its analysts' style (the three largest values and the smallest, each named).
  `train` is the team's traffic, `eval` the gate's bootstrap eval split, `test` the rows
  `tucano bench learn` measures on.
- `holdout`: more general rows, drawn apart (their own random stream, after the others, so the
  bootstrap split stays the same) and never in the bootstrap split: what the demo model does on
  the kind of rows it was fine-tuned on but never saw (`tucano bench trivial`).
None of test, eval and holdout is ever in the bootstrap's SFT (or, for the tiny models, their
tokenizer and language-model corpus), and no input is in two splits.
"""
from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

from common.datasets import input_key
from common.tasks import PUSH_BODY_MAX, PUSH_CAMPAIGNS, PUSH_TITLE_MAX
from demo.reviews import GENERAL_PRODUCTS, TEAM_PRODUCTS, general_scenarios, make_review
from demo.sql_patterns import JOIN_PATTERNS, PATTERNS, PAYMENT_TYPE_WORDS, TEAM_PATTERNS, Pattern

TEST_SIZE = {"extraction": 60, "sql": 60, "push": 60, "insights": 36}
HOLDOUT_SIZE = {"extraction": 60, "sql": 40, "push": 60, "insights": 12}
EVAL_SIZE = {"extraction": 100, "sql": 100, "push": 100, "insights": 24}
GENERAL_REVIEWS = 1200
TEAM_CAMPAIGNS = ("volta_ao_estoque", "black_friday", "pedir_avaliacao")
assert set(TEAM_CAMPAIGNS) < set(PUSH_CAMPAIGNS)


def _jsonl_dump(rows: list[dict], path: Path) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _unique(rows: list[dict]) -> list[dict]:
    return list({input_key(r["input"]): r for r in rows}.values())


def _split(general: list[dict], team: list[dict], task: str, rng: random.Random) -> dict[str, list[dict]]:
    """The general rows as the bootstrap split; the team's rows, none of whose inputs is a general
    row's, shuffled into test, eval and train."""
    bootstrap = _unique(general)
    seen = {input_key(r["input"]) for r in bootstrap}
    own = [r for r in _unique(team) if input_key(r["input"]) not in seen]
    rng.shuffle(own)
    n_test = min(TEST_SIZE[task], len(own) // 4)
    n_eval = min(EVAL_SIZE[task], len(own) // 4)
    splits = {"bootstrap": bootstrap, "test": own[:n_test], "eval": own[n_test:n_test + n_eval], "train": own[n_test + n_eval:]}
    for split, rows in splits.items():
        for i, row in enumerate(rows):
            row["id"] = f"{task}-{split}-{i:05d}"
    return splits


# --- extraction -------------------------------------------------------------------------

def extraction_rows(labelled_reviews: list[dict]) -> list[dict]:
    return [
        {"task": "extraction", "input": {"review": r["review"]}, "reference": r["reference"],
         "target": json.dumps(r["reference"], ensure_ascii=False)}
        for r in labelled_reviews
    ]


def general_reviews(rng: random.Random, n: int = GENERAL_REVIEWS) -> list[dict]:
    """Reviews of the general catalogue, in the general scenarios, labelled like the DB's."""
    return [{"review": text, "reference": reference}
            for text, reference, _ in (make_review(rng, None, GENERAL_PRODUCTS, general_scenarios()) for _ in range(n))]


# --- sql --------------------------------------------------------------------------------

def _param_values(con: sqlite3.Connection) -> dict[str, list]:
    def column(sql: str) -> list:
        return [row[0] for row in con.execute(sql)]
    months = column("SELECT DISTINCT strftime('%Y-%m', order_purchase_timestamp) FROM olist_orders_dataset ORDER BY 1")
    return {
        "status": column("SELECT DISTINCT order_status FROM olist_orders_dataset"),
        "uf": column("SELECT DISTINCT customer_state FROM olist_customers_dataset"),
        "cat": column("SELECT DISTINCT product_category_name FROM olist_products_dataset"),
        "ptype": [p for p in column("SELECT DISTINCT payment_type FROM olist_order_payments_dataset") if p in PAYMENT_TYPE_WORDS],
        "score": [1, 2, 3, 4, 5],
        "year": ["2016", "2017", "2018"],
        "month": [tuple(m.split("-")) for m in months],
        "threshold": [3.5, 3.8, 4, 4.2],
        "k": [1, 2, 3, 5, 8, 10],
    }


def sql_rows(con: sqlite3.Connection, rng: random.Random, per_pattern: int = 30, team: bool | None = None,
             patterns: tuple[Pattern, ...] = PATTERNS) -> list[dict]:
    """Questions of every one of `patterns` (team None), the team's own (True) or the general ones (False)."""
    values = _param_values(con)
    rows = []
    nonempty: dict[str, bool] = {}  # a query drawn again (few values, many draws) is not run again
    for pattern_id, phrasings, sql_template, kinds in patterns:
        if team is not None and (pattern_id in TEAM_PATTERNS) != team:
            continue
        for _ in range(per_pattern if kinds else 2):
            sql_params, text_params = {}, {}
            for kind in kinds:
                value = rng.choice(values[kind])
                if kind == "month":
                    sql_params["year"], sql_params["month"] = value
                    text_params["year"], text_params["month"] = value
                else:
                    sql_params[kind] = value
                    text_params[kind] = PAYMENT_TYPE_WORDS.get(value, value) if kind == "ptype" else value
            question = rng.choice(phrasings).format(**text_params)
            sql = sql_template.format(**sql_params)
            if sql not in nonempty:
                result = con.execute(sql).fetchall()
                nonempty[sql] = bool(result) and any(v is not None for v in result[0])
            if not nonempty[sql]:
                continue
            rows.append({"task": "sql", "input": {"question": question}, "reference": {"sql": sql},
                         "target": sql, "pattern": pattern_id})
    return rows


# --- push -------------------------------------------------------------------------------

NAMES = ("Ana", "João", "Maria", "Pedro", "Juliana", "Lucas", "Fernanda", "Rafael", "Camila", "Bruno",
         "Larissa", "Gabriel", "Beatriz", "Thiago", "Patrícia", "Marcos", "Aline", "Diego", "Carla", "Vitor")
EMOJI = ("🛒", "🔥", "📦", "⭐", "🎉", "💸", "⏰")
PUSH_COPY = {
    "carrinho_abandonado": ("seu carrinho te espera", "Finalize sua compra antes que acabe."),
    "queda_de_preco": ("o preço caiu", "Aproveite enquanto durar o estoque."),
    "volta_ao_estoque": ("voltou ao estoque", "Garanta o seu antes que esgote de novo."),
    "pedido_enviado": ("seu pedido saiu", "Acompanhe a entrega pelo app."),
    "pedido_entregue": ("pedido entregue", "Confira se está tudo certo com a sua compra."),
    "cupom": ("tem cupom pra você", "Use o cupom no carrinho e economize."),
    "black_friday": ("Black Friday chegou", "Aproveite as ofertas só hoje."),
    "pedir_avaliacao": ("conta pra gente", "Avalie sua compra em poucos segundos."),
}


def push_context(rng: random.Random, campaigns: tuple[str, ...] = PUSH_CAMPAIGNS,
                 products: tuple[tuple[str, str], ...] = GENERAL_PRODUCTS + TEAM_PRODUCTS) -> dict:
    campaign = rng.choice(campaigns)
    context = {"campaign": campaign}
    if rng.random() < 0.8:
        context["customer_name"] = rng.choice(NAMES)
    if rng.random() < 0.8:
        context["product"] = rng.choice(products)[0]
    if campaign in ("carrinho_abandonado", "queda_de_preco", "cupom", "black_friday") and rng.random() < 0.8:
        context["discount_pct"] = rng.choice((5, 10, 15, 20, 25, 30, 40))
    if campaign == "cupom":
        context["coupon"] = rng.choice(("VOLTA10", "FRETE0", "BEMVINDO15", "TUCANO20"))
    if rng.random() < 0.3:
        context["deadline"] = rng.choice(("hoje", "até domingo", "nas próximas 24h"))
    return context


def push_reference(context: dict, rng: random.Random) -> dict:
    title_tail, call = PUSH_COPY[context["campaign"]]
    name = context.get("customer_name")
    title = f"{name}, {title_tail}" if name and len(name) + len(title_tail) + 2 <= PUSH_TITLE_MAX - 2 else title_tail[0].upper() + title_tail[1:]
    if rng.random() < 0.4:
        title += " " + rng.choice(EMOJI)
    lead = []
    if context.get("discount_pct"):
        lead.append(f"{context['discount_pct']}% off")
    if context.get("product"):
        lead.append(context["product"])
    if context.get("coupon"):
        lead.append(f"cupom {context['coupon']}")
    head = (" em " if len(lead) > 1 and "off" in lead[0] else " ").join(lead[:2]) or "Seu pedido"
    head = head[0].upper() + head[1:]
    body = f"{head}. {call}"
    if context.get("deadline"):
        body += f" Vale {context['deadline']}."
    return {"title": title[:PUSH_TITLE_MAX], "body": body[:PUSH_BODY_MAX]}


def push_rows(rng: random.Random, n: int = 1200, team: bool | None = None) -> list[dict]:
    """Push contexts of any campaign (team None), the team's campaigns about its catalogue (True), or
    the general campaigns about the general catalogue (False)."""
    campaigns, products = PUSH_CAMPAIGNS, GENERAL_PRODUCTS + TEAM_PRODUCTS
    if team is not None:
        campaigns = TEAM_CAMPAIGNS if team else tuple(c for c in PUSH_CAMPAIGNS if c not in TEAM_CAMPAIGNS)
        products = TEAM_PRODUCTS if team else GENERAL_PRODUCTS
    rows = []
    for _ in range(n):
        context = push_context(rng, campaigns, products)
        reference = push_reference(context, rng)
        rows.append({"task": "push", "input": context, "reference": reference,
                     "target": json.dumps(reference, ensure_ascii=False)})
    return rows


# --- insights ---------------------------------------------------------------------------

GENERAL_INSIGHT_QUERIES = (
    ("Quais estados geram mais receita e o que isso sugere para a loja?",
     "SELECT c.customer_state AS estado, ROUND(SUM(p.payment_value), 2) AS receita FROM olist_order_payments_dataset p "
     "JOIN olist_orders_dataset o ON o.order_id = p.order_id JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}' GROUP BY estado ORDER BY receita DESC LIMIT {limit}",
     "concentrar mídia e estoque nos estados líderes e testar frete reduzido nos demais"),
    ("Como evoluíram os pedidos mês a mês?",
     "SELECT strftime('%m', order_purchase_timestamp) AS mes, COUNT(*) AS pedidos FROM olist_orders_dataset "
     "WHERE strftime('%Y', order_purchase_timestamp) = '{year}' GROUP BY mes ORDER BY mes LIMIT {limit}",
     "planejar estoque e campanhas para os meses de pico"),
    ("Quais categorias têm a pior avaliação média?",
     "SELECT product_category_name AS categoria, ROUND(AVG(review_score), 2) AS nota FROM orders_enriched "
     "WHERE review_score IS NOT NULL AND strftime('%Y', order_purchase_timestamp) = '{year}' "
     "GROUP BY categoria HAVING COUNT(*) >= 5 ORDER BY nota ASC LIMIT {limit}",
     "revisar fornecedores e descrições das categorias com pior nota"),
    ("Como se distribuem as formas de pagamento?",
     "SELECT payment_type AS forma, COUNT(*) AS pagamentos FROM olist_order_payments_dataset p "
     "JOIN olist_orders_dataset o ON o.order_id = p.order_id WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}' "
     "GROUP BY forma ORDER BY pagamentos DESC LIMIT {limit}",
     "oferecer parcelamento e descontos no boleto para ampliar a conversão"),
)

TEAM_INSIGHT_QUERIES = (  # the demo store's own questions
    ("Em quais estados os atrasos de entrega são mais comuns?",
     "SELECT c.customer_state AS estado, ROUND(100.0 * SUM(o.order_delivered_customer_date > o.order_estimated_delivery_date) "
     "/ COUNT(*), 1) AS atraso_pct FROM olist_orders_dataset o JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE o.order_status = 'delivered' AND strftime('%Y', o.order_purchase_timestamp) = '{year}' "
     "GROUP BY estado HAVING COUNT(*) >= 10 ORDER BY atraso_pct DESC LIMIT {limit}",
     "renegociar com transportadoras nos estados com mais atraso e ajustar o prazo prometido"),
    ("Quais categorias têm o frete mais caro?",
     "SELECT p.product_category_name AS categoria, ROUND(AVG(i.freight_value), 2) AS frete_medio "
     "FROM olist_order_items_dataset i JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "JOIN olist_orders_dataset o ON o.order_id = i.order_id WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}' "
     "GROUP BY categoria HAVING COUNT(*) >= 5 ORDER BY frete_medio DESC LIMIT {limit}",
     "rever embalagens e tabelas de frete das categorias mais pesadas"),
    ("Quais cidades fazem mais pedidos?",
     "SELECT c.customer_city AS cidade, COUNT(*) AS pedidos FROM olist_orders_dataset o "
     "JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}' GROUP BY cidade ORDER BY pedidos DESC LIMIT {limit}",
     "reforçar a entrega expressa e os anúncios locais nas cidades que mais compram"),
    ("Qual é o ticket médio de cada estado?",
     "SELECT c.customer_state AS estado, ROUND(AVG(p.payment_value), 2) AS ticket_medio FROM olist_order_payments_dataset p "
     "JOIN olist_orders_dataset o ON o.order_id = p.order_id JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}' GROUP BY estado HAVING COUNT(*) >= 10 "
     "ORDER BY ticket_medio DESC LIMIT {limit}",
     "oferecer kits e frete grátis acima de um valor mínimo nos estados de ticket mais baixo"),
    ("Quais categorias vendem mais itens?",
     "SELECT p.product_category_name AS categoria, COUNT(*) AS itens FROM olist_order_items_dataset i "
     "JOIN olist_products_dataset p ON p.product_id = i.product_id JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}' GROUP BY categoria ORDER BY itens DESC LIMIT {limit}",
     "garantir estoque e destaque na vitrine para as categorias campeãs de venda"),
    ("Em quais estados a entrega demora mais?",
     "SELECT c.customer_state AS estado, ROUND(AVG(julianday(o.order_delivered_customer_date) "
     "- julianday(o.order_purchase_timestamp)), 1) AS dias_entrega FROM olist_orders_dataset o "
     "JOIN olist_customers_dataset c ON c.customer_id = o.customer_id WHERE o.order_status = 'delivered' "
     "AND strftime('%Y', o.order_purchase_timestamp) = '{year}' GROUP BY estado HAVING COUNT(*) >= 10 "
     "ORDER BY dias_entrega DESC LIMIT {limit}",
     "abrir um centro de distribuição ou trocar de transportadora nos estados mais lentos"),
)
# The store's first two questions are drawn from the shared random stream, as they always were;
# the ones added later from a stream of their own, so that adding them moved no other task's rows.
FIRST_TEAM_INSIGHT_QUERIES = 2
INSIGHT_QUERIES = GENERAL_INSIGHT_QUERIES + TEAM_INSIGHT_QUERIES
TEAM_QUESTIONS = frozenset(question for question, _, _ in TEAM_INSIGHT_QUERIES)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}".replace(".", ",")
    return str(value)


def insights_demonstration(question: str, columns: list[str], rows: list[list], advice: str) -> str:
    """The general analysis the bootstrap fine-tunes on: the largest value, the first and the last row."""
    label, metric = columns[0], columns[1]
    top, bottom = rows[0], rows[-1]
    highest = max(rows, key=lambda r: r[1])
    think = (f"A pergunta é: {question} Tenho {len(rows)} linhas com {label} e {metric}. "
             f"O maior valor é {highest[0]} com {_fmt(highest[1])}.")
    lines = [f"Resumo: entre os {len(rows)} registros, {highest[0]} se destaca com {metric} de {_fmt(highest[1])}."]
    lines.append(f"- Primeiro da lista: {top[0]} ({_fmt(top[1])}).")
    lines.append(f"- Último da lista: {bottom[0]} ({_fmt(bottom[1])}).")
    lines.append(f"Recomendação: {advice}.")
    return f"<think>\n{think}\n</think>\n\n" + "\n".join(lines)


def team_insights_demonstration(question: str, columns: list[str], rows: list[list], advice: str) -> str:
    """How the store's own analysts write: the three largest values, each named with its figure,
    and the smallest, before the recommendation. The bootstrap never reads this style; it is what
    the team's corrections teach."""
    label, metric = columns[0], columns[1]
    ranked = sorted(rows, key=lambda r: r[1], reverse=True)
    leaders, lowest = ranked[:3], ranked[-1]
    named = ", ".join(f"{r[0]} ({_fmt(r[1])})" for r in leaders)
    think = (f"A pergunta é: {question} São {len(rows)} linhas de {label} e {metric}. "
             f"Os maiores: {named}. O menor: {lowest[0]} ({_fmt(lowest[1])}).")
    lead, *others = leaders
    lines = [f"Resumo: {lead[0]} lidera em {metric} com {_fmt(lead[1])}"
             + (", à frente de " + " e ".join(f"{r[0]} ({_fmt(r[1])})" for r in others) if others else "") + "."]
    lines += [f"- {r[0]}: {metric} de {_fmt(r[1])}." for r in leaders]
    if lowest not in leaders:
        lines.append(f"- Na outra ponta, {lowest[0]} tem {metric} de {_fmt(lowest[1])}.")
    lines.append(f"Recomendação: {advice}.")
    return f"<think>\n{think}\n</think>\n\n" + "\n".join(lines)


def insights_rows(con: sqlite3.Connection, rng: random.Random, queries=INSIGHT_QUERIES, limits: range = range(3, 16)) -> list[dict]:
    """Analyses of the given questions: the team's own are demonstrated in the team's style, the
    others in the general one."""
    rows = []
    for question, sql_template, advice in queries:
        demonstrate = team_insights_demonstration if question in TEAM_QUESTIONS else insights_demonstration
        for year in ("2017", "2018"):
            for limit in limits:
                cursor = con.execute(sql_template.format(year=year, limit=limit))
                columns = [d[0] for d in cursor.description]
                data = [list(r) for r in cursor.fetchall()]
                if len(data) < 2:
                    continue
                asked = f"{question} (dados de {year})"
                rows.append({"task": "insights", "input": {"question": asked, "columns": columns, "rows": data},
                             "reference": None, "target": demonstrate(asked, columns, data, advice)})
    rng.shuffle(rows)
    return rows


def team_insights_rows(con: sqlite3.Connection, rng: random.Random, seed: int) -> list[dict]:
    """The store's own analyses: its first questions from the shared stream `rng`, the later ones
    from their own stream (FIRST_TEAM_INSIGHT_QUERIES)."""
    first, later = TEAM_INSIGHT_QUERIES[:FIRST_TEAM_INSIGHT_QUERIES], TEAM_INSIGHT_QUERIES[FIRST_TEAM_INSIGHT_QUERIES:]
    return insights_rows(con, rng, first) + insights_rows(con, random.Random(seed + 2), later)


def _holdout(con: sqlite3.Connection, seed: int, taken: dict[str, set[str]]) -> dict[str, list[dict]]:
    """Fresh general rows, none of whose inputs is in another split, from their own random stream."""
    rng = random.Random(seed + 1)
    fresh = {
        "extraction": extraction_rows(general_reviews(rng, 2 * HOLDOUT_SIZE["extraction"])),
        "sql": sql_rows(con, rng, 6, team=False),
        "push": push_rows(rng, 2 * HOLDOUT_SIZE["push"], team=False),
        "insights": insights_rows(con, rng, GENERAL_INSIGHT_QUERIES, limits=range(16, 22)),
    }
    out = {}
    for task, rows in fresh.items():
        rows = [r for r in _unique(rows) if input_key(r["input"]) not in taken[task]]
        rng.shuffle(rows)
        out[task] = rows[:HOLDOUT_SIZE[task]]
        for i, row in enumerate(out[task]):
            row["id"] = f"{task}-holdout-{i:05d}"
    return out


def build(db_path: Path, labelled_reviews: list[dict], out_dir: Path, seed: int) -> dict[str, dict[str, int]]:
    """Write every task's splits under out_dir; return the row counts. `labelled_reviews` are the
    commerce DB's written reviews: the demo store's own."""
    rng = random.Random(seed)
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        by_task = {
            "extraction": (extraction_rows(general_reviews(rng)), extraction_rows(labelled_reviews)),
            "sql": (sql_rows(con, rng, 30, team=False) + sql_rows(con, random.Random(seed + 3), 30, patterns=JOIN_PATTERNS),
                    sql_rows(con, rng, 100, team=True)),
            "push": (push_rows(rng, 1000, team=False), push_rows(rng, 600, team=True)),
            "insights": (insights_rows(con, rng, GENERAL_INSIGHT_QUERIES), team_insights_rows(con, rng, seed)),
        }
        splits = {task: _split(general, team, task, rng) for task, (general, team) in by_task.items()}
        taken = {task: {input_key(r["input"]) for rows in task_splits.values() for r in rows} for task, task_splits in splits.items()}
        for task, rows in _holdout(con, seed, taken).items():
            splits[task]["holdout"] = rows
    finally:
        con.close()
    counts = {}
    for task, task_splits in splits.items():
        (out_dir / task).mkdir(parents=True, exist_ok=True)
        for split, split_rows in task_splits.items():
            _jsonl_dump(split_rows, out_dir / task / f"{split}.jsonl")
        counts[task] = {split: len(r) for split, r in task_splits.items()}
    return counts
