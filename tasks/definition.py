"""What a task is: one `TaskDefinition` holds every fact the service asks of a task, so that
adding a task is writing one entry (`tasks.registry.register`) and no other file.

An entry holds its traits and engine, its sampling, its input and output models, its prompt
(system prompt and user message), its reward (with and without a reference) and what makes an
answer valid, what a reference of it must be, its training defaults, its review view, its cheap
answers and the cues `tucano-auto` recognises it by. The code that serves, scores, trains and
reviews reads these fields and never compares a task's name.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from pydantic import BaseModel, ValidationError

from common.records import RewardContext, Sampling
from common.tasks import EngineKind, TaskTraits

# (completion, reference or None, context, per-field credits to fill) -> (components, weights, details, parsed output)
Scorer = Callable[[str, object, RewardContext, dict], tuple[dict[str, float], dict[str, float], dict[str, str], object]]
Validity = Callable[[dict[str, float], dict[str, str], object], bool]  # (components, details, output) -> well formed
ReferenceCheck = Callable[[object], object]  # a reference or correction -> its stored form, or raises InvalidReference
Makers = Callable[[list], dict[str, Callable[[BaseModel], str]]]  # the task's references -> cheap answers (of an input) by name
# (components, weights, per-field credits) of a score -> each output field's part of its total
FieldShares = Callable[[dict[str, float], dict[str, float], dict[str, float]], dict[str, float]]


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    traits: TaskTraits
    sampling: Sampling  # set explicitly on every request, never left to the model's generation_config
    group_temperature: float  # a request sampled n > 1 times without a temperature of its own: greedy samples would all agree
    input_model: type[BaseModel]  # what a request's `input` must be (contract §2)
    output_model: type[BaseModel] | None  # the JSON schema vLLM constrains output to; None: free text
    input_field: str  # where a free-text chat message goes in the task input
    system_prompt: str
    user_message: Callable[[BaseModel], str]  # the task input (its model) as the chat's user turn
    scorer: Scorer
    valid: Validity
    check_reference: ReferenceCheck
    makers: Makers
    cues: tuple[tuple[str, float], ...] = ()  # regexes over folded text and their points, for `tucano-auto`
    auto_default: bool = False  # what `tucano-auto` answers when no cue decides
    serve_samples: int = 1  # completions per request unless the settings say otherwise (`serve_samples`)
    serve_first_finished: int = 0  # answer from the first K samples to finish, 0 all (`serve_first_finished`)
    examples: bool = False  # its prompts carry the team's examples unless the settings say otherwise (`examples_tasks`)
    training: dict = field(default_factory=dict)  # its own training settings (`TaskTraining` fields) unless `task_training` is set
    review_view: Callable[[BaseModel], frozenset[str]] | None = None  # what an input says apart from its words (the review queue)
    # the served score's component that says a sample addresses its request at all (above 0), for GRPO's `relevant` advantage
    relevance: str | None = None
    field_shares: FieldShares | None = None  # a JSON answer's fields' parts of the total: GRPO's per-field credit (`trainer.field_credit`)

    @property
    def engine(self) -> EngineKind:
        return self.traits.engine

    @cached_property
    def json_schema(self) -> dict | None:
        """The JSON schema vLLM constrains the output to, or None for a free-text task. Built once:
        pydantic takes about half a millisecond to build it, and every structured request sends it."""
        return self.output_model.model_json_schema() if self.output_model else None

    @property
    def public_model(self) -> str:
        """Its name in the OpenAI-compatible API (`/v1/models`)."""
        return f"tucano-{self.name}"

    def sampling_for(self, n: int, overrides: dict) -> Sampling:
        """The request's sampling: the task's defaults, then `overrides` (the request's own options);
        a group (n > 1) of a greedy task samples at `group_temperature` unless the request set one."""
        sampling = self.sampling.override(**overrides, n=n)
        if n > 1 and overrides.get("temperature") is None and sampling.temperature == 0.0:
            sampling = sampling.override(temperature=self.group_temperature)
        return sampling

    def parse_input(self, value) -> BaseModel:
        """`value` as the task's input model: what the request path carries from the edge on
        (pydantic's ValidationError names each problem)."""
        return self.input_model.model_validate(value)

    def input_from_text(self, text: str) -> BaseModel:
        """A chat message as the task's input: its input's fields as JSON where the task's trait
        says so and they make a valid input, else the text as its free-text field (ValidationError
        where that is not valid either: an empty or too long message)."""
        if self.traits.chat_input_json:
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict) and value:
                try:
                    return self.parse_input({str(k): v for k, v in value.items()})
                except ValidationError:
                    pass  # JSON, but not this task's fields: the text itself is the input
        return self.parse_input({self.input_field: text})

    def normalise_reference(self, reference):
        """contract §3: a task with an answer field accepts `{field: ...}` or a plain string; a task
        never scored with a reference takes none."""
        answer_field = self.traits.answer_field
        if answer_field and isinstance(reference, str):
            return {answer_field: reference} if reference.strip() else None
        if not self.traits.scored_with_reference:
            return None
        if answer_field and isinstance(reference, dict) and not isinstance(reference.get(answer_field), str):
            return None
        return reference if isinstance(reference, dict) and reference else None
