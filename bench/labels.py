"""`tucano bench labels`: do the answers the review queue ranks first teach more per label than
answers chosen at random? Side by side, in one run, on the same traffic.

`tucano bench learn --label-choice queue|random` answers this with two separate runs, each a
whole round: its figure moves with how many SFT steps each run's time budget bought and with
whether a gate near its margin promoted the version (random labels' own gain on push went
+0.589, +0.591, +0.000, +0.600 over four runs). Here one run holds both choices, so only the
choice of labels differs:

1. the team (`learn.Team`) sends `requests` train-split requests per task to the real stack
   (vLLM engines, the gateway, an embedded Valkey, throwaway) and labels none of them;
2. `labels` of the answers are chosen by the review queue (`GET /v1/review/{task}`: the answers
   a label would help most first, spread over the inputs), and `labels` more by each of `draws`
   random draws;
3. for each choice, a fresh LoRA on the base model is trained by SFT on the chosen inputs'
   references, with one round's budget of the task (what a round trains on the team's
   corrections), and measured on the held-out test rows (never sent, never in the bootstrap),
   scored with references, with a fixed seed per row.

Gains are paired by row against the base model, and the queue's arm against each random draw;
the gain per label is the gain over the labels given, and its ratio to random's is what the
review queue's target (1.5 times) is about. The arms train one after another on the same
machine; each reports its SFT steps, since a time budget buys fewer steps on longer references;
`--epochs` gives every arm the same epochs (so the same steps) instead, over all its labels: no
validation slice is held out, so no arm's early stopping ends it sooner than another's (with 15
labels it had ended arms of one run after 8, 10 and 12 steps).
`--trainings T` trains each arm T times, from consecutive seeds, and averages each held-out row's
reward over them: with a few labels, one training's seed moved an arm's gain as much as its labels
did (two arms on the same three SQL queries gained +0.169 and +0.324).
There is no gate and no examples in the prompts here: what is measured is what the labels teach.
"""
from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench import learn
from common.settings import Settings
from rewards import Score
from tasks import training_settings

QUEUE = "queue"
UNBOUNDED_S = 86_400.0  # `--epochs`: the arms' steps are set by their epochs, not by a clock


def random_arm(draw: int) -> str:
    return f"random-{draw}"


def choose(queue_order: list[int], answers: int, labels: int, draws: int, seed: int) -> dict[str, list[int]]:
    """Each arm's chosen answers (indices into the traffic): the queue's first `labels`, and
    `labels` drawn at random (without replacement) `draws` times, each draw from its own seed."""
    chosen = {QUEUE: queue_order[:labels]}
    for draw in range(1, draws + 1):
        chosen[random_arm(draw)] = sorted(random.Random(seed + draw).sample(range(answers), labels))
    return chosen


def arm_training(settings: Settings, task: str, epochs: float | None) -> Settings:
    """The settings every arm of `task` trains with: the round's (its time budget), or, with
    `epochs`, that many epochs over the arm's labels and no time budget, so that every arm takes
    the same steps whatever its references' lengths (a time budget buys fewer steps on longer ones);
    `run` then holds out no validation slice either (`learn.sft_data`)."""
    own = training_settings(settings, task)
    if epochs is None:
        return own
    return own.model_copy(update={"sft_max_epochs": epochs, "sft_min_steps": 1, "train_time_budget_s": UNBOUNDED_S})


def run(settings: Settings, requests: int, labels: int, draws: int, measure_rows: int, tasks: tuple[str, ...], say=print,
        epochs: float | None = None, trainings: int = 1) -> dict:
    """The run's results: per task, the traffic, the base model's held-out reward and each arm's."""
    results: dict = {"settings": {"requests": requests, "labels": labels, "draws": draws, "seed": settings.seed, "epochs": epochs,
                                  "trainings": trainings}, "tasks": {}}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-labels-")))
        bench, store, fleet, gateway_url = learn.start_stack(settings, scratch, stack, say)
        team = learn.Team(bench, gateway_url, tasks, measure_rows, settings.seed)
        results["settings"]["measure_rows"] = {t: len(team.held_out[t]) for t in tasks}
        results["settings"]["train_time_budget_s"] = {t: arm_training(bench, t, epochs).train_time_budget_s for t in tasks}
        for task in tasks:
            traffic = asyncio.run(team.play(task, requests, 0.0, 0.0))
            rows = [row for row, _ in team.last[task]]
            answers = [answer for _, answer in team.last[task]]
            ranks = asyncio.run(_review_ranks(team, task))
            order = learn.in_queue_order(ranks, answers, list(range(len(answers))))
            listed = sum(answer["id"] in ranks for answer in answers)
            base = asyncio.run(learn.served_scores(bench, fleet, task, None, team.held_out[task]))
            entry = {"traffic": traffic, "queue_listed": listed, "held_out": [row["id"] for row in team.held_out[task]],
                     "base": {**learn.measured(base), "totals": row_totals(base)}, "arms": {}, "queue_minus": {}}
            say(f"{task}: the base model {entry['base']['mean']}; the review queue lists {listed} of the {len(answers)} answers")
            totals: dict[str, list[float]] = {}
            training = arm_training(bench, task, epochs)
            for arm, picked in choose(order, len(rows), labels, draws, settings.seed).items():
                chosen_rows = [rows[i] for i in picked]
                each = []
                for k in range(trainings):
                    trained, scores = learn.sft_from_base(training, store, fleet, team, task, chosen_rows, f"labels chosen by {arm}",
                                                          base, validation=epochs is None, training_seed=settings.seed + k)
                    learn.set_aside(store, fleet, trained["version"], task, "bench labels: one arm of a side-by-side comparison, never gated")
                    each.append({**trained, "training_seed": settings.seed + k, "totals": row_totals(scores)})
                    if trainings > 1:
                        say(f"{task} {arm}, training {k + 1} of {trainings}: {trained['mean']} (gain {trained['gain']['mean']:+.3f})")
                totals[arm] = mean_totals([t["totals"] for t in each])
                arm_entry = {**learn.interval(totals[arm]), "gain": learn.interval([a - b for a, b in zip(totals[arm], entry["base"]["totals"])]),
                             "labels": len(chosen_rows), "distinct_inputs": len({row["id"] for row in chosen_rows}),
                             "chosen": [row["id"] for row in chosen_rows],
                             "served_score_of_the_chosen": round(statistics.fmean(answers[i]["scores"]["total"] for i in picked), 4),
                             "training": each[0]["training"], "totals": totals[arm], "trainings": each}
                entry["arms"][arm] = arm_entry
                say(f"{task} {arm}: {arm_entry['mean']} (gain {arm_entry['gain']['mean']:+.3f})")
            for arm in entry["arms"]:
                if arm != QUEUE:
                    entry["queue_minus"][arm] = learn.interval([q - a for q, a in zip(totals[QUEUE], totals[arm])])
            results["tasks"][task] = entry
    return results


