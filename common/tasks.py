"""The vocabulary of tasks, shared by every package: the kinds of engine, the traits a task has
(`TaskTraits`), and the facts of the structured outputs (contract §2): the extraction fields
and their domains, the push copy rules and campaigns. Pydantic models here are the one source
of the JSON schemas that vLLM constrains output to, of the prompts' wording of the domains, and
of the validation a correction must pass. Each task's entry (`tasks/`) holds which of these are
its own; the tasks themselves are there.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field


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
