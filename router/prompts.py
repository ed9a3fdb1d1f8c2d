"""The chat of a request: its task's system prompt and user message (the task's registry entry
holds both, in PT-BR), after the team's examples shown as earlier turns.

The same functions render the prompts that serving sends to vLLM, that bootstrap trains the
tiny models on, and that training rounds regenerate completions for, so a model always sees
the exact wording it was trained with.
"""
from __future__ import annotations

import json

from pydantic import BaseModel

from rewards.parsing import split_think
from tasks import definition


def user_message(task: str, task_input: BaseModel) -> str:
    return definition(task).user_message(task_input)


def answer_text(task: str, answer, *, think_opened: bool = False) -> str:
    """An answer as the model writes it in a chat: a structured answer's text field (push's
    `copy`...) or its JSON; a thinking task's answer either after a template that has opened
    `<think>` already (`think_opened`: what a training example completes) or without its think
    block (a demonstration shown as an earlier turn)."""
    traits = definition(task).traits
    if traits.answer_field:
        return answer[traits.answer_field] if isinstance(answer, dict) else str(answer)
    if traits.thinks:
        text = str(answer)
        if not think_opened:
            return split_think(text).answer
        return text.removeprefix("<think>").lstrip("\n") if "</think>" in text else "</think>\n\n" + text
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)


def build_messages(task: str, task_input: BaseModel, demonstrations: tuple[tuple[BaseModel, str], ...] = ()) -> list[dict[str, str]]:
    """The chat of one request, its input the task's input model (`tasks.typed_input` reads a stored
    one back); `demonstrations` ((input, answer) pairs: the team's corrected or liked answers to
    similar inputs) come first as earlier turns of the same chat."""
    shown = [turn for example_input, answer in demonstrations
             for turn in ({"role": "user", "content": user_message(task, example_input)}, {"role": "assistant", "content": answer})]
    return [
        {"role": "system", "content": definition(task).system_prompt},
        *shown,
        {"role": "user", "content": user_message(task, task_input)},
    ]
