"""The tables people read: past rounds (`tucano rounds`) and adapter versions (`tucano adapters
list`), with dates a person can read and each gate decision with its interval."""
from __future__ import annotations

import time

from rich.table import Table

from common.records import AdapterMeta
from common.rounds import GateDecision, RoundSummary, TrainingData


def when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch)) if epoch else "-"


def _interval(decision: GateDecision | None) -> str:
    """The comparison that decided, with its interval (`GateDecision.deciding`)."""
    if decision is None:
        return "-"
    deciding = decision.deciding()
    low, high = deciding.interval
    return f"{deciding.difference:+.3f} [{low:+.3f}, {high:+.3f}] n={deciding.n}" + (", served alone" if decision.served_alone else "")


def rounds_table(rounds: list[RoundSummary]) -> Table:
    table = Table("round", "started", "task", "methods", "examples", "gate: difference [95%] n", "outcome", "flags", "s")
    for summary in rounds:
        for task, entry in summary.tasks.items():
            data = entry.data or TrainingData()
            examples = f"sft {data.sft} pairs {data.pairs} kto {data.kto} prompts {data.prompts}"
            flags = [name for name, flag in entry.stop_conditions.items() if flag.flagged]
            table.add_row(summary.round, when(summary.started), task, entry.method or "-", examples,
                          _interval(entry.gate.decision if entry.gate else None), str(entry.outcome), ", ".join(flags) or "-", str(summary.seconds))
    return table


def adapters_table(metas: list[AdapterMeta]) -> Table:
    table = Table("version", "task", "status", "method", "parent", "gate: difference [95%] n", "canary", "created", "changed")
    for meta in metas:
        changed = meta.history[-1].at if meta.history else None
        canary = (meta.canary.outcome or meta.canary.verdict or "-") if meta.canary else "-"
        table.add_row(meta.version, meta.task, meta.status, meta.method or "-", meta.parent or "-",
                      _interval(meta.gate.decision if meta.gate else None), canary, when(meta.created), when(changed))
    return table
