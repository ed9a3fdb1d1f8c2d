"""The task registry: for each task, how it is served and judged.

One `TaskSpec` per task: the engine it routes to (`base` with a LoRA per task, or `think`),
its sampling defaults (set explicitly on every request, never left to the model's
generation_config), the JSON schema vLLM constrains its output to, and how a chat message
becomes the task's input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from foundation.tasks import TASKS, output_json_schema


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None

    def override(self, temperature=None, top_p=None, max_tokens=None, seed=None) -> "Sampling":
        return Sampling(
            self.temperature if temperature is None else temperature,
            self.top_p if top_p is None else top_p,
            self.max_tokens if max_tokens is None else max_tokens,
            self.seed if seed is None else seed,
        )


@dataclass(frozen=True)
class TaskSpec:
    name: str
    engine: str  # "base" or "think"
    sampling: Sampling
    json_schema: dict | None
    input_field: str  # where a free-text chat message goes in the task input

    def input_from_text(self, text: str) -> dict:
        """A chat message as the task's input; push also accepts its campaign fields as JSON."""
        if self.name == "push":
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict) and value:
                return {str(k): v for k, v in value.items()}
        return {self.input_field: text}


REGISTRY: dict[str, TaskSpec] = {
    "extraction": TaskSpec("extraction", "base", Sampling(0.0, 1.0, 384), output_json_schema("extraction"), "review"),
    "sql": TaskSpec("sql", "base", Sampling(0.0, 1.0, 256), None, "question"),
    "push": TaskSpec("push", "base", Sampling(0.7, 0.95, 160), output_json_schema("push"), "briefing"),
    "insights": TaskSpec("insights", "think", Sampling(0.6, 0.95, 768), None, "question"),
}
assert set(REGISTRY) == set(TASKS)

PUBLIC_MODELS = {f"tucano-{task}": task for task in TASKS}
AUTO_MODEL = "tucano-auto"
