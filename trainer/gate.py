"""The promotion gate (contract §8): candidate and incumbent answer the same eval rows with the
same seeds, through the same vLLM engines, prompts and sampling as live traffic, scored by the
same `rewards/`; the decision reads the per-row paired differences.

- The rows: the team's eval set (the share of its labelled inputs held out by hash), the rows a
  team loaded (`tucano eval-set add`), and the demo's bootstrap eval split, de-duplicated by
  input; beyond `gate_max_rows`, a sample drawn anew each round (never the same fixed head), and
  in an order drawn anew each round, so that every look sees a random part of them.
- Promote only when the 95% interval of the mean paired difference (percentile bootstrap over
  rows) lies above `promote_margin`, and no component (each extraction field on its own) is
  significantly worse: its whole interval below `-component_tolerance`. Fewer than
  `gate_min_rows` rows decide nothing: the candidate is rejected.
- Sequential: the sampled rows are scored in blocks of `gate_look_rows`, and the gate stops
  after a block once the outcome is plain. An early win needs the 99.73% interval (z = 3, the
  Haybittle-Peto boundary, so the last look keeps its 95% almost whole) above the margin, every
  95% check passed, and no component's mean difference below `-component_tolerance`. An early
  loss is a mean difference at or below the margin; it never adds a false promotion (it only
  rejects) and it costs the power of a candidate that would have just cleared at the end. On two
  cores the candidate's answers are most of a round's time after its training.

Both versions answer as they would be served: each row's prompt shows the team's examples most
similar to it (router/examples.py; the team's eval labels are never among them), so the baseline
a candidate must beat is the incumbent together with the corrections that already act at once.
They are sampled as a request is (`served_sampling`): a task served as the best of n samples
(push) answers each row with n, and the pick by the served score is what the reference scores.
Judged on one sample at push's temperature instead, a row's paired difference carries the noise
of two single samples, and a candidate is judged on an answer no user gets.

Each version is judged as it is served. Where a task shows examples, a version's prompts show
them or not by what its own gate found (`AdapterMeta.shows_examples`): the incumbent answers as
it is served now, and the candidate is judged twice against those same answers, with the examples
and without them (`serve_alone`). It is promoted in the way that wins by more, and served so.
Served alone, it must also win against the incumbent alone, so that the gain is its weights' and
not only the bare prompts': the incumbent's own weights under a new name are never promoted.
A version trained on the team's labels often does worse with the examples than without: it
learned them on bare prompts, and the examples are earlier turns of the chat (run 30:
extraction's versions scored 0.14 to 0.22 lower with them, and as served fell below the base
model). Served alone, it still answers an exact repeat of a corrected input with its correction.

A candidate that is the incumbent's own weights under a new name answers every row as the
incumbent does up to the engine's batch numerics (a tiny model sampled at a temperature once
differed by -0.0012 over 32 rows: tests/integration/test_continued_candidates.py), so its interval is
about [0, 0], below the margin, and it is never promoted.

Every row is answered with a seed of its own that does not change between rounds, and what an
unchanging model (the base model, an immutable version) answered is kept in Redis for a week
(`Store.cached_answers`): the incumbent, which answered the same rows in the rounds before, is
mostly read back, and only the candidate is asked. On two CPU cores that halves a gate.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
from pydantic import BaseModel

from common.datasets import input_key, load_split
from common.records import Sampling
from common.rounds import ComponentDifference, GateDecision, LabelledCheck
from common.settings import Settings
from common.stats import mean_interval
from rewards import Score
from rewards.scoring import first_best
from router.engine_client import EnginePool, EngineUnavailable
from router.examples import ExampleBook
from router.prompts import build_messages
from tasks import TRAITS, definition, examples_tasks, model_path_of, score, served_sampling, typed_input

CONCURRENCY = 32  # requests in flight per version; vLLM batches them (a CPU engine: 149 tokens/s at 32, 122 at 16)
EARLY_WIN_LEVEL = 0.9973  # z = 3 (Haybittle-Peto)
SOURCES = ("team", "file", "bootstrap")


@dataclass(frozen=True)
class EvalRow:
    id: str
    source: str  # team, file or bootstrap
    input: BaseModel  # the task's input model
    reference: object

    @classmethod
    def of(cls, task: str, row: dict, source: str) -> EvalRow:
        """A dataset or eval-file row (`{"id", "input", "reference"}`), its input read as the task's model."""
        return cls(row["id"], source, typed_input(task, row["input"]), row.get("reference"))


