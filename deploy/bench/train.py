"""`tucano bench train`: the cost of a real training round, per task and phase.

It reads a finished round's summary (the latest with a trained task, or the one named) from
`<data dir>/rounds/` rather than running a synthetic one: rounds train on recorded traffic, and
the figures that matter are those of the rounds the service actually ran.
"""
from __future__ import annotations

import json
from pathlib import Path

PHASES = ("generation", "scoring", "optimisation", "evaluation", "promotion")


def find_round(rounds_dir: Path, round_id: str | None) -> dict:
    if round_id:
        path = rounds_dir / f"{round_id}.json"
        if not path.is_file():
            raise LookupError(f"no round {round_id!r} in {rounds_dir}")
        return json.loads(path.read_text())
    for path in sorted(rounds_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        summary = json.loads(path.read_text())
        if any("training" in entry for entry in summary.get("tasks", {}).values()):
            return summary
    raise LookupError(f"no round in {rounds_dir} trained a task yet: run `tucano train --once` after some traffic")


def results(summary: dict, model_parameters: int | None) -> dict:
    tasks = {}
    for task, entry in summary["tasks"].items():
        if "training" not in entry:
            continue
        training, gate = entry["training"], entry.get("seconds", {})
        seconds = {"generation": training["seconds"]["generation"], "scoring": training["seconds"]["scoring"],
                   "optimisation": training["seconds"]["optimisation"], "evaluation": gate.get("evaluation", 0.0),
                   "promotion": gate.get("promotion", 0.0) + gate.get("load", 0.0)}
        generation = training["seconds"]["generation"]
        tasks[task] = {"method": entry["method"], "steps": training["steps"], "seconds": seconds,
                       "completion_tokens": training["completion_tokens"],
                       "generation_tokens_per_s": round(training["completion_tokens"] / generation, 1) if generation else None,
                       "status": entry["status"]}
    return {"round": summary["round"], "round_seconds": summary.get("seconds"), "model_parameters": model_parameters,
            "tasks": tasks}


def table(result: dict) -> str:
    lines = ["| task | method | steps | " + " | ".join(f"{p} s" for p in PHASES) + " | completion tokens | gen tokens/s | outcome |",
             "|---|---|---:|" + "---:|" * len(PHASES) + "---:|---:|---|"]
    for task, row in result["tasks"].items():
        lines.append(f"| {task} | {row['method']} | {row['steps']} | " + " | ".join(str(row["seconds"][p]) for p in PHASES)
                     + f" | {row['completion_tokens']} | {row['generation_tokens_per_s'] or '-'} | {row['status']} |")
    lines.append(f"\nround {result['round']}, {result['round_seconds']} s in all; base model "
                 f"{result['model_parameters']:,} parameters." if result["model_parameters"]
                 else f"\nround {result['round']}, {result['round_seconds']} s in all.")
    return "\n".join(lines)
