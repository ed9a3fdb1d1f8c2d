"""A round's data for one task, from every signal a team gave (contract §8):

- the labelled set, all of it, every round (labels are never consumed): a reference or a
  correction becomes a supervised example (SFT) and a DPO chosen answer against what was served
  when that scored lower; a rating becomes a KTO example (served answer desirable or not), and
  an input with both a liked and a disliked answer becomes a DPO pair too; where the task has
  supervised examples, a liked answer of an input nobody corrected joins them (SFT is then the
  round's method, and the user's approval would otherwise go unused);
- the records new since the last round: their distinct unlabelled inputs become GRPO prompts
  scored by the reference-free rewards, besides the labelled inputs scored with their references;
- the served groups among them (every completion a request sampled, `Record.group`): GRPO's
  rollouts, as the engine sampled them, on the prompt exactly as it was served (`RolloutGroup`).
  A group of a request that carried a reference, or whose answer was later corrected, is scored
  with that label. Only a version of the lineage the round trains (the version it continues and
  the versions before it) sampled a usable group; a group of another version, of an eval-set
  input, or one that is not whole (fewer samples than asked, a sample without its tokens and
  logprobs, or samples cut before they finished: `Sampling.first_finished`, whose finished
  ones are the shortest and would teach the policy that length), all identical or all invalid
  (no signal) is skipped and counted. Its input still becomes a prompt for engine rollouts.

With `train_with_examples` (off by default), every prompt is the one serving would send for its
input: where the task's prompts carry the team's examples, it shows the examples most similar to
the input, never the input's own. It was built because versions trained on bare prompts did
worse with the examples than alone; side by side, versions trained with them did worse as served
still (`tucano bench fix`, docs/results.md): on two cores the longer prompts cost steps.

Inputs of any eval set (the team's share of its labels, fixed by input hash; the bootstrap eval
split; loaded eval files) never reach a training example. A slice of the supervised examples is
kept apart as the validation set that stops SFT early. Every example names the label or record
it came from, so a round can say exactly what it trained on.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from common.datasets import input_key
from common.records import BASE_VERSION, Label, Record, RewardContext
from common.rounds import DataSources, TrainingData
from common.settings import Settings
from router.examples import ExampleBook
from router.prompts import answer_text, build_messages
from tasks import TRAITS, examples_tasks, score, typed_input

PAIR_MARGIN = 0.1  # a served answer at least this much below the reference makes a pair
VALIDATION_SHARE = 0.15
MIN_VALIDATION = 4
INVALID_INPUT = "stored input not valid for the task"  # a skip reason: stored under an older input model


@dataclass(frozen=True, slots=True)
class SftExample:
    """A supervised example: the rendered prompt and the answer to learn (a correction, a
    reference, or a liked answer nobody corrected)."""
    prompt: str
    completion: str
    source: str  # the label's record id
    liked: bool = False  # a liked answer rather than the team's own

    def row(self) -> dict:
        return {"prompt": self.prompt, "completion": self.completion}


@dataclass(frozen=True, slots=True)
class PreferencePair:
    """A DPO pair: the better answer to a prompt and the worse one that was served."""
    prompt: str
    chosen: str
    rejected: str
    source: str

    def row(self) -> dict:
        return {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}


@dataclass(frozen=True, slots=True)
class RatedAnswer:
    """A KTO example: a served answer and whether the team liked it."""
    prompt: str
    completion: str
    label: bool
    source: str

    def row(self) -> dict:
        return {"prompt": self.prompt, "completion": self.completion, "label": self.label}


@dataclass(frozen=True, slots=True)
class GrpoPrompt:
    """A prompt GRPO samples groups for (where no served group does): what scores its completions
    travels with it as TRL's dataset columns."""
    prompt: str
    task: str
    source: str
    reference: str = ""  # the label's answer as JSON, or ""
    context: str = ""  # the reward context as JSON (`RewardContext.to_json`)

    def row(self) -> dict:
        return {"prompt": self.prompt, "task": self.task, "reference": self.reference, "context": self.context}


@dataclass
class RolloutGroup:
    """One served group as GRPO's rollout: the prompt's tokens as vLLM saw them, each sample's
    tokens and their logprobs under the sampling distribution, and what scores it."""
    key: str  # unique in the round: TRL's prompt column, which the rollout function reads the group back by
    source: str  # the record id
    version: str  # the version that sampled it
    temperature: float  # what it was sampled at: the trainer's logprobs must be taken at the same
    prompt_token_ids: list[int]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    reference: str  # the label's answer as JSON, or ""
    context: str  # the reward context as JSON (`RewardContext.to_json`)

    @property
    def size(self) -> int:
        return len(self.completion_ids)


