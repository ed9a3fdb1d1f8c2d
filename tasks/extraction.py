"""Review extraction: a customer review in, the ten fields of `common.tasks.ExtractionOutput` out
(JSON, constrained by vLLM to the model's schema), scored field by field against a reference."""
from __future__ import annotations

from common.records import RewardContext, Sampling
from common.tasks import (
    COMPLAINT_CATEGORIES,
    MAX_KEY_PHRASES,
    MAX_SUMMARY_CHARS,
    SENTIMENT_SCORE_RANGE,
    SENTIMENTS,
    URGENCIES,
    EngineKind,
    ExtractionInput,
    ExtractionOutput,
    TaskTraits,
)
from rewards import extraction, references, trivial
from tasks.definition import TaskDefinition


def _review(context: RewardContext) -> str | None:
    return context.input.review if context.input is not None else None


SYSTEM_PROMPT = (
    "Você extrai dados de avaliações de clientes de e-commerce. Responda só com um objeto JSON com os campos: "
    f"sentiment ({'|'.join(SENTIMENTS)}), sentiment_score ({SENTIMENT_SCORE_RANGE[0]} a {SENTIMENT_SCORE_RANGE[1]}), "
    f"complaint_category ({'|'.join(COMPLAINT_CATEGORIES)}), "
    "product_mentioned (texto ou null), delivery_issue (true|false), would_recommend (true|false|null), "
    f"urgency ({'|'.join(URGENCIES)}), key_phrases (até {MAX_KEY_PHRASES} trechos da avaliação), "
    f"summary (até {MAX_SUMMARY_CHARS} caracteres), requires_response (true|false)."
)

EXTRACTION = TaskDefinition(
    name="extraction",
    traits=TaskTraits(EngineKind.BASE, scored_with_reference=True, thinks=False, runs_sql=False, answer_field=None, chat_input_json=False),
    sampling=Sampling(0.0, 1.0, 384),
    # a group of it (served by default, options.samples, a round's engine rollouts) samples at 0.7, and one sample alone is greedy:
    # GRPO on groups sampled at 0.3 lowered held-out reward by 0.106 and at 0.5 by 0.045; 0.7 and 1.0 moved nothing
    # (`tucano bench grpo-gain --temperature`, docs/results.md, 2026-12-03)
    group_temperature=0.7,
    input_model=ExtractionInput,
    output_model=ExtractionOutput,
    input_field="review",
    system_prompt=SYSTEM_PROMPT,
    user_message=lambda task_input: f"Avaliação:\n{task_input.review}",
    scorer=lambda completion, reference, context, fields: extraction.score(completion, reference, _review(context), fields),
    valid=lambda components, details, output: extraction.valid(output),
    field_shares=extraction.field_shares,
    check_reference=lambda value: references.structured("extraction", ExtractionOutput, value),
    makers=lambda refs: trivial.extraction_makers([r for r in refs if isinstance(r, dict)]),  # drawn from its references' own values
    cues=(
        (r"\b(chegou|veio|recebi|comprei|pedi)\b", 2), (r"\brecomendo\b|\bindico\b", 2), (r"\bavaliacao:", 3),
        (r"\b(defeito|quebrad|atrasou|atraso|embalagem|caixa)\b", 1), (r"\b(amei|gostei|pessim|horrivel|otim)", 1.5),
        (r"\b(nao compro|aguardo retorno|minha compra|meu pedido)\b", 2),
    ),
    # best of 4 raised its reward with references by +0.051 [+0.021, +0.082] on the 60 test rows, at 1.22x, 1.26x and
    # 1.30x the greedy p95 (and 1.63x, undecided, in a fourth run); served so, three labelled rounds gained +0.199
    # [+0.143, +0.257] as served, above the +0.134 of the greedy rounds issue 64 was filed on (run 48,
    # docs/results.md, 2026-12-05). On the tiny model it lifts the base as much as a round of corrections does
    serve_samples=4,
    examples=True,
    # measured at a lower learning rate than the general one (docs/results.md). GRPO learns from groups of 8: from 48
    # reference-free groups, 8 gained +0.032 where 4 lost 0.026 on the same rows, and 8 gained +0.015, +0.041, +0.041 and
    # +0.046 in four more runs (bench grpo-gain, docs/results.md, 2026-12-05 and 06); its served groups of 4 are completed
    # to 8 on the engine.
    # `auto` does not choose GRPO for extraction's unlabelled traffic: none of its 11 candidates in runs 46 and 49 to 52 was
    # promoted, and they drift to a null product and the category `none` (runs 49 to 52 at the gate: -0.070 and -0.081 significantly
    # worse; reward version 10 in bench grpo-gain: -0.057 and -0.055 [-0.107, -0.003] on the held-out rows, a null
    # product on 39 of 40), each round spending 1,000 to 1,800 s of the two cores on it (docs/results.md, 2026-12-06).
    # Its labels still train it (SFT); TUCANO_TRAIN_METHOD=grpo or TUCANO_TASK_TRAINING runs GRPO anyway
    training={"train_learning_rate": 0.001, "sft_batch_size": 4, "train_time_budget_s": 120.0, "sft_from_liked": False,
              "grpo_num_generations": 8, "auto_grpo": False},
)
