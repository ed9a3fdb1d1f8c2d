"""The task registry: every task's `TaskDefinition`, by name, and what the rest of the service
reads through it.

`register` adds an entry (the four built-in tasks register when `tasks` is imported; a test
registers a toy fifth). `definition(name)` is the entry or an `UnknownTask` that names the
tasks there are. `TASKS`, `TRAITS`, `TASK_ENGINE`, `INPUT_MODELS` and `OUTPUT_MODELS` are live
read-only views of the entries, never copies, so that a task registered later is in all of them.

The settings that name tasks (`serve_samples`, `serve_first_finished`, `examples_tasks`,
`task_training`) are unset by default, and then each entry's own default holds: the resolvers
here (`samples_of`, `first_finished_of`, `examples_tasks`, `training_settings`) are the one
place that combines the two, and `check_settings` refuses a setting that names no task.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from pydantic import BaseModel

from common.records import RewardContext, Sampling
from common.settings import ENV_PREFIX, ConfigError, Settings, TaskTraining
from rewards.references import InvalidReference
from rewards.scoring import Score, total_of
from tasks.definition import TaskDefinition

_ENTRIES: dict[str, TaskDefinition] = {}
V = TypeVar("V")
AUTO_MODEL = "tucano-auto"
TASK_NAME = re.compile(r"[a-z]+")


class UnknownTask(KeyError):
    """A task name no entry has; the message names the tasks there are."""

    def __init__(self, name: object):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown task {self.name!r}; tasks are {', '.join(_ENTRIES)}"


def register(entry: TaskDefinition) -> TaskDefinition:
    if entry.name in _ENTRIES:
        raise ValueError(f"a task named {entry.name!r} is registered already")
    if not TASK_NAME.fullmatch(entry.name) or entry.name == "auto":
        raise ValueError(f"{entry.name!r} is not a task name (lowercase letters only, as its versions' names `<task>-v<n>` "
                         "and its public model `tucano-<task>` need; not 'auto')")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Drop an entry (a test's toy task, once the test is done)."""
    _ENTRIES.pop(name, None)


def definition(name: str) -> TaskDefinition:
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        raise UnknownTask(name) from None


def typed_input(task: str, stored: Mapping) -> BaseModel:
    """A task input as records, labels and datasets store it (`stored_input`'s fields), back as the
    task's input model, which prompts, rewards and the review queue take; pydantic's ValidationError
    names what a stored one lacks."""
    return definition(task).parse_input(stored)


class _Names(Sequence[str]):
    """The registered task names, in registration order, as of now."""

    def __getitem__(self, index):
        return tuple(_ENTRIES)[index]

    def __len__(self) -> int:
        return len(_ENTRIES)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_ENTRIES))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in _ENTRIES

    def __repr__(self) -> str:
        return repr(tuple(_ENTRIES))


class _View(Mapping[str, V]):
    """One field of every entry, by task name, as of now."""

    def __init__(self, read: Callable[[TaskDefinition], V], only: Callable[[TaskDefinition], bool] = lambda _: True):
        self._read, self._only = read, only

    def __getitem__(self, name: str) -> V:
        entry = _ENTRIES.get(name) if isinstance(name, str) else None
        if entry is None or not self._only(entry):
            raise KeyError(name)
        return self._read(entry)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, entry in _ENTRIES.items() if self._only(entry)])

    def __len__(self) -> int:
        return sum(1 for entry in _ENTRIES.values() if self._only(entry))


TASKS = _Names()
TRAITS = _View(lambda entry: entry.traits)
TASK_ENGINE = _View(lambda entry: entry.engine)
INPUT_MODELS = _View(lambda entry: entry.input_model)
OUTPUT_MODELS = _View(lambda entry: entry.output_model, only=lambda entry: entry.output_model is not None)


def public_models() -> dict[str, str]:
    """Each task's public model name (`tucano-<task>`) -> the task."""
    return {entry.public_model: name for name, entry in _ENTRIES.items()}