@dataclass
class TaskData:
    task: str
    sft: list[SftExample] = field(default_factory=list)
    validation: list[SftExample] = field(default_factory=list)  # held apart for early stopping
    pairs: list[PreferencePair] = field(default_factory=list)
    kto: list[RatedAnswer] = field(default_factory=list)
    prompts: list[GrpoPrompt] = field(default_factory=list)
    groups: list[RolloutGroup] = field(default_factory=list)  # GRPO: served groups, newest first
    policy: str = BASE_VERSION  # the version the round's LoRA starts as (`lineage`'s first): its groups are on-policy
    earlier_groups: int = 0  # of `groups`, those the policy served before this round's records (`kept_groups`)
    entry_ids: list[str] = field(default_factory=list)  # records read this round (acknowledged with it)
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> TrainingData:
        """Examples per kind, what was skipped, and which labels and records each method's examples came from."""
        def sources(examples: list) -> list[str]:
            return sorted({e.source for e in examples})
        return TrainingData(sft=len(self.sft), liked_sft=sum(1 for e in self.sft if e.liked), validation=len(self.validation),
                            pairs=len(self.pairs), kto=len(self.kto), prompts=len(self.prompts),
                            labelled_prompts=sum(1 for p in self.prompts if p.reference), records=len(self.entry_ids),
                            groups=len(self.groups), labelled_groups=sum(1 for g in self.groups if g.reference),
                            earlier_groups=self.earlier_groups,
                            skipped=dict(self.skipped),
                            sources=DataSources(sft=sources(self.sft), pairs=sources(self.pairs), kto=sources(self.kto),
                                                prompts=sources(self.prompts), groups=sorted({g.source for g in self.groups})))


def _latest_by_input(labels: list[Label]) -> dict[str, list[Label]]:
    by_input: dict[str, list[Label]] = {}
    for label in labels:  # oldest first: the newest answer of an input wins
        by_input.setdefault(label.input_hash, []).append(label)
    return by_input


Demonstrations = Callable[[BaseModel], tuple[tuple[BaseModel, str], ...]]  # an input's (input, answer) examples, for build_messages


def no_demonstrations(_task_input: BaseModel) -> tuple:
    return ()


def _typed(task: str, stored: dict) -> BaseModel | None:
    """A stored input as the task's model, or None where it is not one (a record or label stored under an
    older input model, which the caller skips and counts)."""
    try:
        return typed_input(task, stored)
    except ValidationError:
        return None


def served_demonstrations(settings: Settings, task: str, labels: list[Label]) -> Demonstrations:
    """What serving shows an input's prompt, from the same labels: its most similar examples where
    the task's prompts carry them, else nothing."""
    if not (settings.train_with_examples and task in examples_tasks(settings)):
        return no_demonstrations
    book = ExampleBook(task, labels)
    return lambda task_input: book.shown(task_input, settings.examples_k)


def build(task: str, labels: list[Label], new_records: list[tuple[str, Record | None]], render: Callable[[list[dict]], str],
          reward_context: Callable[[BaseModel], RewardContext], held_out: frozenset[str], seed: int, unlabelled_limit: int,
          liked_as_supervised: bool, shown: Demonstrations = no_demonstrations, lineage: tuple[str, ...] = (BASE_VERSION,),
          groups_limit: int = 0, earlier: list[Record] | None = None) -> TaskData:
    """`held_out`: input keys of every eval set; `new_records`: (entry id, record) of this task;
    `shown`: the demonstrations each input's prompt carries (`served_demonstrations`); `lineage`:
    the versions whose served groups the round may train on (`lineage`), at most `groups_limit`;
    `earlier`: records of earlier rounds whose groups the policy itself served (`kept_groups`),
    newest first, used after this round's own."""
    data = TaskData(task, policy=lineage[0])
    liked_answers: list[SftExample] = []
    labelled_inputs: set[str] = set()
    for same_input in _latest_by_input(labels).values():
        newest = same_input[-1]
        key = input_key(newest.input)
        labelled_inputs.add(key)
        if newest.split == "eval" or key in held_out:
            data.skipped["eval-set input"] += len(same_input)
            continue
        task_input = _typed(task, newest.input)
        if task_input is None:
            data.skipped[INVALID_INPUT] += len(same_input)
            continue
        prompt = render(build_messages(task, task_input, shown(task_input)))
        context = reward_context(task_input)
        with_answer = [label for label in same_input if label.answer is not None]
        if with_answer:
            best = with_answer[-1]
            target = answer_text(task, best.answer, think_opened=True)
            data.sft.append(SftExample(prompt, target, best.id))
            for label in same_input:  # what was served, when it scores below the answer, is the rejected side
                served = score(task, label.served, best.answer, context).total
                if label.served.strip() and label.served != target and served <= 1.0 - PAIR_MARGIN:
                    data.pairs.append(PreferencePair(prompt, target, label.served, label.id))
        rated = [label for label in same_input if label.rating in (-1, 1)]
        for label in rated:
            data.kto.append(RatedAnswer(prompt, label.served, label.rating == 1, label.id))
        liked = [label for label in rated if label.rating == 1]
        disliked = [label for label in rated if label.rating == -1]
        if liked and disliked and not with_answer:
            data.pairs.append(PreferencePair(prompt, liked[-1].served, disliked[-1].served, disliked[-1].id))
        if liked and not with_answer and liked[-1].served.strip():
            liked_answers.append(SftExample(prompt, liked[-1].served, liked[-1].id, liked=True))
        reference = with_answer[-1].answer if with_answer and TRAITS[task].scored_with_reference else None
        data.prompts.append(GrpoPrompt(prompt, task, newest.id, json.dumps(reference, ensure_ascii=False) if reference is not None else "",
                                        context.to_json()))
    _add_unlabelled(data, new_records, render, reward_context, held_out | labelled_inputs, unlabelled_limit, shown)
    labels_by_id = {label.id: label for label in labels}
    _add_groups(data, new_records, labels_by_id, reward_context, held_out, lineage, groups_limit)
    fresh = len(data.groups)
    _add_groups(data, [("", record) for record in reversed(earlier or [])], labels_by_id, reward_context, held_out, (data.policy,),
                groups_limit, "earlier ")
    data.earlier_groups = len(data.groups) - fresh
    split_validation(data, seed)
    if data.sft and liked_as_supervised:  # the validation slice stays the team's own answers
        data.sft += liked_answers
    return data


