"""`tucano bench calibration`: how far the served (reference-free) score can be trusted. For each
task, the served score of labelled answers against the reference score of the same answers (rank
correlation, with a 95% bootstrap interval) and against the team's verdicts (how often a liked
answer is served a higher score than a corrected one), and the mean served score beside the
mean reference score. Two sources, side by side in one run:
- `answers`: a JSONL file of answers with their references (what `tucano bench trivial
  --save-answers` writes: the demo model's own answers to held-out rows);
- `team`: the labels the team's traffic holds in Redis (references sent with requests,
  corrections, ratings), per adapter version that served them.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from common.settings import Settings
from common.stats import rank_correlation_interval
from rewards.calibration import Pair, calibrate, pairs_of
from tasks import TASKS, score, typed_input


def _interval(pairs: list[Pair]) -> list[float] | None:
    served = [p.served for p in pairs if p.reference is not None]
    reference = [p.reference for p in pairs if p.reference is not None]
    if len(served) < 10 or len(set(served)) < 2 or len(set(reference)) < 2:
        return None
    _, low, high = rank_correlation_interval(served, reference)
    return [round(low, 4), round(high, 4)] if low == low else None


def summary(pairs: list[Pair]) -> dict:
    measured = calibrate(pairs).as_dict()
    with_reference = [p for p in pairs if p.reference is not None]
    return {**measured, "rank_correlation_ci95": _interval(pairs),
            "served_mean": round(statistics.fmean(p.served for p in pairs), 4) if pairs else None,
            "reference_mean": round(statistics.fmean(p.reference for p in with_reference), 4) if with_reference else None}


def answer_pairs(settings: Settings, path: Path) -> dict[str, list[Pair]]:
    by_task: dict[str, list[Pair]] = defaultdict(list)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        context = settings.reward_context(typed_input(row["task"], row["input"]))
        reference = row.get("reference")
        by_task[row["task"]].append(Pair(score(row["task"], row["completion"], None, context).total,
                                         score(row["task"], row["completion"], reference, context).total if reference else None,
                                         None))
    return by_task


def team_pairs(settings: Settings, store) -> dict[str, dict[str, list[Pair]]]:
    """task -> served version -> pairs, from every label of the task."""
    by_task: dict[str, dict[str, list[Pair]]] = {}
    for task in TASKS:
        by_version: dict[str, list[Pair]] = defaultdict(list)
        def scored(completion: str, reference, task_input: dict, task: str = task) -> float:
            return score(task, completion, reference, settings.reward_context(typed_input(task, task_input))).total

        for label in store.labels(task):
            for pair in pairs_of([label], scored):
                by_version[label.served_version].append(pair)
        by_task[task] = by_version
    return by_task


def run(settings: Settings, answers: Path | None, store) -> dict:
    results: dict = {"answers": {}, "team": {}}
    if answers is not None:
        results["answers"] = {task: summary(pairs) for task, pairs in answer_pairs(settings, answers).items()}
        results["answers_file"] = str(answers)
    if store is not None:
        for task, by_version in team_pairs(settings, store).items():
            every = [p for pairs in by_version.values() for p in pairs]
            results["team"][task] = {**summary(every), "versions": {v: summary(p) for v, p in sorted(by_version.items())}}
    return results


def _cell(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: dict) -> str:
    lines = ["| source | task | version | n | rank correlation [95%] | liked / corrected | separation | served mean | reference mean | weak |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---|"]

    def row(source: str, task: str, version: str, s: dict) -> None:
        ci = s["rank_correlation_ci95"]
        rho = _cell(s["rank_correlation"]) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        lines.append(f"| {source} | {task} | {version} | {s['n']} | {rho} | {s['liked']} / {s['corrected']} | "
                     f"{_cell(s['separation'])} | {_cell(s['served_mean'])} | {_cell(s['reference_mean'])} | "
                     f"{'-' if s['weak'] is None else ('yes' if s['weak'] else 'no')} |")

    for task, s in results["answers"].items():
        row("answers", task, "all", s)
    for task, s in results["team"].items():
        row("team", task, "all", s)
        for version, v in s["versions"].items():
            row("team", task, version, v)
    return "\n".join(lines)
