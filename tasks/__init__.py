"""Tasks: each task the service answers is one registry entry, and everything else reads it.

`definition` holds what a task is (`TaskDefinition`: traits, engine, sampling, input and output
models, prompt, reward, reference check, training defaults, review view, cheap answers, the cues
`tucano-auto` knows it by); `registry` keeps the entries by name and is what the rest of the
service asks (`registry.definition`, `registry.score`, `registry.check_reference`, the
settings resolvers and the live views `TASKS`, `TRAITS`...). The four built-in tasks have a module each (`extraction`,
`sql`, `push`, `insights`) and register when this package is imported.

Above `rewards` (an entry holds its reward) and below the request path, the trainer and the
gateway, which import it.
"""
from common.datasets import stored_input
from tasks.definition import TaskDefinition
from tasks.extraction import EXTRACTION
from tasks.insights import INSIGHTS
from tasks.push import PUSH
from tasks.registry import (
    AUTO_MODEL,
    INPUT_MODELS,
    OUTPUT_MODELS,
    TASK_ENGINE,
    TASKS,
    TRAITS,
    UnknownTask,
    check_reference,
    check_settings,
    definition,
    examples_tasks,
    first_finished_of,
    model_path_of,
    public_models,
    register,
    samples_of,
    score,
    served_sampling,
    training_settings,
    typed_input,
    unregister,
)
from tasks.sql import SQL

for _entry in (EXTRACTION, SQL, PUSH, INSIGHTS):
    register(_entry)

__all__ = [
    "AUTO_MODEL", "INPUT_MODELS", "OUTPUT_MODELS", "TASKS", "TASK_ENGINE", "TRAITS", "TaskDefinition", "UnknownTask",
    "check_reference", "check_settings", "definition", "examples_tasks", "first_finished_of", "model_path_of", "public_models", "register",
    "samples_of", "score", "served_sampling", "stored_input", "training_settings", "typed_input", "unregister",
]