def _add_unlabelled(data: TaskData, new_records, render, reward_context, excluded: set[str], limit: int,
                    shown: Demonstrations) -> None:
    """The newest distinct unlabelled inputs of the records read this round (a recency window)."""
    seen: set[str] = set()
    for entry_id, record in reversed(new_records):
        data.entry_ids.append(entry_id)
        if record is None:
            data.skipped["unreadable record"] += 1
            continue
        key = input_key(record.input)
        if key in excluded or key in seen:
            data.skipped["eval-set or labelled input" if key in excluded else "repeated input"] += 1
            continue
        if len(seen) >= limit:
            data.skipped["beyond the recency window"] += 1
            continue
        seen.add(key)
        task_input = _typed(data.task, record.input)
        if task_input is None:
            data.skipped[INVALID_INPUT] += 1
            continue
        data.prompts.append(GrpoPrompt(render(build_messages(data.task, task_input, shown(task_input))), data.task, record.id,
                                       context=reward_context(task_input).to_json()))
    data.entry_ids.reverse()


def lineage(active, adapters: dict) -> tuple[str, ...]:
    """The versions whose served groups a round continuing `active` (an AdapterMeta, or None for
    the base model) may train on, newest first: it and its parents back to the base model, which
    sampled the lineage's first groups. A version outside it (a rejected canary, another line) is
    a different policy that no importance ratio on a few tokens would make this one's."""
    versions, meta = [], active
    while meta is not None and meta.version not in versions:
        versions.append(meta.version)
        meta = adapters.get(meta.parent) if meta.parent else None
    return (*versions, BASE_VERSION)


def _whole(record: Record) -> bool:
    group = record.group
    return (len(group.samples) == record.sampling.n >= 2 and bool(group.prompt_token_ids)
            and all(s.token_ids and len(s.token_ids) == len(s.logprobs) for s in group.samples))


def _add_groups(data: TaskData, new_records, labels_by_id: dict[str, Label], reward_context, held_out: frozenset[str],
                versions: tuple[str, ...], limit: int, counted_as: str = "") -> None:
    """The newest served groups of `new_records` (oldest first) that carry a signal; a skipped one
    is counted under its reason, prefixed with `counted_as`."""
    for _entry_id, record in reversed(new_records):
        if record is None or record.group is None:
            continue
        reason, task_input = None, _typed(data.task, record.input)
        if task_input is None:
            reason = INVALID_INPUT
        elif record.group.cut:
            reason = "group cut before every sample finished"
        elif not _whole(record):
            reason = "group not whole"
        elif input_key(record.input) in held_out:
            reason = "group of an eval-set input"
        elif record.version not in versions:
            reason = "group of a version outside the lineage"
        elif len({s.text for s in record.group.samples}) == 1:
            reason = "group of identical completions"
        elif not any(s.valid for s in record.group.samples):
            reason = "group of invalid completions only"
        elif len(data.groups) >= limit:
            reason = "group beyond the round's limit"
        if reason:
            data.skipped[counted_as + reason] += 1
            continue
        label = labels_by_id.get(record.id)
        answer = label.answer if label is not None and label.split == "train" else None
        reference = json.dumps(answer, ensure_ascii=False) if answer is not None and TRAITS[data.task].scored_with_reference else ""
        data.groups.append(RolloutGroup(
            key=f"group:{record.id}", source=record.id, version=record.version, temperature=record.sampling.temperature,
            prompt_token_ids=list(record.group.prompt_token_ids),
            completion_ids=[list(s.token_ids) for s in record.group.samples], logprobs=[list(s.logprobs) for s in record.group.samples],
            reference=reference, context=reward_context(task_input).to_json()))


def split_validation(data: TaskData, seed: int) -> None:
    """The validation slice is chosen by a seeded hash of each example's content, not by its record
    id (random): the same labels give the same split in every run, so what a round learns does not
    hang on which ids the records happened to get."""
    if len(data.sft) < 2 * MIN_VALIDATION:
        return
    ordered = sorted(data.sft, key=lambda e: hashlib.sha256(f"{seed}\0{e.prompt}\0{e.completion}".encode()).hexdigest())
    n = max(MIN_VALIDATION, round(VALIDATION_SHARE * len(ordered)))
    data.validation, data.sft = ordered[:n], ordered[n:]
