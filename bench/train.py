"""`tucano bench train`: the cost of a real training round, per task and phase.

It reads a finished round's summary (the latest with a trained task, or the one named) from
`<data dir>/rounds/` rather than running a synthetic one: rounds train on recorded traffic, and
the figures that matter are those of the rounds the service actually ran.
"""
from __future__ import annotations

from pathlib import Path

from common.rounds import RoundSummary, decode_round

PHASES = ("training", "load", "gate", "shadow", "flip")


def find_round(rounds_dir: Path, round_id: str | None) -> RoundSummary:
    if round_id:
        path = rounds_dir / f"{round_id}.json"
        if not path.is_file():
            raise LookupError(f"no round {round_id!r} in {rounds_dir}")
        return decode_round(path.read_bytes())
    for path in sorted(rounds_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        summary = decode_round(path.read_bytes())
        if any(entry.training for entry in summary.tasks.values()):
            return summary
    raise LookupError(f"no round in {rounds_dir} trained a task yet: run `tucano train --once` after some traffic")


def results(summary: RoundSummary, model_parameters: int | None) -> dict:
    tasks = {}
    for task, entry in summary.tasks.items():
        if not entry.training:
            continue
        methods = {m.method: {"steps": m.steps, "epochs": m.epochs, "seconds": m.seconds, "stopped_by": m.stopped_by,
                              **({"phases": m.phases} if m.phases else {})} for m in entry.training}
        tasks[task] = {"methods": methods, "seconds": {p: entry.seconds.get(p, 0.0) for p in PHASES},
                       "outcome": str(entry.outcome), "gate_rows": entry.gate.decision.n if entry.gate else None,
                       "peak_rss_gb": entry.peak_rss_gb}
    return {"round": summary.round, "round_seconds": summary.seconds, "model_parameters": model_parameters, "tasks": tasks}


def table(result: dict) -> str:
    lines = ["| task | methods (steps, stopped by) | " + " | ".join(f"{p} s" for p in PHASES) + " | gate rows | outcome | peak GB |",
             "|---|---|" + "---:|" * len(PHASES) + "---:|---|---:|"]
    for task, row in result["tasks"].items():
        methods = ", ".join(f"{name} ({m['steps']}, {m['stopped_by']})" for name, m in row["methods"].items())
        lines.append(f"| {task} | {methods} | " + " | ".join(str(row["seconds"][p]) for p in PHASES)
                     + f" | {row['gate_rows'] or '-'} | {row['outcome']} | {row.get('peak_rss_gb') or '-'} |")
    size = f"; base model {result['model_parameters']:,} parameters" if result["model_parameters"] else ""
    lines.append(f"\nround {result['round']}, {result['round_seconds']} s in all{size}.")
    return "\n".join(lines)
