"""Business insights: a question and, optionally, data rows in, a reasoned PT-BR answer out (the
Think model, which may open with a `<think>` block), scored without a reference on grounding in
the data, structure and fluency."""
from __future__ import annotations

import json

from common.records import Sampling
from common.tasks import EngineKind, InsightsInput, TaskTraits
from rewards import insights, references, trivial
from tasks.definition import TaskDefinition

# A half-trained insights LoRA starts a list and does not stop, one line over and over until the
# token limit (docs/results.md, "insights, a penalty against loops"); a frequency penalty on the answer's own
# tokens ends those loops, and the data the answer cites is in the prompt, which it does not touch.
FREQUENCY_PENALTY = 0.3


def _question_and_data(task_input: InsightsInput) -> str:
    text = f"Pergunta: {task_input.question}"
    if task_input.rows:
        text += "\nDados (JSON):\n" + json.dumps({"columns": task_input.columns or [], "rows": task_input.rows}, ensure_ascii=False)
    return text


INSIGHTS = TaskDefinition(
    name="insights",
    traits=TaskTraits(EngineKind.THINK, scored_with_reference=False, thinks=True, runs_sql=False, answer_field=None, chat_input_json=False),
    sampling=Sampling(0.6, 0.95, 768, frequency_penalty=FREQUENCY_PENALTY),
    group_temperature=0.6,
    input_model=InsightsInput,
    output_model=None,
    input_field="question",
    system_prompt=("Você é analista de e-commerce. Pense no problema e responda em português do Brasil com um resumo, "
                   "pontos em lista com os números dos dados e uma recomendação."),
    user_message=_question_and_data,
    scorer=lambda completion, reference, context, fields: insights.score(completion, reference, context.input),
    valid=lambda components, details, output: bool(output),
    check_reference=lambda value: references.text("insights", value),
    makers=lambda refs: trivial.INSIGHTS_MAKERS,
    cues=(
        (r"\b(analise|analisar|insight|tendencia|sugere|o que isso|por que|porque|explique|estrategia|recomendacoes)\b", 2.5),
        (r"\bdados (json|de \d{4})|\bdados:", 3), (r"\bcomo (evolu|se distribuem|esta|estao)", 2.5),
        (r"\b(pior|piores|melhores|mais comuns|mais caro|geram mais)\b", 1.5), (r'"rows"', 3),
    ),
    auto_default=True,  # a general analysis question is the safe default of `tucano-auto`
    # its learning was measured with these (docs/results.md: insights, a penalty against loops)
    training={"train_learning_rate": 0.002, "sft_batch_size": 4, "train_time_budget_s": 90.0, "sft_from_liked": False,
              "train_gradient_checkpointing": True},
)
