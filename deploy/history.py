"""The tables people read: past rounds (`tucano rounds`) and adapter versions (`tucano adapters
list`), with dates a person can read and each gate decision with its interval."""
from __future__ import annotations

import time

from rich.table import Table

from common.records import AdapterMeta


def when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch)) if epoch else "-"


def _interval(decision: dict) -> str:
    if not decision:
        return "-"
    low, high = decision.get("interval", [0, 0])
    return f"{decision.get('difference', 0):+.3f} [{low:+.3f}, {high:+.3f}] n={decision.get('n', 0)}"


def rounds_table(rounds: list[dict]) -> Table:
    table = Table("round", "started", "task", "methods", "examples", "gate: difference [95%] n", "outcome", "flags", "s")
    for summary in rounds:
        for task, entry in summary.get("tasks", {}).items():
            data = entry.get("data", {})
            examples = f"sft {data.get('sft', 0)} pairs {data.get('pairs', 0)} kto {data.get('kto', 0)} prompts {data.get('prompts', 0)}"
            flags = [name for name, flag in (entry.get("stop_conditions") or {}).items() if flag.get("flagged")]
            table.add_row(summary["round"], when(summary.get("started")), task, entry.get("method") or "-", examples,
                          _interval(entry.get("decision") or {}), entry.get("status", "-"), ", ".join(flags) or "-",
                          str(summary.get("seconds", "-")))
    return table


def adapters_table(metas: list[AdapterMeta]) -> Table:
    table = Table("version", "task", "status", "method", "parent", "gate: difference [95%] n", "canary", "created", "changed")
    for meta in metas:
        decision = meta.gate.get("decision") or {}
        changed = meta.history[-1]["at"] if meta.history else None
        table.add_row(meta.version, meta.task, meta.status, meta.method or "-", meta.parent or "-", _interval(decision),
                      meta.canary.get("verdict", meta.canary.get("outcome", "-")) if meta.canary else "-",
                      when(meta.created), when(changed))
    return table