def mean_totals(trainings: list[list[float]]) -> list[float]:
    """Each held-out row's reward, averaged over the trainings of one arm's labels: what the labels
    teach, less the luck of one training's seed (a few labels' SFT lands differently from one seed
    to the next, and a comparison of single trainings reads that as a difference between labels)."""
    return [round(statistics.fmean(row), 4) for row in zip(*trainings, strict=True)]


def row_totals(scores: list[Score]) -> list[float]:
    """Each held-out row's reward, in the order of `held_out`: whether an arm's mean is many
    answers a little better or some answers whole where they had been nothing is read from these."""
    return [round(score.total, 4) for score in scores]


async def _review_ranks(team: learn.Team, task: str) -> dict[str, int]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await team.review_ranks(client, task)


def ratio(results: dict, task: str) -> float | None:
    """The queue's gain per label over the random draws' mean gain per label; None where random gained nothing on average."""
    arms = results["tasks"][task]["arms"]
    random_gains = [a["gain"]["mean"] for name, a in arms.items() if name != QUEUE]
    mean_random = statistics.fmean(random_gains)
    return round(arms[QUEUE]["gain"]["mean"] / mean_random, 2) if mean_random > 0 else None


def table(results: dict) -> str:
    lines = ["| task | labels chosen by | labels (distinct inputs) | their served score | SFT steps (epochs) | held-out reward [95%] "
             "| gain over the base model [95%] | labels per +0.01 | queue minus this arm [95%] |",
             "|---|---|---:|---:|---:|---|---|---:|---|"]
    for task, entry in results["tasks"].items():
        b = entry["base"]
        lines.append(f"| {task} | (the base model) | | | | {b['mean']:.3f} [{b['ci95'][0]:.3f}, {b['ci95'][1]:.3f}] | | | |")
        for arm, a in entry["arms"].items():
            g = a["gain"]
            steps = " + ".join(f"{m['steps']} ({m['epochs']:g})" for m in a["training"])
            cost = f"{learn.labels_per_point(a['labels'], g['mean']):.1f}" if g["mean"] > 0 else "no gain"
            minus = entry["queue_minus"].get(arm)
            against = f"{minus['mean']:+.3f} [{minus['ci95'][0]:+.3f}, {minus['ci95'][1]:+.3f}]" if minus else ""
            lines.append(f"| {task} | {arm} | {a['labels']} ({a['distinct_inputs']}) | {a['served_score_of_the_chosen']:.3f} | {steps} | "
                         f"{a['mean']:.3f} [{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}] | {g['mean']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] "
                         f"| {cost} | {against} |")
    lines.append("")
    for task in results["tasks"]:
        r = ratio(results, task)
        lines.append(f"- {task}: the queue's gain per label is "
                     + (f"{r:.2f} times the random draws' mean" if r is not None else "not comparable: random labels gained nothing on average"))
    s = results["settings"]
    training = (f"{s['epochs']:g} epochs over all its labels (no validation slice), no time budget" if s.get("epochs")
                else f"within one round's budget ({s['train_time_budget_s']} s)")
    trainings = s.get("trainings", 1)
    trained = (f"trained {trainings} times (training seeds {s['seed']} to {s['seed'] + trainings - 1}), each row's reward the "
               "mean over the trainings" if trainings > 1 else "trained once")
    lines.append(f"\n{s['requests']} requests per task, {s['labels']} labels per arm, {s['draws']} random draws; each arm SFT from the "
                 f"base model, {training}, {trained}; held-out test rows ({s['measure_rows']}), "
                 "fixed seed per row, 95% intervals by bootstrap over rows, paired.")
    return "\n".join(lines)
