"""The PT-BR prompts of every task: one system prompt and one user-message template each.

The same functions render the prompts that serving sends to vLLM, that bootstrap trains the
tiny models on, and that training rounds regenerate completions for, so a model always sees
the exact wording it was trained with.
"""
from __future__ import annotations

import json

from common.commerce import SCHEMA_COLUMNS
from common.tasks import (
    COMPLAINT_CATEGORIES,
    MAX_KEY_PHRASES,
    MAX_SUMMARY_CHARS,
    PUSH_BODY_MAX,
    PUSH_MAX_EMOJI,
    PUSH_TITLE_MAX,
    SENTIMENT_SCORE_RANGE,
    SENTIMENTS,
    TRAITS,
    URGENCIES,
)
from rewards.parsing import split_think

SCHEMA_TEXT = "\n".join(f"{table}({', '.join(cols)})" for table, cols in SCHEMA_COLUMNS.items())

SYSTEM_PROMPTS = {
    "extraction": (
        "Você extrai dados de avaliações de clientes de e-commerce. Responda só com um objeto JSON com os campos: "
        f"sentiment ({'|'.join(SENTIMENTS)}), sentiment_score ({SENTIMENT_SCORE_RANGE[0]} a {SENTIMENT_SCORE_RANGE[1]}), "
        f"complaint_category ({'|'.join(COMPLAINT_CATEGORIES)}), "
        "product_mentioned (texto ou null), delivery_issue (true|false), would_recommend (true|false|null), "
        f"urgency ({'|'.join(URGENCIES)}), key_phrases (até {MAX_KEY_PHRASES} trechos da avaliação), "
        f"summary (até {MAX_SUMMARY_CHARS} caracteres), requires_response (true|false)."
    ),
    "sql": (
        "Você escreve uma única consulta SQLite SELECT, somente leitura, que responde à pergunta sobre a loja. "
        "Responda só com o SQL. Esquema:\n" + SCHEMA_TEXT
    ),
    "push": (
        "Você escreve notificações push em português do Brasil. Responda só com JSON {\"title\", \"body\"}: "
        f"título até {PUSH_TITLE_MAX} caracteres, corpo até {PUSH_BODY_MAX}, a informação principal no começo do corpo, "
        f"no máximo {PUSH_MAX_EMOJI} emojis, "
        "sem palavras em CAIXA ALTA, sem \"!!\", com o nome e o produto quando houver e um verbo de ação."
    ),
    "insights": (
        "Você é analista de e-commerce. Pense no problema e responda em português do Brasil com um resumo, "
        "pontos em lista com os números dos dados e uma recomendação."
    ),
}

PUSH_FIELD_LABELS = {
    "campaign": "campanha", "customer_name": "cliente", "product": "produto", "discount_pct": "desconto (%)",
    "coupon": "cupom", "deadline": "prazo",
}


def _review(task_input: dict) -> str:
    return f"Avaliação:\n{task_input['review']}"


def _question(task_input: dict) -> str:
    return f"Pergunta: {task_input['question']}"


def _campaign(task_input: dict) -> str:
    return "\n".join(f"{PUSH_FIELD_LABELS.get(k, k)}: {v}" for k, v in task_input.items() if v not in (None, ""))


def _question_and_data(task_input: dict) -> str:
    text = _question(task_input)
    if task_input.get("rows"):
        text += "\nDados (JSON):\n" + json.dumps({"columns": task_input.get("columns", []), "rows": task_input["rows"]}, ensure_ascii=False)
    return text


USER_MESSAGES = {"extraction": _review, "sql": _question, "push": _campaign, "insights": _question_and_data}


def user_message(task: str, task_input: dict) -> str:
    return USER_MESSAGES[task](task_input)


def answer_text(task: str, answer, *, think_opened: bool = False) -> str:
    """An answer as the model writes it in a chat: a structured answer's text field (push's
    `copy`...) or its JSON; a thinking task's answer either after a template that has opened
    `<think>` already (`think_opened`: what a training example completes) or without its think
    block (a demonstration shown as an earlier turn)."""
    field = TRAITS[task].answer_field
    if field:
        return answer[field] if isinstance(answer, dict) else str(answer)
    if TRAITS[task].thinks:
        text = str(answer)
        if not think_opened:
            return split_think(text).answer
        return text.removeprefix("<think>").lstrip("\n") if "</think>" in text else "</think>\n\n" + text
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)


def build_messages(task: str, task_input: dict, demonstrations: tuple[tuple[dict, str], ...] = ()) -> list[dict[str, str]]:
    """The chat of one request; `demonstrations` ((input, answer) pairs: the team's corrected or
    liked answers to similar inputs) come first as earlier turns of the same chat."""
    shown = [turn for example_input, answer in demonstrations
             for turn in ({"role": "user", "content": user_message(task, example_input)}, {"role": "assistant", "content": answer})]
    return [
        {"role": "system", "content": SYSTEM_PROMPTS[task]},
        *shown,
        {"role": "user", "content": user_message(task, task_input)},
    ]
