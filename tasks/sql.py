"""Text-to-SQL: a question about the store in, one read-only SQLite SELECT out, scored by running
it against the commerce DB (the `RewardContext`'s `db_path`, within its time limit and row cap) and, with a reference, by comparing results."""
from __future__ import annotations

from pathlib import Path

from common.commerce import SCHEMA_COLUMNS
from common.records import RewardContext, Sampling
from common.tasks import EngineKind, SqlInput, TaskTraits
from rewards import references, sql, trivial
from rewards.sql_question import question_intent
from tasks.definition import TaskDefinition

SCHEMA_TEXT = "\n".join(f"{table}({', '.join(cols)})" for table, cols in SCHEMA_COLUMNS.items())


def _score(completion: str, reference, context: RewardContext, fields: dict):
    if not context.db_path or context.timeout_s is None or context.row_cap is None:
        raise ValueError("scoring SQL needs the commerce DB and the query limits: a RewardContext with db_path, timeout_s "
                         "and row_cap (Settings.reward_context)")
    return sql.score(completion, reference, context.input.question if context.input is not None else "", Path(context.db_path), context.timeout_s,
                     context.row_cap)


def _intent(task_input: SqlInput) -> frozenset[str]:
    """What the question asks (tables, aggregate, shape, kinds of value), which other words can ask too."""
    return question_intent(task_input.question)


SQL = TaskDefinition(
    name="sql",
    traits=TaskTraits(EngineKind.BASE, scored_with_reference=True, thinks=False, runs_sql=True, answer_field="sql", chat_input_json=False),
    sampling=Sampling(0.0, 1.0, 256),
    group_temperature=0.7,  # greedy alone; a group of it (options.samples, or a team's serve_samples) samples
    input_model=SqlInput,
    output_model=None,
    input_field="question",
    system_prompt=("Você escreve uma única consulta SQLite SELECT, somente leitura, que responde à pergunta sobre a loja. "
                   "Responda só com o SQL. Esquema:\n" + SCHEMA_TEXT),
    user_message=lambda task_input: f"Pergunta: {task_input.question}",
    scorer=_score,
    valid=lambda components, details, output: sql.valid(components, details),
    check_reference=lambda value: references.query("sql", "sql", value),
    makers=lambda refs: trivial.SQL_MAKERS,
    cues=(
        (r"\bsql\b|\bselect\b|\bconsulta\b", 3), (r"^\s*(pergunta:\s*)?(quantos|quantas|qual o numero|qual a quantidade|qual o total)", 2.5),
        (r"\bliste\b|\bmostre\b", 1.5),
        (r"\bqual (o|a) (valor|media|nota|preco|peso|tempo|frete|faturamento|ticket|maior|porcentagem|percentual|cidade|nome)", 2),
        (r"\bquais (os|as) \d+\b", 2), (r"\b(em que|em quais) (estado|cidade|mes|ano)|\bqual foi o\b|\bque (nota|percentual)\b", 2),
        (r"\bquanto (custa|pesa|se paga|foi|somam|e,)", 1.5), (r"\bem media\b", 1),
        (r"\b(olist_|orders_enriched|customer_|product_|payment_|review_score)", 2),
    ),
    # groups of 8 on the engine: in three runs of bench grpo-gain (48 groups, 48 steps) they gained
    # +0.066 to +0.072 on held-out rows on the bootstrap of 2026-12-05, each interval above 0, and
    # groups of 4 -0.009 to +0.055; on today's bootstrap +0.000 to +0.054. In three rounds from
    # traffic alone, +0.072, +0.029, +0.008, +0.029 and +0.056 (runs 44, 45, 47, 54, 55;
    # docs/results.md). A step takes 1.6x as long, so a round's budget holds fewer
    training={"grpo_num_generations": 8},
    examples=True,
    review_view=_intent,
    relevance="question_match",
)
