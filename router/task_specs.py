"""Task specs: for each task, how it is served and judged.

One `TaskSpec` per task: the engine it routes to (`common.tasks.TASK_ENGINE`),
its sampling defaults (set explicitly on every request, never left to the model's
generation_config), the JSON schema vLLM constrains its output to, and how a chat message
becomes the task's input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.records import Sampling
from common.tasks import TASK_ENGINE, TASKS, TRAITS, EngineKind, output_json_schema


@dataclass(frozen=True)
class TaskSpec:
    name: str
    engine: EngineKind
    sampling: Sampling
    json_schema: dict | None
    input_field: str  # where a free-text chat message goes in the task input
    group_temperature: float  # a request sampled n > 1 times without a temperature of its own: greedy samples would all agree

    def sampling_for(self, n: int, overrides: dict) -> Sampling:
        """The request's sampling: the task's defaults, then `overrides` (the request's own options);
        a group (n > 1) of a greedy task samples at `group_temperature` unless the request set one."""
        sampling = self.sampling.override(**overrides, n=n)
        if n > 1 and overrides.get("temperature") is None and sampling.temperature == 0.0:
            sampling = sampling.override(temperature=self.group_temperature)
        return sampling

    def input_from_text(self, text: str) -> dict:
        """A chat message as the task's input; a task whose trait says so also accepts its input's fields as JSON."""
        if TRAITS[self.name].chat_input_json:
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict) and value:
                return {str(k): v for k, v in value.items()}
        return {self.input_field: text}


# A half-trained insights LoRA starts a list and does not stop, one line over and over until the
# token limit (docs/results.md, "insights, a penalty against loops"); a frequency penalty on the answer's own
# tokens ends those loops, and the data the answer cites is in the prompt, which it does not touch.
INSIGHTS_FREQUENCY_PENALTY = 0.3
SAMPLING = {
    "extraction": Sampling(0.0, 1.0, 384), "sql": Sampling(0.0, 1.0, 256), "push": Sampling(0.7, 0.95, 160),
    "insights": Sampling(0.6, 0.95, 768, frequency_penalty=INSIGHTS_FREQUENCY_PENALTY),
}
INPUT_FIELD = {"extraction": "review", "sql": "question", "push": "briefing", "insights": "question"}
# Extraction and SQL answer greedily alone; a group of them (options.samples, or a team's serve_samples) samples.
GROUP_TEMPERATURE = {"extraction": 0.7, "sql": 0.7, "push": 0.7, "insights": 0.6}
TASK_SPECS: dict[str, TaskSpec] = {
    task: TaskSpec(task, TASK_ENGINE[task], SAMPLING[task], output_json_schema(task), INPUT_FIELD[task], GROUP_TEMPERATURE[task])
    for task in TASKS
}
assert set(TASK_SPECS) == set(TASKS)

PUBLIC_MODELS = {f"tucano-{task}": task for task in TASKS}
AUTO_MODEL = "tucano-auto"