def score(task: str, completion: str, reference=None, context: RewardContext | None = None) -> Score:
    """Any completion of any task: its entry's components, weights and reasons, the total their
    weighted mean (`rewards.scoring.total_of`). `context`: the task input and the query limits
    (`Settings.reward_context`); None, an empty input."""
    entry = definition(task)
    completion = completion if isinstance(completion, str) else ""
    if context is None:
        context = RewardContext()
    elif not isinstance(context, RewardContext):
        raise TypeError(f"context: a RewardContext (Settings.reward_context builds one), not {type(context).__name__}")
    reference = entry.normalise_reference(reference)
    fields: dict[str, float] = {}
    components, weights, details, output = entry.scorer(completion, reference, context, fields)
    components, total = total_of(components, weights)
    return Score(total, components, reference is not None, entry.valid(components, details, output), details, output, weights, fields)


def check_reference(task: str, value, max_bytes: int | None = None):
    """A reference or a correction in its stored form, or `InvalidReference` naming the problem:
    the task's output shape, exactly (a correction becomes training data)."""
    if max_bytes is not None and len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")) > max_bytes:
        raise InvalidReference(f"larger than {max_bytes} bytes")
    if task not in _ENTRIES:
        raise InvalidReference(f"unknown task {task!r}")
    return _ENTRIES[task].check_reference(value)


def samples_of(settings: Settings, task: str, temperature: float | None = None) -> int:
    """Completions a request of `task` is sampled with unless it asks otherwise: `serve_samples`
    where set (a task it does not name gets 1), else the entry's own; one for a request that asks
    for greedy decoding (`temperature` 0), whose samples would all be the same answer."""
    if temperature == 0.0:
        return 1
    if settings.serve_samples is None:
        return definition(task).serve_samples
    return settings.serve_samples.get(task, 1)


def first_finished_of(settings: Settings, task: str) -> int:
    """How many finished samples a sampled request of `task` waits for before it is answered and
    the rest are cut (0: all): `serve_first_finished` where set (a task it does not name gets 0),
    else the entry's own."""
    if settings.serve_first_finished is None:
        return definition(task).serve_first_finished
    return settings.serve_first_finished.get(task, 0)


def served_sampling(settings: Settings, task: str) -> Sampling:
    """How a request of `task` that sets no option of its own is sampled: its samples
    (`samples_of`), at its group temperature where it has more than one, answered from its first
    finished (`first_finished_of`). What the gate and the benches answer with, so that a version
    is judged as it is served."""
    return definition(task).sampling_for(samples_of(settings, task), {"first_finished": first_finished_of(settings, task)})


def examples_tasks(settings: Settings) -> list[str]:
    """The tasks whose prompts carry the team's examples: `examples_tasks` where set, else each
    entry's own."""
    if settings.examples_tasks is not None:
        return list(settings.examples_tasks)
    return [name for name, entry in _ENTRIES.items() if entry.examples]


def training_settings(settings: Settings, task: str) -> Settings:
    """The settings as `task` trains with them: its own training values (`task_training` where
    set, else its entry's) in place of the general ones. The copy names no task's own values, so
    applying it again changes nothing and a caller may change its general values further."""
    own = definition(task).training if settings.task_training is None else settings.task_training.get(task)
    changes = TaskTraining.model_validate(own).model_dump(exclude_none=True) if own else {}
    return settings.model_copy(update={**changes, "task_training": {}})


def check_settings(settings: Settings) -> Settings:
    """Refuse settings that name a task no entry has, or whose tasks' own completions per request
    exceed the cap (`ConfigError` naming the setting, the task and the tasks there are)."""
    named = {"serve_samples": settings.serve_samples or {}, "serve_first_finished": settings.serve_first_finished or {},
             "examples_tasks": settings.examples_tasks or [],
             "task_training": settings.task_training or {}}
    for setting, value in named.items():
        unknown = sorted(set(value) - set(_ENTRIES))
        if unknown:
            raise ConfigError(f"invalid setting {ENV_PREFIX}{setting.upper()}: no task named {', '.join(map(repr, unknown))} "
                              f"(the tasks: {', '.join(_ENTRIES)})")
    samples = {task: samples_of(settings, task) for task in _ENTRIES}
    over = {task: n for task, n in samples.items() if n > settings.serve_samples_cap}
    if over:
        raise ConfigError(f"invalid setting {ENV_PREFIX}SERVE_SAMPLES_CAP: {settings.serve_samples_cap} is below the "
                          f"completions per request of {over} (serve_samples)")
    return settings


def model_path_of(settings: Settings, task: str) -> str:
    """The model a task is served by and trained on: its engine's."""
    return settings.model_path_for(definition(task).engine)