def bootstrap_rows(settings: Settings, task: str) -> list[EvalRow]:
    path = settings.datasets_dir / task / "eval.jsonl"
    if not path.is_file():
        return []
    return [EvalRow.of(task, row, "bootstrap") for row in load_split(settings.datasets_dir, task, "eval")]


def eval_rows(settings: Settings, store, task: str) -> list[EvalRow]:
    """Every eval row of a task, the team's first, one per input."""
    team = [EvalRow(label.id, "team", typed_input(task, label.input), label.answer) for label in store.labels(task)
            if label.split == "eval" and (label.answer is not None or not TRAITS[task].scored_with_reference)]
    loaded = [EvalRow.of(task, row, "file") for row in store.eval_set(task)]
    unique: dict[str, EvalRow] = {}
    for row in team + loaded + bootstrap_rows(settings, task):
        unique.setdefault(input_key(row.input), row)
    return list(unique.values())


def held_out_inputs(settings: Settings, store, task: str) -> frozenset[str]:
    """Input keys no round may train on: the loaded eval rows and the bootstrap eval split (the
    team's own eval labels are marked by their split)."""
    return frozenset(input_key(row.input) for row in bootstrap_rows(settings, task) + [
        EvalRow.of(task, r, "file") for r in store.eval_set(task)])


def sample_rows(rows: list[EvalRow], most: int, seed: int) -> list[EvalRow]:
    """At most `most` of the rows in a random order: a look that stops the gate early must not
    have seen only the team's rows, which come first."""
    return random.Random(seed).sample(rows, min(most, len(rows)))


def row_seed(seed: int, row_id: str) -> int:
    """The sampling seed of one row: the same for every version it compares, in every round (so an
    unchanging incumbent's answer to it can be kept, `cached_answers`)."""
    return int(hashlib.sha256(f"{seed}:{row_id}".encode()).hexdigest()[:8], 16)


def model_scope(model_path: str, version: str | None, numerics: str) -> str:
    """Names one unchanging model: an adapter version (never re-used or overwritten) over its base
    model, or the base model itself as its files are now (a checkpoint rebuilt at the same path is
    another model), computed as its engines compute (`Store.engine_numerics`: the same weights in
    bf16 and in fp32 answer differently)."""
    config = Path(model_path) / "config.json"
    stamp = config.stat().st_mtime_ns if config.is_file() else 0
    return f"{version or 'base'}@{hashlib.sha256(f'{model_path}:{stamp}:{numerics}'.encode()).hexdigest()[:12]}"


