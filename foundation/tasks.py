"""Task specifications: the four task names, the extraction and push output schemas, and the
domains of every field (PRODUCT §2). Pydantic models here are the single source of the JSON
schemas that vLLM constrains output to and that rewards validate against.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TASKS = ("extraction", "sql", "push", "insights")

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

PUSH_TITLE_MAX = 40
PUSH_BODY_MAX = 140
PUSH_KEY_INFO_WITHIN = 49
PUSH_MAX_EMOJI = 2
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

    sentiment: Literal["positive", "neutral", "negative"]
    sentiment_score: float = Field(ge=1.0, le=5.0)
    complaint_category: Literal[
        "delivery_delay", "product_defect", "wrong_item", "missing_item", "quality",
        "customer_service", "price", "packaging", "other", "none",
    ]
    product_mentioned: str | None
    delivery_issue: bool
    would_recommend: bool | None
    urgency: Literal["low", "medium", "high"]
    key_phrases: list[str] = Field(max_length=5)
    summary: str = Field(max_length=200)
    requires_response: bool


class PushOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=PUSH_TITLE_MAX)
    body: str = Field(max_length=PUSH_BODY_MAX)


OUTPUT_MODELS: dict[str, type[BaseModel]] = {"extraction": ExtractionOutput, "push": PushOutput}


def output_json_schema(task: str) -> dict | None:
    """The JSON schema vLLM constrains a task's output to, or None for free-text tasks."""
    model = OUTPUT_MODELS.get(task)
    return model.model_json_schema() if model else None
