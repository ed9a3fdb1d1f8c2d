"""The vocabulary of tasks, shared by every package: the kinds of engine, the traits a task has
(`TaskTraits`), each task's input model, and the facts of the structured outputs (contract §2):
the extraction fields and their domains, the push copy rules and campaigns. Pydantic models here
are the one source of what a request's input must be, of the JSON schemas that vLLM constrains
output to, of the prompts' wording of the domains, and of the validation a correction must pass.
A task input stays its model from the edge (or from the store, `tasks.typed_input`) to the prompt,
the reward and the review queue, which read its fields by name. Each task's entry (`tasks/`) holds which of these are
its own; the tasks themselves are there.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineKind(StrEnum):
    """The kinds of vLLM engine: the Base model, with one LoRA per task, and the Think model."""
    BASE = "base"
    THINK = "think"


class TaskTraits(NamedTuple):
    """What the rest of the service asks of a task, answered by its entry (`tasks/`) instead of
    `task == "..."` tests spread over the code."""
    engine: EngineKind  # the vLLM server that answers it
    scored_with_reference: bool  # its answers are scored against a reference when one is given (insights' never are)
    thinks: bool  # its answers may open with a <think> block, which is returned apart from the answer
    runs_sql: bool  # its answer is a query the service can run against the commerce DB
    answer_field: str | None  # the field of a structured answer that holds what the model writes (None: the answer is the text)
    chat_input_json: bool  # a chat message may be its input's fields as one JSON object (push's customer, product, campaign)


SENTIMENTS = ("positive", "neutral", "negative")
COMPLAINT_CATEGORIES = (
    "delivery_delay", "product_defect", "wrong_item", "missing_item", "quality",
    "customer_service", "price", "packaging", "other", "none",
)
URGENCIES = ("low", "medium", "high")
EXTRACTION_FIELDS = (
    "sentiment", "sentiment_score", "complaint_category", "product_mentioned", "delivery_issue",
    "would_recommend", "urgency", "key_phrases", "summary", "requires_response",
)
SENTIMENT_SCORE_RANGE = (1.0, 5.0)
MAX_KEY_PHRASES = 5
MAX_SUMMARY_CHARS = 200

PUSH_TITLE_MAX = 40
PUSH_BODY_MAX = 140
PUSH_KEY_INFO_WITHIN = 49
PUSH_MAX_EMOJI = 2
PUSH_MAX_CAPS_LETTERS = 4  # an all-caps word longer than this is shouting
PUSH_MAX_PAYLOAD_BYTES = 4096
PUSH_ACTION_VERBS = (
    "confira", "aproveite", "finalize", "garanta", "compre", "veja", "acompanhe", "avalie",
    "conte", "descubra", "use", "volte", "resgate", "complete", "acesse", "escolha",
)
PUSH_CAMPAIGNS = (
    "carrinho_abandonado", "queda_de_preco", "volta_ao_estoque", "pedido_enviado",
    "pedido_entregue", "cupom", "black_friday", "pedir_avaliacao",
)
# What each campaign is about, in words: the prompt says it beside the identifier, since a small
# model copies "volta_ao_estoque" as "seu volta saiu" and never learns the message of a campaign
# it was not fine-tuned on (docs/results.md, 2026-12-06: back in stock's message in 0 of 544 samples).
PUSH_CAMPAIGN_MESSAGES = {
    "carrinho_abandonado": "o cliente deixou produtos no carrinho e não finalizou a compra",
    "queda_de_preco": "o preço do produto baixou",
    "volta_ao_estoque": "o produto voltou ao estoque e está disponível de novo",
    "pedido_enviado": "o pedido do cliente foi enviado e está a caminho",
    "pedido_entregue": "o pedido do cliente foi entregue",
    "cupom": "o cliente ganhou um cupom de desconto",
    "black_friday": "as ofertas da Black Friday começaram",
    "pedir_avaliacao": "peça ao cliente que avalie a compra",
}
assert set(PUSH_CAMPAIGN_MESSAGES) == set(PUSH_CAMPAIGNS)


# --- what a request's `input` must be, per task (contract §2): validated at the edge and carried as
# these models to the prompt, the reward and the review queue

class ExtractionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    review: str = Field(min_length=1, max_length=20_000, description="The customer review, PT-BR.")


class SqlInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=2_000)


class PushInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    campaign: str | None = Field(None, max_length=100)
    customer_name: str | None = Field(None, max_length=100)
    product: str | None = Field(None, max_length=200)
    discount_pct: int | None = Field(None, ge=0, le=100)
    coupon: str | None = Field(None, max_length=50)
    deadline: str | None = Field(None, max_length=100)
    briefing: str | None = Field(None, max_length=2_000)

    @model_validator(mode="after")
    def _says_something(self) -> PushInput:
        if not (self.campaign or self.customer_name or self.product or self.briefing):
            raise ValueError("push needs at least one of campaign, customer_name, product, briefing")
        return self


class InsightsInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=4_000)
    columns: list[str] | None = Field(None, max_length=50)
    rows: list[list[str | int | float | bool | None]] | None = Field(None, max_length=500)


# --- what a structured task answers

class ExtractionOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sentiment: Literal[SENTIMENTS]
    sentiment_score: float = Field(ge=SENTIMENT_SCORE_RANGE[0], le=SENTIMENT_SCORE_RANGE[1])
    complaint_category: Literal[COMPLAINT_CATEGORIES]
    product_mentioned: str | None
    delivery_issue: bool
    would_recommend: bool | None
    urgency: Literal[URGENCIES]
    key_phrases: list[str] = Field(max_length=MAX_KEY_PHRASES)
    summary: str = Field(max_length=MAX_SUMMARY_CHARS)
    requires_response: bool


class PushOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=PUSH_TITLE_MAX)
    body: str = Field(min_length=1, max_length=PUSH_BODY_MAX)


assert tuple(ExtractionOutput.model_fields) == EXTRACTION_FIELDS