def request_key(prompt: str, sampling: Sampling, json_schema: dict | None) -> str:
    """One request as the engine receives it: the same key is the same request."""
    sent = [prompt, msgspec.to_builtins(sampling), json_schema]
    return hashlib.sha256(json.dumps(sent, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


def demonstrations(settings: Settings, store, task: str, inputs: dict[str, BaseModel]) -> dict[str, tuple]:
    """What serving would show each input's prompt (the team's most similar examples), by the id
    `inputs` gives it: the gate and shadow replay answer as a version is served, with its examples."""
    if store is None or task not in examples_tasks(settings):
        return {}
    book = ExampleBook(task, store.labels(task))
    return {key: book.shown(task_input, settings.examples_k) for key, task_input in inputs.items()}


async def answer(pool: EnginePool, settings: Settings, task: str, version: str | None, rows: list[EvalRow], seed: int,
                 store=None, reference_free: list | None = None, shown: dict[str, tuple] | None = None,
                 free_sources: frozenset[str] = frozenset({"team"}), groups: list | None = None) -> list[Score]:
    """Each row answered by `version` (None: the base model) with the task's serving prompt,
    sampling and schema and the row's seed, scored against the row's reference. A task served as
    the best of n samples (`served_sampling`) is answered so: one group per row, and its pick by
    the served score (`served_answer`) is the answer scored. With a store, an
    answer this model already gave to the same request is read back instead of asked again: the
    incumbent of a gate answers the same rows round after round, and a version never changes.
    `reference_free`, when given, receives each answer's reference-free score where the row is the
    team's (of `free_sources`) and has a reference (None elsewhere): what `labelled_check` compares. `shown`: each
    row's demonstrations (`demonstrations`), as serving would show them. `groups`, when given,
    receives each row's samples (every text of its group, the pick among them; the one answer of
    n = 1 or of an answer read back from the store): what the served score ranks, and what a
    round's GRPO would train on."""
    spec, shown = definition(task), shown or {}
    prompts = [pool.template.render(build_messages(task, row.input, shown.get(row.id, ()))) for row in rows]
    sampling = served_sampling(settings, task)
    samplings = [sampling.override(seed=row_seed(seed, row.id)) for row in rows]
    keys = [request_key(prompt, sampling, spec.json_schema) for prompt, sampling in zip(prompts, samplings)]
    if store is not None:
        scope = model_scope(model_path_of(settings, task), version, store.engine_numerics(pool.kind))
        texts = store.cached_answers(scope, keys)
    else:
        texts = [None] * len(rows)
    missing = [i for i, text in enumerate(texts) if text is None]
    if missing and not await pool.check():
        raise EngineUnavailable(f"no healthy {pool.kind} engine to evaluate on")
    gate = asyncio.Semaphore(CONCURRENCY)

    async def ask(i: int) -> None:
        async with gate:
            texts[i], sampled[i] = await served_group(pool, task, version, prompts[i], samplings[i], settings.reward_context(rows[i].input))

    sampled: list[list[str] | None] = [None] * len(rows)
    await asyncio.gather(*(ask(i) for i in missing))
    if groups is not None:
        groups += [group if group is not None else [text] for group, text in zip(sampled, texts)]
    if store is not None:
        store.cache_answers(scope, {keys[i]: texts[i] for i in missing})
    if reference_free is not None:
        reference_free += [score(task, text, None, settings.reward_context(row.input)) if row.source in free_sources and row.reference
                           is not None else None for text, row in zip(texts, rows)]
    return [score(task, text, row.reference, settings.reward_context(row.input)) for text, row in zip(texts, rows)]


async def served_answer(pool: EnginePool, task: str, version: str | None, prompt: str, sampling: Sampling, context) -> str:
    """The text a request sampled with `sampling` is answered with: its one sample, or of a group
    (n > 1) the best by the served score without a reference (traffic carries none), the first of
    equals, as the gateway picks it."""
    return (await served_group(pool, task, version, prompt, sampling, context))[0]


async def served_group(pool: EnginePool, task: str, version: str | None, prompt: str, sampling: Sampling,
                       context) -> tuple[str, list[str]]:
    """`served_answer`'s text, and every sample it was picked from."""
    schema = definition(task).json_schema
    if sampling.n == 1:
        text = (await pool.complete(prompt, version, sampling, schema)).text
        return text, [text]
    texts = [c.text for c in await pool.complete_group(prompt, version, sampling, schema)]
    return texts[first_best([score(task, text, None, context).total for text in texts])], texts


def parts(s: Score) -> dict[str, float]:
    """What is compared one by one: every component, and each extraction field on its own."""
    return {**s.components, **{f"field:{name}": value for name, value in s.fields.items()}}


def labelled_check(free_candidate: list, free_incumbent: list, candidate: list[Score], incumbent: list[Score],
                   settings: Settings, seed: int = 0) -> LabelledCheck:
    """Whether a reference-free gain is matched by the labels, on the team's labelled eval rows: each
    row's answers scored without and with its reference. A candidate that gains on the served score
    but not by the labels' measure learned to please the reward, not the team; it fails when the
    95% interval of its labelled gain lies wholly below half its reference-free gain. Fewer than
    `gate_min_rows` such rows check nothing (and say so)."""
    rows = [(fc.total - fi.total, c.total - i.total)
            for fc, fi, c, i in zip(free_candidate, free_incumbent, candidate, incumbent) if fc is not None and fi is not None]
    if len(rows) < settings.gate_min_rows:
        return LabelledCheck(checked=False, n=len(rows), matched=True,
                             reason=f"{len(rows)} team rows with a label, fewer than the {settings.gate_min_rows} the check needs")
    free = statistics.fmean(f for f, _ in rows)
    labelled, low, high = mean_interval([r for _, r in rows], seed=seed)
    matched = not (free > settings.promote_margin and high < free / 2)
    return LabelledCheck(checked=True, n=len(rows), matched=matched, reference_free_difference=round(free, 4),
                         labelled_difference=round(labelled, 4), labelled_interval=(round(low, 4), round(high, 4)),
                         reason=(f"reference-free gain {free:+.4f} on {len(rows)} team rows with a label; by their labels "
                                 f"{labelled:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}]"
                                 + ("" if matched else ": not matched (wholly below half the reference-free gain)")))


def decide(candidate: list[Score], incumbent: list[Score], rows: list[EvalRow], settings: Settings, seed: int = 0) -> GateDecision:
    n = len(rows)
    by_source = {source: sum(1 for r in rows if r.source == source) for source in SOURCES}
    diffs = [c.total - i.total for c, i in zip(candidate, incumbent)]
    mean, low, high = mean_interval(diffs, seed=seed)
    components = {}
    for name in sorted({k for s in candidate + incumbent for k in parts(s)}):
        part = [parts(c).get(name, 0.0) - parts(i).get(name, 0.0) for c, i in zip(candidate, incumbent)]
        d, lo, hi = mean_interval(part, seed=seed)
        components[name] = ComponentDifference(difference=round(d, 4), interval=(round(lo, 4), round(hi, 4)),
                                               worse=hi < -settings.component_tolerance)
    decision = GateDecision(promote=False, reason="", n=n, rows=by_source,
                            candidate_mean=round(statistics.fmean(c.total for c in candidate), 4) if n else 0.0,
                            incumbent_mean=round(statistics.fmean(i.total for i in incumbent), 4) if n else 0.0,
                            difference=round(mean, 4), interval=(round(low, 4), round(high, 4)), components=components, planned=n)
    worse = [name for name, c in components.items() if c.worse]
    if n < settings.gate_min_rows:
        decision.reason = f"{n} eval rows, fewer than the {settings.gate_min_rows} a decision needs"
    elif low <= settings.promote_margin:
        decision.reason = (f"paired difference {mean:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}] does not clear "
                           f"the margin {settings.promote_margin} (n={n})")
    elif worse:
        decision.reason = f"significantly worse: {', '.join(worse[:5])} (n={n})"
    else:
        decision.promote = True
        decision.reason = f"paired difference {mean:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}] > {settings.promote_margin} (n={n})"
    return decision


def look_ends(planned: int, look_rows: int) -> list[int]:
    """How many rows the gate has scored at each look: a block of `look_rows` at a time, the last
    look at every planned row (0, or a block as large as the sample: one look)."""
    if look_rows <= 0 or look_rows >= planned:
        return [planned]
    return [*range(look_rows, planned, look_rows), planned]


def judge(candidate: list[Score], incumbent: list[Score], rows: list[EvalRow], planned: int, settings: Settings,
          seed: int = 0) -> GateDecision | None:
    """The decision after a look at the first `len(rows)` of `planned` rows: at the last look the
    fixed-sample decision (`decide`); before it, a decision only when the outcome is already plain
    (module docstring), None to score the next block."""
    decision = decide(candidate, incumbent, rows, settings, seed)
    decision.planned = planned
    if len(rows) >= planned:
        return decision
    if decision.n < settings.gate_min_rows:
        return None
    early = f"stopped after {decision.n} of {planned} rows"
    margin = settings.promote_margin
    if decision.difference <= margin:
        decision.promote = False
        decision.reason = (f"{early}: paired difference {decision.difference:+.4f} is not above the margin {margin} "
                           f"(95% interval [{decision.interval[0]:+.4f}, {decision.interval[1]:+.4f}])")
        return decision
    drifting = [name for name, c in decision.components.items() if c.difference < -settings.component_tolerance]
    if not decision.promote or drifting:
        return None
    diffs = [c.total - i.total for c, i in zip(candidate, incumbent)]
    _, low, high = mean_interval(diffs, seed=seed, level=EARLY_WIN_LEVEL)
    if low <= margin:
        return None
    decision.reason = (f"{early}: paired difference {decision.difference:+.4f}, 99.73% interval [{low:+.4f}, {high:+.4f}] "
                       f"> {margin} (95%: [{decision.interval[0]:+.4f}, {decision.interval[1]:+.4f}])")
    return decision


async def sequential(score_block, rows: list[EvalRow], settings: Settings, seed: int) -> GateDecision:
    """Scores `rows` block by block (`score_block(rows) -> (candidate scores, incumbent scores)`)
    until `judge` decides; the decision says after how many rows and looks."""
    candidate: list[Score] = []
    incumbent: list[Score] = []
    ends = look_ends(len(rows), settings.gate_look_rows)
    for look, end in enumerate(ends, start=1):
        scored_candidate, scored_incumbent = await score_block(rows[len(candidate):end])
        candidate += scored_candidate
        incumbent += scored_incumbent
        decision = judge(candidate, incumbent, rows[:end], len(rows), settings, seed)
        if decision is not None:
            decision.looks = look
            return decision
    raise AssertionError("the last look always decides")


async def run_gate(pool: EnginePool, settings: Settings, store, task: str, candidate: str, incumbent: str | None,
                   round_seed: int) -> GateDecision:
    """The decision on a sample of the eval rows drawn with the round's seed, scored look by look
    (`sequential`); each row is answered with its own seed (the same in every round), the
    incumbent's answers read back where it gave them in an earlier round. The incumbent answers as
    it is served; the candidate with the examples, and where some row shows any, also without them
    (`serve_alone`)."""
    started = time.perf_counter()
    rows = sample_rows(eval_rows(settings, store, task), settings.gate_max_rows, round_seed)
    shown = demonstrations(settings, store, task, {row.id: row.input for row in rows})
    incumbent_shown = shown if store.shows_examples(incumbent) else {}
    decision = await judged(pool, settings, store, task, candidate, incumbent, rows, round_seed, shown, incumbent_shown)
    if settings.serve_alone and any(shown.values()):
        decision.alone = await judged(pool, settings, store, task, candidate, incumbent, rows, round_seed, {}, incumbent_shown)
        if decision.alone.promote and incumbent_shown:  # its weights too must beat the incumbent's, each alone
            weights = await judged(pool, settings, store, task, candidate, incumbent, rows, round_seed, {}, {})
            if not weights.promote:
                decision.alone.promote = False
                decision.alone.reason = (f"{decision.alone.reason}, but alone against the incumbent alone, its weights do not win: "
                                         f"{weights.reason}")
        serve_alone(decision)
    decision.seconds = round(time.perf_counter() - started, 2)
    return decision


async def judged(pool: EnginePool, settings: Settings, store, task: str, candidate: str, incumbent: str | None,
                 rows: list[EvalRow], round_seed: int, candidate_shown: dict[str, tuple], incumbent_shown: dict[str, tuple]
                 ) -> GateDecision:
    """One comparison (`sequential`), each version's prompts showing the demonstrations given, then
    the team's labels' check of a win."""
    free_candidate: list = []
    free_incumbent: list = []
    scored: dict[str, list[Score]] = {"candidate": [], "incumbent": []}

    async def score_block(block: list[EvalRow]) -> tuple[list[Score], list[Score]]:
        # both versions at once: the engine batches their requests together
        pair = await asyncio.gather(
            answer(pool, settings, task, candidate, block, settings.seed, store, free_candidate, candidate_shown),
            answer(pool, settings, task, incumbent, block, settings.seed, store, free_incumbent, incumbent_shown))
        scored["candidate"] += pair[0]
        scored["incumbent"] += pair[1]
        return pair

    decision = await sequential(score_block, rows, settings, round_seed)
    decision.labelled = labelled_check(free_candidate, free_incumbent, scored["candidate"], scored["incumbent"], settings, round_seed)
    if decision.promote and not decision.labelled.matched:
        decision.promote = False
        decision.reason = f"the served score's gain is not matched by the team's labels: {decision.labelled.reason}"
    return decision


def serve_alone(decision: GateDecision) -> None:
    """Promotes the candidate to be served without the examples where its weights alone beat the
    incumbent as served (`decision.alone`, the gate's own rule on the same rows and incumbent
    answers) by more than it does with them. A version trained on the team's labels often answers
    worse with the examples than without (module docstring); served alone, its prompts are
    shorter too."""
    alone = decision.alone
    if not alone.promote:
        if not decision.promote:
            decision.reason = f"{decision.reason}; without the examples: {alone.reason}"
        return
    if decision.promote and decision.difference >= alone.difference:
        return
    decision.promote = decision.served_alone = True
    decision.reason = (f"served without the examples: {alone.reason}; with them {decision.difference:+.4f}, "
                       f"[{decision.interval[0]:+.4f}, {decision.interval[1]:+.4f}] (n={decision.n})")


def table(task: str, decision: GateDecision, candidate: str, incumbent: str | None) -> str:
    lines = [f"| {task} | n | {candidate} | {incumbent or 'base'} | difference | 95% interval | decision |",
             "|---|---:|---:|---:|---:|---|---|",
             f"| total | {decision.n} | {decision.candidate_mean:.4f} | {decision.incumbent_mean:.4f} | {decision.difference:+.4f} | "
             f"[{decision.interval[0]:+.4f}, {decision.interval[1]:+.4f}] | "
             f"{'not chosen' if decision.served_alone else 'promote' if decision.promote else 'reject'} |"]
    for name, c in decision.components.items():
        lines.append(f"| {name} | | | | {c.difference:+.4f} | [{c.interval[0]:+.4f}, {c.interval[1]:+.4f}] | "
                     f"{'worse' if c.worse else ''} |")
    alone = decision.alone
    if alone is not None:
        lines.append(f"| candidate without the examples | {alone.n} | {alone.candidate_mean:.4f} | {alone.incumbent_mean:.4f} | "
                     f"{alone.difference:+.4f} | [{alone.interval[0]:+.4f}, {alone.interval[1]:+.4f}] | "
                     f"{'promote, served alone' if decision.served_alone else 'wins, by less' if alone.promote else 'reject'} |")
    return "\n".join(lines)
